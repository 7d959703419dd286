"""The typed value of every metadata key: one import for all of them.

Each resource is a frozen dataclass with `from_json(bytes, key=...) -> Self` and `to_json() -> bytes`, using
exactly the field names and JSON types of docs/METADATA.md#key-layout (see resources_base for the rules).
Which key holds what:

| key (danube_fast.meta.keys)                  | resource                              |
|----------------------------------------------|---------------------------------------|
| cluster_name, broker_topic, namespace_topic  | Marker (JSON null)                    |
| broker_register                              | BrokerRegistration                    |
| broker_state                                 | BrokerState                           |
| unassigned                                   | Unassigned (null, or {reason, ...})   |
| load_report                                  | LoadReport (of SystemLoad)            |
| load_balance                                 | LoadBalanceDecision                   |
| leader                                       | ClusterLeader                         |
| replicas                                     | TopicReplicas                         |
| namespace_policy, topic_policy               | Policy                                |
| topic_root                                   | TopicRoot                             |
| topic_delivery                               | TopicDelivery                         |
| topic_schema                                 | TopicSchemaConfig                     |
| topic_producer                               | Producer                              |
| topic_subscription                           | SubscriptionRecord                    |
| subscription_cursor                          | SubscriptionCursor                    |
| subscription_delayed                         | SubscriptionDelayed                   |
| schema_next_id                               | NextSchemaId                          |
| schema_metadata                              | SchemaMetadata (of SchemaVersion)     |
| schema_version                               | SchemaVersion                         |
| schema_by_id                                 | SchemaIndexEntry                      |
| object_descriptor                            | ObjectDescriptor                      |
| objects_cur                                  | CurrentObject                         |
| sealed_state                                 | SealedState                           |
| retention_state                              | RetentionState                        |
| replaced_log                                 | ReplacedLog                           |
| term_successors                              | TermSuccessors                        |
| tables_catalog                               | TableCatalog                          |
| table_pointer                                | TablePointer                          |
| security_revoked_token                       | RevokedToken                          |
| security_revoked_subject                     | RevokedSubject                        |

Roles and bindings (`security_role`, `security_binding`) have no resource here: security/rbac.py writes
and reads their small JSON.
The legacy `/subscriptions/{subscription}/{consumer_id}` value has no documented shape (upstream shows
none) and nothing here writes it, so it has no resource.
"""

from danube_fast.meta.resources_base import JSON, NULL, JSONObject, Resource
from danube_fast.meta.resources_cluster import (
    UNLOAD,
    BrokerMode,
    BrokerRegistration,
    BrokerState,
    ClusterLeader,
    LoadBalanceDecision,
    LoadReport,
    Marker,
    ResourceKind,
    SystemLoad,
    TopicReplicas,
    Unassigned,
)
from danube_fast.meta.resources_schema import (
    CompatibilityMode,
    NextSchemaId,
    SchemaDefinition,
    SchemaIndexEntry,
    SchemaKind,
    SchemaMetadata,
    SchemaVersion,
)
from danube_fast.meta.resources_security import RevokedSubject, RevokedToken
from danube_fast.meta.resources_storage import (
    CurrentObject,
    ObjectDescriptor,
    ReplacedLog,
    RetentionState,
    SealedState,
    TableCatalog,
    TablePointer,
    TermSuccessors,
)
from danube_fast.meta.resources_topics import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DeliveryMode,
    Policy,
    Producer,
    ProducerAccessMode,
    SubscriptionCursor,
    SubscriptionDelayed,
    SubscriptionRecord,
    SubscriptionType,
    TopicDelivery,
    TopicRoot,
    TopicSchemaConfig,
    ValidationPolicy,
)
from danube_fast.meta.store import BadValue

__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE",
    "JSON",
    "NULL",
    "UNLOAD",
    "BadValue",
    "BrokerMode",
    "BrokerRegistration",
    "BrokerState",
    "ClusterLeader",
    "CompatibilityMode",
    "CurrentObject",
    "DeliveryMode",
    "JSONObject",
    "LoadBalanceDecision",
    "LoadReport",
    "Marker",
    "NextSchemaId",
    "ObjectDescriptor",
    "Policy",
    "Producer",
    "ProducerAccessMode",
    "ReplacedLog",
    "Resource",
    "ResourceKind",
    "RetentionState",
    "RevokedSubject",
    "RevokedToken",
    "SchemaDefinition",
    "SchemaIndexEntry",
    "SchemaKind",
    "SchemaMetadata",
    "SchemaVersion",
    "SealedState",
    "SubscriptionCursor",
    "SubscriptionDelayed",
    "SubscriptionRecord",
    "SubscriptionType",
    "SystemLoad",
    "TableCatalog",
    "TablePointer",
    "TermSuccessors",
    "TopicDelivery",
    "TopicReplicas",
    "TopicRoot",
    "TopicSchemaConfig",
    "Unassigned",
    "ValidationPolicy",
]

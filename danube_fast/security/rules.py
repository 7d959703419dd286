"""What each RPC of both ports needs: a permission at a scope taken from its (first) request. A method with no
rule here is refused to everyone but privileged principals (deny by default), and
tests/security/test_security_units.py checks that every served method has one and every rule a method. The
table is docs/SECURITY.md's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from danube_fast.meta import keys
from danube_fast.meta.store import InvalidKey
from danube_fast.security.rbac import CLUSTER, Permission

# The topic a Danube consumer id belongs to (ReceiveMessages carries only the id); None if unknown.
ConsumerTopic = Callable[[int], str | None]
Scope = Callable[[Any, ConsumerTopic], str | None]


@dataclass(frozen=True)
class Rule:
    permission: Permission | None  # None: any authenticated principal (HealthCheck)
    scope: Scope


def topic_scope(name: str) -> str:
    """`/ns/topic` as a scope; anything that is not a valid topic name only matches cluster-wide grants."""
    try:
        namespace, topic = keys.split_topic_name(name)
        keys.topic_name(namespace, topic)
    except InvalidKey:
        return CLUSTER
    return f"/{namespace}/{topic}"


def namespace_scope(name: str) -> str:
    try:
        keys.namespace_policy(name)
    except InvalidKey:
        return CLUSTER
    return f"/{name}"


def _cluster(_request: Any, _resolve: ConsumerTopic) -> str:
    return CLUSTER


def _field(*path: str, kind: Callable[[str], str] = topic_scope) -> Scope:
    def scope(request: Any, _resolve: ConsumerTopic) -> str:
        value = request
        for name in path:
            value = getattr(value, name)
        return kind(value)
    return scope


def _consumer(request: Any, resolve: ConsumerTopic) -> str | None:
    """ReceiveMessages: the consumer's topic; None for an id this broker does not know (the service then
    answers NOT_FOUND, which makes the official client subscribe again, and Subscribe is checked)."""
    topic = resolve(request.consumer_id)
    return None if topic is None else topic_scope(topic)


def _first_of_stream(field: str, topic: str) -> Scope:
    """The fast API's streams: the topic of their first message (Open / Subscribe); later messages carry
    none and stay on that topic."""
    def scope(request: Any, _resolve: ConsumerTopic) -> str:
        if request.WhichOneof("kind") != field:
            return CLUSTER  # the service refuses a stream that does not start with it
        return topic_scope(getattr(getattr(request, field), topic))
    return scope


L, P, C = Permission.LOOKUP, Permission.PRODUCE, Permission.CONSUME
NS, TOPIC, SCHEMA = Permission.MANAGE_NAMESPACE, Permission.MANAGE_TOPIC, Permission.MANAGE_SCHEMA
BROKER, CLUSTER_ADMIN = Permission.MANAGE_BROKER, Permission.MANAGE_CLUSTER

RULES: dict[str, Rule] = {
    # The client port: Danube's API
    "danube.ProducerService/CreateProducer": Rule(P, _field("topic_name")),
    "danube.ProducerService/SendMessage": Rule(P, _field("msg_id", "topic_name")),
    "danube.ConsumerService/Subscribe": Rule(C, _field("topic_name")),
    "danube.ConsumerService/ReceiveMessages": Rule(C, _consumer),
    "danube.ConsumerService/Ack": Rule(C, _field("msg_id", "topic_name")),
    "danube.ConsumerService/Nack": Rule(C, _field("msg_id", "topic_name")),
    "danube.Discovery/TopicLookup": Rule(L, _field("topic")),
    "danube.Discovery/TopicPartitions": Rule(L, _field("topic")),
    "danube.HealthCheck/HealthCheck": Rule(None, _cluster),
    # The client port: our fast API
    "danube_fast.v1.FastProducer/Produce": Rule(P, _first_of_stream("open", "topic")),
    "danube_fast.v1.FastConsumer/Consume": Rule(C, _first_of_stream("subscribe", "topic")),
    "danube_fast.v1.FastReader/Offsets": Rule(C, _field("topic")),
    "danube_fast.v1.FastReader/Read": Rule(C, _field("topic")),
    "danube_fast.v1.FastTransports/Native": Rule(None, _cluster),
    # Both ports: the schema registry (subjects are cluster-wide; a topic's schema settings are the topic's)
    "danube_schema.SchemaRegistry/RegisterSchema": Rule(SCHEMA, _cluster),
    "danube_schema.SchemaRegistry/GetSchema": Rule(L, _cluster),
    "danube_schema.SchemaRegistry/GetLatestSchema": Rule(L, _cluster),
    "danube_schema.SchemaRegistry/ListVersions": Rule(L, _cluster),
    "danube_schema.SchemaRegistry/CheckCompatibility": Rule(L, _cluster),
    "danube_schema.SchemaRegistry/DeleteSchemaVersion": Rule(SCHEMA, _cluster),
    "danube_schema.SchemaRegistry/SetCompatibilityMode": Rule(SCHEMA, _cluster),
    "danube_schema.SchemaRegistry/ConfigureTopicSchema": Rule(SCHEMA, _field("topic_name")),
    "danube_schema.SchemaRegistry/UpdateTopicValidationPolicy": Rule(SCHEMA, _field("topic_name")),
    "danube_schema.SchemaRegistry/GetTopicSchemaConfig": Rule(L, _field("topic_name")),
    # The admin port
    "danube_admin.BrokerAdmin/ListBrokers": Rule(L, _cluster),
    "danube_admin.BrokerAdmin/GetLeaderBroker": Rule(L, _cluster),
    "danube_admin.BrokerAdmin/ListNamespaces": Rule(L, _cluster),
    "danube_admin.BrokerAdmin/GetClusterBalance": Rule(L, _cluster),
    "danube_admin.BrokerAdmin/UnloadBroker": Rule(BROKER, _cluster),
    "danube_admin.BrokerAdmin/ActivateBroker": Rule(BROKER, _cluster),
    "danube_admin.BrokerAdmin/TriggerRebalance": Rule(CLUSTER_ADMIN, _cluster),
    "danube_admin.NamespaceAdmin/GetNamespaceTopics": Rule(L, _field("name", kind=namespace_scope)),
    "danube_admin.NamespaceAdmin/GetNamespacePolicies": Rule(L, _field("name", kind=namespace_scope)),
    "danube_admin.NamespaceAdmin/CreateNamespace": Rule(NS, _field("name", kind=namespace_scope)),
    "danube_admin.NamespaceAdmin/DeleteNamespace": Rule(NS, _field("name", kind=namespace_scope)),
    "danube_admin.TopicAdmin/ListNamespaceTopics": Rule(L, _field("name", kind=namespace_scope)),
    "danube_admin.TopicAdmin/ListBrokerTopics": Rule(L, _cluster),
    "danube_admin.TopicAdmin/CreateTopic": Rule(TOPIC, _field("name")),
    "danube_admin.TopicAdmin/CreatePartitionedTopic": Rule(TOPIC, _field("base_name")),
    "danube_admin.TopicAdmin/DeleteTopic": Rule(TOPIC, _field("name")),
    "danube_admin.TopicAdmin/UnloadTopic": Rule(TOPIC, _field("name")),
    "danube_admin.TopicAdmin/ListSubscriptions": Rule(L, _field("name")),
    "danube_admin.TopicAdmin/Unsubscribe": Rule(C, _field("topic")),
    "danube_admin.TopicAdmin/DescribeTopic": Rule(L, _field("name")),
    # The admin port: ours
    **{f"danube_fast.security.v1.SecurityAdmin/{m}": Rule(CLUSTER_ADMIN, _cluster)
       for m in ("PutRole", "GetRole", "ListRoles", "DeleteRole", "Bind", "Unbind", "ListBindings",
                 "RevokeToken", "RevokeSubject", "ListRevocations", "Unrevoke")},
    "danube_fast.policy.v1.PolicyAdmin/SetNamespacePolicy": Rule(NS, _field("namespace",
                                                                            kind=namespace_scope)),
    "danube_fast.policy.v1.PolicyAdmin/GetTopicPolicy": Rule(L, _field("topic")),
    "danube_fast.policy.v1.PolicyAdmin/SetTopicPolicy": Rule(TOPIC, _field("topic")),
    "danube_fast.policy.v1.PolicyAdmin/ClearTopicPolicy": Rule(TOPIC, _field("topic")),
    "danube_fast.tables.v1.TableAdmin/Status": Rule(L, _field("topic")),
    "danube_fast.tables.v1.TableAdmin/Snapshots": Rule(L, _field("topic")),
    "danube_fast.stats.v1.BrokerStats/Figures": Rule(L, _cluster),
    # Brokers copying a replicated topic from its owner (docs/REPLICATION.md): broker_principals hold it.
    "danube_fast.replication.v1.Replication/Fetch": Rule(CLUSTER_ADMIN, _cluster),
    "danube_fast.replication.v1.Replication/Copies": Rule(L, _field("topic")),
    # Moving a subscription, looking at what it would receive, or reading the topic's records without one
    # (Browse) is what a consumer may do.
    **{f"danube_fast.subscriptions.v1.SubscriptionAdmin/{m}": Rule(C, _field("topic"))
       for m in ("Seek", "Skip", "Peek", "Create", "Browse")},
    "danube_fast.subscriptions.v1.SubscriptionAdmin/Describe": Rule(L, _field("topic")),
    "danube_fast.subscriptions.v1.SubscriptionAdmin/List": Rule(L, _field("topic")),
}

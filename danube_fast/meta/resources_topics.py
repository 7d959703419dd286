"""Values under /namespaces/ and /topics/ (docs/METADATA.md#namespace-keys, #topic-keys)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import ClassVar, Self

from danube_fast.meta import table_partitions
from danube_fast.meta.resources_base import (
    JSON,
    Fields,
    JSONObject,
    Resource,
    as_int_enum,
    as_object,
    as_str_enum,
    as_uint,
    bad,
    with_extra,
)
from danube_fast.meta.store import BadValue

DEFAULT_MAX_MESSAGE_SIZE = 10 * 1024 * 1024  # Danube's default policy (10 MiB)


@dataclass(frozen=True)
class Policy(Resource):
    """`/namespaces/{ns}/policy` and `/topics/{ns}/{topic}/policy`: limits, 0 meaning unlimited.

    The defaults are Danube's: everything unlimited but the message size. Retention (docs/RETENTION.md) is
    kept under the names upstream Danube's layout and Pulsar use, `retentionTimeInMinutes` and
    `retentionSizeInMB` (MiB); a value written without them keeps everything. `tableMode` (docs/TABLES.md)
    says whether the topic's records are also kept as an Iceberg table: `none` (absent), `envelope` or
    `schema`; `tablePartitioning` by which period of the publish time its files are partitioned: `hour`
    (absent), `day`, `month` or `none`; `tablePartitionBy` by which of its columns too
    (meta/table_partitions.py, absent: none); `tableRetentionInMinutes` and `tableRetentionSizeInMB` how long
    and how much the table keeps (absent or 0: as `retentionTimeInMinutes` and `retentionSizeInMB` say).
    `messageTTLInSeconds` (docs/SUBSCRIPTIONS.md, absent or 0: none) acknowledges, on every subscription's
    behalf, the records published longer ago. `replicationFactor` and `minInSyncReplicas`
    (docs/REPLICATION.md; absent or 0: 1) say on how many brokers a Reliable topic's log is kept, and how many
    of them must hold a record before it is acknowledged. A topic's own policy, when it has one, is the whole
    policy of that topic (the namespace's does not apply to it).
    """

    RESOURCE = "policy"

    max_consumers_per_subscription: int = 0
    max_consumers_per_topic: int = 0
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_producers_per_topic: int = 0
    max_publish_rate: int = 0
    max_subscription_dispatch_rate: int = 0
    max_subscriptions_per_topic: int = 0
    retention_time_minutes: int = 0
    retention_size_mb: int = 0
    table_mode: str = "none"
    table_partitioning: str = "hour"
    table_partition_by: str = ""
    table_retention_minutes: int = 0
    table_retention_size_mb: int = 0
    message_ttl_seconds: int = 0
    replication_factor: int = 0
    min_insync_replicas: int = 0
    extra: JSONObject = field(default_factory=dict, hash=False)

    _FIELDS: ClassVar[tuple[str, ...]] = (
        "max_consumers_per_subscription", "max_consumers_per_topic", "max_message_size",
        "max_producers_per_topic", "max_publish_rate", "max_subscription_dispatch_rate",
        "max_subscriptions_per_topic")
    # Optional non-negative integers, written only when set (0 or absent: off).
    OPTIONAL: ClassVar[dict[str, str]] = {"retentionTimeInMinutes": "retention_time_minutes",
                                          "retentionSizeInMB": "retention_size_mb",
                                          "tableRetentionInMinutes": "table_retention_minutes",
                                          "tableRetentionSizeInMB": "table_retention_size_mb",
                                          "messageTTLInSeconds": "message_ttl_seconds",
                                          "replicationFactor": "replication_factor",
                                          "minInSyncReplicas": "min_insync_replicas"}
    MAX_REPLICAS: ClassVar[int] = 5
    TABLE_MODE: ClassVar[str] = "tableMode"
    TABLE_MODES: ClassVar[tuple[str, ...]] = ("none", "envelope", "schema")
    TABLE_PARTITIONING: ClassVar[str] = "tablePartitioning"
    TABLE_PARTITIONINGS: ClassVar[tuple[str, ...]] = ("hour", "day", "month", "none")
    TABLE_PARTITION_BY: ClassVar[str] = "tablePartitionBy"
    # every JSON key a policy may set
    KEYS: ClassVar[tuple[str, ...]] = (*_FIELDS, *OPTIONAL, TABLE_MODE, TABLE_PARTITIONING,
                                       TABLE_PARTITION_BY)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        limits = {name: f.uint(name) for name in cls._FIELDS}
        for key, name in cls.OPTIONAL.items():
            limits[name] = f.optional_uint(key) or 0
        mode = f.optional_str(cls.TABLE_MODE) or "none"
        if mode not in cls.TABLE_MODES:
            raise bad(where, f.name(cls.TABLE_MODE), " or ".join(cls.TABLE_MODES), mode)
        partitioning = f.optional_str(cls.TABLE_PARTITIONING) or "hour"
        if partitioning not in cls.TABLE_PARTITIONINGS:
            raise bad(where, f.name(cls.TABLE_PARTITIONING), " or ".join(cls.TABLE_PARTITIONINGS),
                      partitioning)
        try:
            partition_by = table_partitions.canonical(f.optional_str(cls.TABLE_PARTITION_BY) or "")
        except ValueError as e:
            raise BadValue(f"{where}: {f.name(cls.TABLE_PARTITION_BY)}: {e}") from None
        copies, needed = limits["replication_factor"], limits["min_insync_replicas"]
        if copies > cls.MAX_REPLICAS:
            raise bad(where, f.name("replicationFactor"), f"at most {cls.MAX_REPLICAS}", copies)
        if max(needed, 1) > max(copies, 1):
            raise bad(where, f.name("minInSyncReplicas"), f"at most replicationFactor ({max(copies, 1)})",
                      needed)
        return cls(**limits, table_mode=mode, table_partitioning=partitioning,
                   table_partition_by=partition_by, extra=f.extra())

    def to_obj(self) -> JSON:
        obj: JSONObject = {name: getattr(self, name) for name in self._FIELDS}
        for key, name in self.OPTIONAL.items():
            if getattr(self, name):
                obj[key] = getattr(self, name)
        if self.table_mode != "none":
            obj[self.TABLE_MODE] = self.table_mode
        if self.table_partitioning != "hour":
            obj[self.TABLE_PARTITIONING] = self.table_partitioning
        if self.table_partition_by:
            obj[self.TABLE_PARTITION_BY] = self.table_partition_by
        return with_extra(obj, self.extra)

    @property
    def copies(self) -> int:
        """Brokers that keep the topic's log (replicationFactor): the owner and copies - 1 followers."""
        return max(self.replication_factor, 1)

    @property
    def insync_needed(self) -> int:
        """Copies (the owner's included) a record must be on before it is acknowledged (minInSyncReplicas)."""
        return max(self.min_insync_replicas, 1)

    @property
    def table_retention_ms(self) -> int:
        """How long the topic's table keeps a record (by publish time); 0: for ever."""
        return (self.table_retention_minutes or self.retention_time_minutes) * 60_000

    @property
    def table_retention_bytes(self) -> int:
        """How many bytes of data files the topic's table keeps at most (whole hours); 0: no limit."""
        return (self.table_retention_size_mb or self.retention_size_mb) * 1024 * 1024

    def merged(self, changes: JSON, where: str) -> Self:
        """This policy with the fields `changes` (an object of some of its JSON keys) sets; BadValue naming
        `where` when a value is not one a policy may hold."""
        fields = as_object(changes, where, "the changes")
        return type(self).from_obj({**as_object(self.to_obj(), where, "the policy"), **fields}, where)


@dataclass(frozen=True)
class TopicRoot(Resource):
    """`/topics/{ns}/{topic}`: the number of partitions (0 for a non-partitioned topic), a bare number."""

    RESOURCE = "topic root"

    partitions: int = 0

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        return cls(as_uint(value, where, "the value"))

    def to_obj(self) -> JSON:
        return self.partitions


class DeliveryMode(StrEnum):
    RELIABLE = "Reliable"
    NON_RELIABLE = "NonReliable"


@dataclass(frozen=True)
class TopicDelivery(Resource):
    """`/topics/{ns}/{topic}/delivery`: the dispatch strategy, a bare JSON string."""

    RESOURCE = "topic delivery"

    mode: DeliveryMode

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        return cls(as_str_enum(value, where, "the value", DeliveryMode))

    def to_obj(self) -> JSON:
        return str(self.mode.value)


class ProducerAccessMode(IntEnum):
    SHARED = 0
    EXCLUSIVE = 1


@dataclass(frozen=True)
class Producer(Resource):
    """`/topics/{ns}/{topic}/producers/{producer_id}`."""

    RESOURCE = "producer"

    access_mode: ProducerAccessMode
    producer_id: int
    producer_name: str
    status: bool
    topic_name: str  # "/{ns}/{topic}"
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        return cls(access_mode=as_int_enum(f.get("access_mode"), where, f.name("access_mode"),
                                           ProducerAccessMode),
                   producer_id=f.uint("producer_id"), producer_name=f.string("producer_name"),
                   status=f.boolean("status"), topic_name=f.string("topic_name"), extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({"access_mode": int(self.access_mode), "producer_id": self.producer_id,
                           "producer_name": self.producer_name, "status": self.status,
                           "topic_name": self.topic_name}, self.extra)


class SubscriptionType(IntEnum):
    EXCLUSIVE = 0
    SHARED = 1
    FAILOVER = 2
    KEY_SHARED = 3  # the wire enum's value (v0.12+); upstream's layout lists 0..2


@dataclass(frozen=True)
class SubscriptionRecord(Resource):
    """`/topics/{ns}/{topic}/subscriptions/{subscription_name}`; `consumer_id` is present and may be null."""

    RESOURCE = "subscription"

    consumer_id: int | None
    consumer_name: str
    subscription_name: str
    subscription_type: SubscriptionType
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        kind = as_int_enum(f.get("subscription_type"), where, f.name("subscription_type"), SubscriptionType)
        return cls(consumer_id=f.nullable_uint("consumer_id"), consumer_name=f.string("consumer_name"),
                   subscription_name=f.string("subscription_name"), subscription_type=kind, extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({"consumer_id": self.consumer_id, "consumer_name": self.consumer_name,
                           "subscription_name": self.subscription_name,
                           "subscription_type": int(self.subscription_type)}, self.extra)


@dataclass(frozen=True)
class SubscriptionCursor(Resource):
    """`.../subscriptions/{subscription_name}/cursor`: the last acknowledged offset, a bare number."""

    RESOURCE = "subscription cursor"

    offset: int

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        return cls(as_uint(value, where, "the value"))

    def to_obj(self) -> JSON:
        return self.offset


@dataclass(frozen=True)
class SubscriptionDelayed(Resource):
    """`.../subscriptions/{subscription_name}/delayed` (this broker's, not upstream's): where a Shared or
    Key-Shared subscription's delayed records not yet acknowledged may be, `{"from_offset": N, "from_time":
    ms}`: at offsets >= from_offset with a deliver-at time >= from_time. Written with the cursor, in the
    same fenced write; absent when there are none (docs/SUBSCRIPTIONS.md, "Delayed delivery")."""

    RESOURCE = "subscription delayed records"

    from_offset: int
    from_time: int
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        return cls(from_offset=f.uint("from_offset"), from_time=f.uint("from_time"), extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({"from_offset": self.from_offset, "from_time": self.from_time}, self.extra)


class ValidationPolicy(StrEnum):
    """As the SchemaRegistry API spells it (`none`, `warn`, `enforce`)."""

    NONE = "none"
    WARN = "warn"
    ENFORCE = "enforce"


@dataclass(frozen=True)
class TopicSchemaConfig(Resource):
    """`/topics/{ns}/{topic}/schema` (docs/METADATA.md#topic-keys): the topic's schema subject and
    validation settings, named as in the SchemaRegistry API's GetTopicSchemaConfigResponse.

    `schema_subject` is null while the topic has none.
    """

    RESOURCE = "topic schema config"

    schema_subject: str | None
    validation_policy: ValidationPolicy = ValidationPolicy.WARN
    enable_payload_validation: bool = False
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        policy = as_str_enum(f.get("validation_policy"), where, f.name("validation_policy"), ValidationPolicy)
        return cls(schema_subject=f.nullable_str("schema_subject"), validation_policy=policy,
                   enable_payload_validation=f.boolean("enable_payload_validation"), extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({"schema_subject": self.schema_subject,
                           "validation_policy": str(self.validation_policy.value),
                           "enable_payload_validation": self.enable_payload_validation}, self.extra)

"""Values under /cluster/ (docs/METADATA.md#cluster-keys)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Self

from danube_fast.meta.resources_base import (
    JSON,
    U64_MAX,
    Fields,
    JSONObject,
    Resource,
    as_list,
    as_object,
    as_str,
    as_str_enum,
    as_uint,
    bad,
    present,
    with_extra,
)


@dataclass(frozen=True)
class Marker(Resource):
    """JSON null: a key whose existence is the information (cluster name, assignment, namespace topic)."""

    RESOURCE = "existence marker"

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        if value is not None:
            raise bad(where, "the value", "null", value)
        return cls()

    def to_obj(self) -> JSON:
        return None


@dataclass(frozen=True)
class BrokerRegistration(Resource):
    """`/cluster/register/{broker_id}`: where clients and other brokers reach the broker."""

    RESOURCE = "broker registration"

    admin_addr: str  # "http://0.0.0.0:50051"
    advertised_addr: str  # "0.0.0.0:6650"
    broker_addr: str  # "http://0.0.0.0:6650"
    prom_exporter: str  # "0.0.0.0:9040"
    # host:port of its native transport listener (docs/TRANSPORT.md); "" (and absent from the value, as in
    # Danube's) without one
    fast_addr: str = ""
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        return cls(admin_addr=f.string("admin_addr"), advertised_addr=f.string("advertised_addr"),
                   broker_addr=f.string("broker_addr"), prom_exporter=f.string("prom_exporter"),
                   fast_addr=f.optional_str("fast_addr") or "", extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra(present({"admin_addr": self.admin_addr, "advertised_addr": self.advertised_addr,
                                   "broker_addr": self.broker_addr, "prom_exporter": self.prom_exporter},
                                  fast_addr=self.fast_addr or None), self.extra)


class BrokerMode:
    """Known `mode` values of a broker state; others (maintenance, upgrade) are allowed."""

    ACTIVE = "active"
    DRAINING = "draining"


@dataclass(frozen=True)
class BrokerState(Resource):
    """`/cluster/brokers/{broker_id}/state`: {"mode": "active", "reason": "boot"}."""

    RESOURCE = "broker state"

    mode: str
    reason: str
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        return cls(mode=f.string("mode"), reason=f.string("reason"), extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({"mode": self.mode, "reason": self.reason}, self.extra)


UNLOAD = "unload"


@dataclass(frozen=True)
class Unassigned(Resource):
    """`/cluster/unassigned/{ns}/{topic}`: null for a new topic, {reason, from_broker} for an unloaded one.

    `Unassigned()` is the null form; `Unassigned.unload(broker_id)` the form of an unload
    (docs/TOPIC_MOVE.md#a-graceful-move-unload).
    """

    RESOURCE = "unassigned marker"

    reason: str | None = None
    from_broker: int | None = None
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def unload(cls, from_broker: int) -> Self:
        return cls(reason=UNLOAD, from_broker=from_broker)

    @property
    def is_new_topic(self) -> bool:
        return self.reason is None

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        if value is None:
            return cls()
        f = Fields(value, where)
        return cls(reason=f.string("reason"), from_broker=f.optional_uint("from_broker"), extra=f.extra())

    def to_obj(self) -> JSON:
        if self.reason is None:
            if self.from_broker is not None or self.extra:
                raise ValueError("an unassigned marker with from_broker or extra fields needs a reason")
            return None
        obj: JSONObject = {"reason": self.reason}
        if self.from_broker is not None:
            obj["from_broker"] = self.from_broker
        return with_extra(obj, self.extra)


class ResourceKind(StrEnum):
    CPU = "CPU"
    MEMORY = "Memory"


@dataclass(frozen=True)
class SystemLoad:
    """One entry of a load report's `resources_usage`: {"resource": "CPU", "usage": 30}."""

    resource: ResourceKind
    usage: int
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str, path: str) -> Self:
        f = Fields(value, where, path)
        resource = as_str_enum(f.get("resource"), where, f.name("resource"), ResourceKind)
        return cls(resource=resource, usage=f.uint("usage"), extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({"resource": str(self.resource), "usage": self.usage}, self.extra)


@dataclass(frozen=True)
class LoadReport(Resource):
    """`/cluster/load/{broker_id}`: resource usage and the topics (`/{ns}/{topic}`) the broker serves."""

    RESOURCE = "load report"

    resources_usage: tuple[SystemLoad, ...]
    topic_list: tuple[str, ...]
    topics_len: int
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        usage = tuple(SystemLoad.from_obj(v, where, f"resources_usage[{i}]")
                      for i, v in enumerate(f.array("resources_usage")))
        return cls(resources_usage=usage, topic_list=f.strings("topic_list"), topics_len=f.uint("topics_len"),
                   extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({"resources_usage": [u.to_obj() for u in self.resources_usage],
                           "topic_list": list(self.topic_list), "topics_len": self.topics_len}, self.extra)


@dataclass(frozen=True)
class ClusterLeader(Resource):
    """`/cluster/leader`: the leader's broker id, a bare JSON number."""

    RESOURCE = "cluster leader"

    broker_id: int

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        return cls(as_uint(value, where, "the value"))

    def to_obj(self) -> JSON:
        return self.broker_id


@dataclass(frozen=True)
class LoadBalanceDecision(Resource):
    """`/cluster/load_balance` (docs/METADATA.md#cluster-keys): broker id -> the topic names the load manager
    gave it.

    JSON object keys are strings, so broker ids are written in decimal: {"625722408599041316": ["/ns/t"]}.
    """

    RESOURCE = "load balance decision"

    assignments: Mapping[int, tuple[str, ...]] = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        obj = as_object(value, where, "the value")
        assignments: dict[int, tuple[str, ...]] = {}
        for broker, topics in obj.items():
            if not (broker.isascii() and broker.isdigit()) or int(broker) > U64_MAX or (
                    len(broker) > 1 and broker[0] == "0"):
                raise bad(where, f"key {broker!r}", "a broker id in canonical decimal", broker)
            name = f"field {broker!r}"
            assignments[int(broker)] = tuple(as_str(t, where, f"{name}[{i}]")
                                             for i, t in enumerate(as_list(topics, where, name)))
        return cls(assignments)

    def to_obj(self) -> JSON:
        return {str(broker): list(topics) for broker, topics in self.assignments.items()}


@dataclass(frozen=True)
class TopicReplicas(Resource):
    """`/cluster/replicas/{ns}/{topic}`: a replicated topic's copies (docs/REPLICATION.md), written by its
    owner only, fenced on its assignment, whose create revision is `epoch`. `followers`: the brokers that
    keep a copy of its log; `isr`: the in-sync set, the owner first, which every acknowledged record has
    reached; `eligible` (absent: none): followers that left the in-sync set when it fell below
    minInSyncReplicas, after which nothing was acknowledged, so they too hold every acknowledged record.
    The load manager gives a dead owner's topic to a live member of `isr`, else of `eligible`."""

    RESOURCE = "topic replicas"

    owner: int
    epoch: int
    followers: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    eligible: tuple[int, ...] = ()
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        owner, epoch = f.uint("owner"), f.uint("epoch")
        followers, isr = (tuple(as_uint(v, where, f"field {name}[{i}]") for i, v in enumerate(f.array(name)))
                          for name in ("followers", "isr"))
        eligible = tuple(as_uint(v, where, f"field eligible[{i}]")
                         for i, v in enumerate(f.array("eligible") if f.has("eligible") else []))
        if owner in followers:
            raise bad(where, "field followers", "brokers other than the owner", list(followers))
        if any(b != owner and b not in followers for b in isr):
            raise bad(where, "field isr", "the owner and followers", list(isr))
        if any(b not in followers or b in isr for b in eligible):
            raise bad(where, "field eligible", "followers out of the in-sync set", list(eligible))
        return cls(owner, epoch, followers, isr, eligible, f.extra())

    def to_obj(self) -> JSON:
        obj: JSONObject = {"owner": self.owner, "epoch": self.epoch, "followers": list(self.followers),
                           "isr": list(self.isr)}
        if self.eligible:
            obj["eligible"] = list(self.eligible)
        return with_extra(obj, self.extra)

    @property
    def successors(self) -> tuple[int, ...]:
        """Who may continue the topic when its owner is gone, in order of preference: every one holds every
        record acknowledged."""
        return (*(b for b in self.isr if b != self.owner), *self.eligible)

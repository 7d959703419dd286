"""Values under /danube-data/ (docs/METADATA.md#storage-keys): object descriptors, objects/cur, sealed
state, the retention state, and where the topic tables' catalog is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

from danube_fast.meta.resources_base import (
    JSON,
    U64_MAX,
    Fields,
    JSONObject,
    Resource,
    as_list,
    as_uint,
    bad,
    with_extra,
)

OFFSET_DIGITS = 20


@dataclass(frozen=True)
class ObjectDescriptor(Resource):
    """`.../objects/{start_offset:020d}`: one uploaded object and the offsets it holds (both ends included).

    `offset_index` is the object's sparse index, pairs of [offset, byte position in the object]; `etag` is the
    object store's etag, null when it gives none (the local folder store).
    """

    RESOURCE = "object descriptor"

    object_id: str  # "data-0-29.dnb1"
    start_offset: int
    end_offset: int
    size: int
    completed: bool
    created_at: int
    etag: str | None = None
    offset_index: tuple[tuple[int, int], ...] = ()
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        index = []
        for i, entry in enumerate(f.array("offset_index")):
            name = f"field offset_index[{i}]"
            pair = as_list(entry, where, name)
            if len(pair) != 2:
                raise bad(where, name, "an [offset, position] pair", entry)
            index.append((as_uint(pair[0], where, name + "[0]"), as_uint(pair[1], where, name + "[1]")))
        start, end = f.uint("start_offset"), f.uint("end_offset")
        if end < start:
            raise bad(where, "field 'end_offset'", f"at least start_offset ({start})", end)
        return cls(object_id=f.string("object_id"), start_offset=start, end_offset=end, size=f.uint("size"),
                   completed=f.boolean("completed"), created_at=f.uint("created_at"),
                   etag=f.nullable_str("etag"), offset_index=tuple(index), extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({
            "completed": self.completed, "created_at": self.created_at, "end_offset": self.end_offset,
            "etag": self.etag, "object_id": self.object_id,
            "offset_index": [[offset, position] for offset, position in self.offset_index],
            "size": self.size, "start_offset": self.start_offset}, self.extra)


@dataclass(frozen=True)
class CurrentObject(Resource):
    """`.../objects/cur`: {"start": "00000000000000000030"}, the start offset of the latest object, as the
    same 20-digit zero-padded text as its descriptor key."""

    RESOURCE = "current-object pointer"

    start: int
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        text = f.string("start")
        if len(text) != OFFSET_DIGITS or not (text.isascii() and text.isdigit()) or int(text) > U64_MAX:
            raise bad(where, "field 'start'", f"a {OFFSET_DIGITS}-digit zero-padded offset", text)
        return cls(start=int(text), extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({"start": f"{self.start:0{OFFSET_DIGITS}d}"}, self.extra)


@dataclass(frozen=True)
class SealedState(Resource):
    """`.../state`: written by the old owner at unload; the next owner starts its WAL at
    `last_committed_offset + 1` and deletes it once the topic is loaded (docs/TOPIC_MOVE.md)."""

    RESOURCE = "sealed state"

    sealed: bool
    last_committed_offset: int
    broker_id: int
    timestamp: int
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        return cls(sealed=f.boolean("sealed"), last_committed_offset=f.uint("last_committed_offset"),
                   broker_id=f.uint("broker_id"), timestamp=f.uint("timestamp"), extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({"sealed": self.sealed, "last_committed_offset": self.last_committed_offset,
                           "broker_id": self.broker_id, "timestamp": self.timestamp}, self.extra)


@dataclass(frozen=True)
class RetentionState(Resource):
    """`.../retention`: `{"floor": offset, "deleting": [object ids]}`. `floor`: retention deleted every offset
    below it (a dead owner's gap there is no longer waited for). `deleting`: objects whose descriptors are
    gone and that are being deleted; a crash leaves them for the next pass (storage/objects/expiry.py)."""

    RESOURCE = "retention state"

    floor: int
    deleting: tuple[str, ...] = ()
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        return cls(floor=f.uint("floor"), deleting=f.strings("deleting"), extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({"deleting": list(self.deleting), "floor": self.floor}, self.extra)


@dataclass(frozen=True)
class TableCatalog(Resource):
    """`/danube-data/tables/catalog`: the Iceberg catalog every topic table is committed to (docs/TABLES.md):
    `kind` "sql" with a SQLAlchemy URI (`sqlite:////abs/path/catalog.db`), or "metadata" (the table pointers
    under /danube-data/tables/by-topic/, uri ""); and the warehouse under which tables are laid out
    (`file:///abs/path` or `s3://bucket/prefix`). Written by the brokers; readers find their tables here."""

    RESOURCE = "table catalog"
    KINDS = ("sql", "metadata")

    uri: str
    warehouse: str
    kind: str = "sql"
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        kind = f.optional_str("kind") or "sql"
        if kind not in cls.KINDS:
            raise bad(where, f.name("kind"), " or ".join(cls.KINDS), kind)
        return cls(uri=f.string("uri"), warehouse=f.string("warehouse"), kind=kind, extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({"kind": self.kind, "uri": self.uri, "warehouse": self.warehouse}, self.extra)


@dataclass(frozen=True)
class TablePointer(Resource):
    """`/danube-data/tables/by-topic/{namespace}/{table}`: the current metadata file of a topic table in the
    catalog on the metadata store; swapped by compare-and-swap on every commit."""

    RESOURCE = "table pointer"

    metadata_location: str
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        return cls(metadata_location=f.string("metadata_location"), extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({"metadata_location": self.metadata_location}, self.extra)


@dataclass(frozen=True)
class ReplacedLog(Resource):
    """`.../replaced/{broker_id}`: an in-sync follower took the topic over from that broker when it died
    (docs/REPLICATION.md): every record the dead broker acknowledged is at or below `through` in the new
    owner's log, and what its own log holds above that was never acknowledged. Its orphan recovery uploads
    nothing and deletes the directory. `by` (ours; absent in keys written before it): the broker that took
    it over, whose own orphan recovery fills the dead broker's range should it die before it wrote where
    its term starts."""

    RESOURCE = "replaced log"

    through: int  # -1: the dead owner acknowledged nothing
    by: int | None = None
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        through = f.get("through")
        if through != -1:
            through = f.uint("through")
        assert isinstance(through, int)
        return cls(through, f.uint("by") if f.has("by") else None, f.extra())

    def to_obj(self) -> JSON:
        obj: JSONObject = {"through": self.through}
        if self.by is not None:
            obj["by"] = self.by
        return with_extra(obj, self.extra)


@dataclass(frozen=True)
class TermSuccessors(Resource):
    """`.../successors/{broker_id}`: that broker died owning a replicated term (`epoch`) and the topic went
    to a broker without a copy (no successor was alive); `brokers` are the followers that held every record
    it acknowledged. When one of them comes back, its copy fills the dead broker's gap and declares the
    rest of it empty (docs/REPLICATION.md)."""

    RESOURCE = "term successors"

    epoch: int
    brokers: tuple[int, ...] = ()
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        brokers = tuple(as_uint(v, where, f"field brokers[{i}]") for i, v in enumerate(f.array("brokers")))
        return cls(f.uint("epoch"), brokers, f.extra())

    def to_obj(self) -> JSON:
        return with_extra({"epoch": self.epoch, "brokers": list(self.brokers)}, self.extra)

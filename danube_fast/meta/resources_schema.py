"""Values under /schemas/ (docs/METADATA.md#schema-keys): the schema registry's subjects, versions and id
index.

The JSON is Danube's serde form: enums are externally tagged (`{"Avro": {...}}`, or a bare `"String"` for a
variant without data). The second version in upstream's metadata example has only created_at, version,
fingerprint and schema_def, so created_by, description, tags and is_deprecated are optional here (None =
absent, and absent stays absent on output). Danube itself requires all four when it reads a version: set them
when writing one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Self

from danube_fast.meta.resources_base import (
    JSON,
    U32_MAX,
    Fields,
    JSONObject,
    Resource,
    as_str_enum,
    as_uint,
    bad,
    present,
    with_extra,
)


class CompatibilityMode(StrEnum):
    NONE = "None"
    BACKWARD = "Backward"
    FORWARD = "Forward"
    FULL = "Full"


class SchemaKind(StrEnum):
    BYTES = "Bytes"
    STRING = "String"
    NUMBER = "Number"
    AVRO = "Avro"
    JSON_SCHEMA = "JsonSchema"
    PROTOBUF = "Protobuf"


_UNIT_KINDS = frozenset({SchemaKind.BYTES, SchemaKind.STRING, SchemaKind.NUMBER})


@dataclass(frozen=True)
class SchemaDefinition:
    """`schema_def`: a bare kind (Bytes, String, Number), or {kind: body}.

    Avro and JsonSchema bodies are {raw_schema, fingerprint}; Protobuf is {raw_proto, message_name,
    fingerprint}.
    `extra` holds unknown fields of the body.
    """

    kind: SchemaKind
    fingerprint: str | None = None
    raw_schema: str | None = None
    raw_proto: str | None = None
    message_name: str | None = None
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str, path: str) -> Self:
        if isinstance(value, str):
            kind = as_str_enum(value, where, f"field {path}", SchemaKind)
            if kind not in _UNIT_KINDS:
                raise bad(where, f"field {path}", f"{{{kind.value!r}: {{...}}}} (it carries a schema)", value)
            return cls(kind)
        if not isinstance(value, dict) or len(value) != 1:
            raise bad(where, f"field {path}", "a schema kind or an object with exactly one kind", value)
        ((name, body),) = value.items()
        kind = as_str_enum(name, where, f"the kind of field {path}", SchemaKind)
        if kind in _UNIT_KINDS:
            raise bad(where, f"field {path}", f"the bare string {kind.value!r}", value)
        f = Fields(body, where, f"{path}.{name}")
        if kind is SchemaKind.PROTOBUF:
            return cls(kind, raw_proto=f.string("raw_proto"), message_name=f.string("message_name"),
                       fingerprint=f.string("fingerprint"), extra=f.extra())
        return cls(kind, raw_schema=f.string("raw_schema"), fingerprint=f.string("fingerprint"),
                   extra=f.extra())

    def to_obj(self) -> JSON:
        if self.kind in _UNIT_KINDS:
            return str(self.kind.value)
        body: JSONObject
        if self.kind is SchemaKind.PROTOBUF:
            body = {"raw_proto": self.raw_proto, "message_name": self.message_name,
                    "fingerprint": self.fingerprint}
        else:
            body = {"fingerprint": self.fingerprint, "raw_schema": self.raw_schema}
        return {str(self.kind.value): with_extra(body, self.extra)}


@dataclass(frozen=True)
class SchemaVersion(Resource):
    """`/schemas/{subject}/versions/{version}`, and each entry of a subject's `versions`."""

    RESOURCE = "schema version"

    version: int
    fingerprint: str
    schema_def: SchemaDefinition
    created_at: int
    created_by: str | None = None
    description: str | None = None
    tags: tuple[str, ...] | None = None
    is_deprecated: bool | None = None
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str, path: str = "") -> Self:
        f = Fields(value, where, path)
        sub = f"{path}.schema_def" if path else "schema_def"
        return cls(version=f.uint("version", U32_MAX), fingerprint=f.string("fingerprint"),
                   schema_def=SchemaDefinition.from_obj(f.get("schema_def"), where, sub),
                   created_at=f.uint("created_at"), created_by=f.optional_str("created_by"),
                   description=f.optional_str("description"), tags=f.optional_strings("tags"),
                   is_deprecated=f.optional_bool("is_deprecated"), extra=f.extra())

    def to_obj(self) -> JSON:
        obj: JSONObject = {"created_at": self.created_at}
        present(obj, created_by=self.created_by)
        obj.update({"version": self.version, "fingerprint": self.fingerprint})
        present(obj, description=self.description, is_deprecated=self.is_deprecated,
                tags=None if self.tags is None else list(self.tags))
        obj["schema_def"] = self.schema_def.to_obj()
        return with_extra(obj, self.extra)


@dataclass(frozen=True)
class SchemaMetadata(Resource):
    """`/schemas/{subject}/metadata`: the subject, its compatibility mode and every version."""

    RESOURCE = "schema metadata"

    id: int
    subject: str
    compatibility_mode: CompatibilityMode
    latest_version: int
    versions: tuple[SchemaVersion, ...]
    topics_using: tuple[str, ...]
    created_at: int
    created_by: str
    updated_at: int
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        mode = as_str_enum(f.get("compatibility_mode"), where, f.name("compatibility_mode"),
                           CompatibilityMode)
        versions = tuple(SchemaVersion.from_obj(v, where, f"versions[{i}]")
                         for i, v in enumerate(f.array("versions")))
        return cls(id=f.uint("id"), subject=f.string("subject"), compatibility_mode=mode,
                   latest_version=f.uint("latest_version", U32_MAX), versions=versions,
                   topics_using=f.strings("topics_using"), created_at=f.uint("created_at"),
                   created_by=f.string("created_by"), updated_at=f.uint("updated_at"), extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({
            "compatibility_mode": str(self.compatibility_mode.value), "created_at": self.created_at,
            "created_by": self.created_by, "id": self.id, "latest_version": self.latest_version,
            "subject": self.subject, "topics_using": list(self.topics_using), "updated_at": self.updated_at,
            "versions": [v.to_obj() for v in self.versions]}, self.extra)


@dataclass(frozen=True)
class SchemaIndexEntry(Resource):
    """`/schemas/_index/by_id/{schema_id}`: which subject a schema id belongs to."""

    RESOURCE = "schema id index entry"

    schema_id: int
    subject: str
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        return cls(schema_id=f.uint("schema_id"), subject=f.string("subject"), extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({"schema_id": self.schema_id, "subject": self.subject}, self.extra)


@dataclass(frozen=True)
class NextSchemaId(Resource):
    """`/schemas/_global/next_schema_id`: the next id to hand out (ids start at 1), a bare number."""

    RESOURCE = "next schema id"

    next_id: int

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        return cls(as_uint(value, where, "the value"))

    def to_obj(self) -> JSON:
        return self.next_id

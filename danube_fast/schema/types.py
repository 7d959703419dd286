"""Schema types, compatibility modes and validation policies as the API spells them, and definitions with
their fingerprints (docs/WIRE.md C.13).

* Type strings are accepted case-insensitively with v0.7.3's aliases (`number|int64|int|float|double`,
  `json_schema|json`, `protobuf|proto`) and answered in canonical lowercase form.
* Fingerprints: the type name for `bytes`, `string` and `number` (every such definition is the same
  schema); `sha256:<hex>` of the compact re-serialised JSON for Avro and JSON Schema (so whitespace and key
  order do not make a new version); `sha256:<hex>` of the raw text for Protobuf.
* The compact form is serde_json's (no whitespace, object keys sorted: v0.7.3 builds serde_json without
  `preserve_order`). For JSON Schema that is v0.7.3's fingerprint (the two JSON printers differ only in
  how they write some non-integral numbers, e.g. 1e+20 against 1e20). v0.7.3 fingerprints Avro
  after apache_avro has normalised the schema (its own serialisation of the parsed form); ours hashes the
  definition as written, so an Avro fingerprint equals v0.7.3's only for definitions already in that form.
  Fingerprints identify definitions within one registry; nothing compares them across implementations.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Any

from danube_fast.meta.resources import CompatibilityMode, SchemaDefinition, SchemaKind, ValidationPolicy
from danube_fast.schema import avro, jsonschema
from danube_fast.schema.errors import InvalidSchema, InvalidSetting
from danube_fast.schema.jsonschema import finite

PROTOBUF_MESSAGE_NAME = "DefaultMessage"  # v0.7.3 fixes it: the definition does not say which message


class SchemaType(StrEnum):
    BYTES = "bytes"
    STRING = "string"
    NUMBER = "number"
    AVRO = "avro"
    JSON_SCHEMA = "json_schema"
    PROTOBUF = "protobuf"


_TYPE_NAMES = {
    "bytes": SchemaType.BYTES, "string": SchemaType.STRING,
    "number": SchemaType.NUMBER, "int64": SchemaType.NUMBER, "int": SchemaType.NUMBER,
    "float": SchemaType.NUMBER, "double": SchemaType.NUMBER,
    "avro": SchemaType.AVRO,
    "json_schema": SchemaType.JSON_SCHEMA, "json": SchemaType.JSON_SCHEMA,
    "protobuf": SchemaType.PROTOBUF, "proto": SchemaType.PROTOBUF,
}

_KIND_OF = {
    SchemaType.BYTES: SchemaKind.BYTES, SchemaType.STRING: SchemaKind.STRING,
    SchemaType.NUMBER: SchemaKind.NUMBER, SchemaType.AVRO: SchemaKind.AVRO,
    SchemaType.JSON_SCHEMA: SchemaKind.JSON_SCHEMA, SchemaType.PROTOBUF: SchemaKind.PROTOBUF,
}
_TYPE_OF = {kind: schema_type for schema_type, kind in _KIND_OF.items()}


def parse_type(text: str) -> SchemaType:
    found = _TYPE_NAMES.get(text.lower())
    if found is None:
        raise InvalidSchema(f"Unknown schema type: {text!r} (bytes, string, number, avro, json_schema, "
                            "protobuf)")
    return found


def type_of(definition: SchemaDefinition) -> SchemaType:
    return _TYPE_OF[definition.kind]


def parse_mode(text: str) -> CompatibilityMode:
    for mode in CompatibilityMode:
        if mode.value.lower() == text.lower():
            return mode
    raise InvalidSetting(f"Invalid compatibility mode: {text!r} (none, backward, forward, full)")


def mode_name(mode: CompatibilityMode) -> str:
    """As the SchemaRegistry API answers it: lowercase."""
    return mode.value.lower()


def parse_policy(text: str) -> ValidationPolicy:
    try:
        return ValidationPolicy(text.lower())
    except ValueError:
        raise InvalidSetting(f"Invalid validation policy: {text!r} (none, warn, enforce)") from None


def compact_json(value: Any) -> str:
    """serde_json's compact form of a parsed value (keys sorted, no whitespace, no ASCII escaping)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False)


def _sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _text(data: bytes, schema_type: SchemaType) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidSchema(f"Invalid UTF-8 in {schema_type.value} schema: {e}") from e


def _json(text: str, schema_type: SchemaType) -> Any:
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=finite)
    except (ValueError, RecursionError) as e:
        raise InvalidSchema(f"Invalid JSON in {schema_type.value} schema: {e}") from e


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def build_definition(schema_type: SchemaType, data: bytes) -> SchemaDefinition:
    """The stored definition of `data` registered as `schema_type`, fingerprint included; InvalidSchema if
    it does not parse as that type."""
    if schema_type in (SchemaType.BYTES, SchemaType.STRING, SchemaType.NUMBER):
        return SchemaDefinition(_KIND_OF[schema_type], fingerprint=schema_type.value)
    text = _text(data, schema_type)
    if schema_type is SchemaType.PROTOBUF:
        if not text.strip():
            raise InvalidSchema("Invalid protobuf schema: the definition is empty")
        return SchemaDefinition(SchemaKind.PROTOBUF, fingerprint=_sha256(text), raw_proto=text,
                                message_name=PROTOBUF_MESSAGE_NAME)
    value = _json(text, schema_type)
    if schema_type is SchemaType.AVRO:
        avro.parse(value)
    else:
        jsonschema.check_schema(value)
    return SchemaDefinition(_KIND_OF[schema_type], fingerprint=_sha256(compact_json(value)), raw_schema=text)


def definition_bytes(definition: SchemaDefinition) -> bytes:
    """What GetSchema answers as `schema_definition`: the registered text for Avro, JSON Schema and
    Protobuf; the canonical type name for the types whose definition carries nothing else."""
    if definition.kind is SchemaKind.PROTOBUF:
        return (definition.raw_proto or "").encode("utf-8")
    if definition.raw_schema is not None:
        return definition.raw_schema.encode("utf-8")
    return type_of(definition).value.encode("ascii")


def parsed_json(definition: SchemaDefinition) -> Any:
    """The parsed JSON of an Avro or JSON Schema definition (stored definitions parsed when registered)."""
    return json.loads(definition.raw_schema or "null")

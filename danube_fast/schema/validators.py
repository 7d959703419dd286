"""Payload validators: does a message's payload match the schema version it claims (the topic's
`enable_payload_validation`)?

As v0.7.3: `bytes` accepts anything, `string` wants UTF-8, `number` wants 4 or 8 bytes (a 32- or 64-bit
integer or float). JSON Schema payloads must be JSON satisfying the schema (`jsonschema`); Avro payloads must
be one binary datum of the schema (`avro`). docs/SCHEMAS.md gives the rules. Protobuf payloads are not
checked: the registry does not parse .proto definitions.
"""

from __future__ import annotations

from collections.abc import Callable

from danube_fast.meta.resources import SchemaDefinition, SchemaKind
from danube_fast.schema import avro, jsonschema
from danube_fast.schema.types import parsed_json

Validator = Callable[[bytes], str | None]  # the reason a payload is refused, None if it is accepted


def _accept(payload: bytes) -> str | None:
    return None


def _utf8(payload: bytes) -> str | None:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"Invalid UTF-8 string: {e}"
    return None


def _number(payload: bytes) -> str | None:
    if len(payload) in (4, 8):
        return None
    return f"Invalid number: expected 4 or 8 bytes, got {len(payload)}"


def validator_for(definition: SchemaDefinition) -> Validator:
    kind = definition.kind
    if kind is SchemaKind.STRING:
        return _utf8
    if kind is SchemaKind.NUMBER:
        return _number
    if kind is SchemaKind.JSON_SCHEMA:
        return jsonschema.payload_check(parsed_json(definition))
    if kind is SchemaKind.AVRO:
        parsed = avro.parse(parsed_json(definition))
        return lambda payload: avro.datum_errors(parsed, payload)
    return _accept  # bytes, protobuf

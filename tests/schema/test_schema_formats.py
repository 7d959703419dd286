"""Schema types, fingerprints, definitions, compatibility rules and payload validators (no store)."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence

import pytest

from danube_fast.meta.resources import CompatibilityMode, SchemaKind, ValidationPolicy
from danube_fast.schema import InvalidSchema, InvalidSetting, SchemaType
from danube_fast.schema.compat import compatibility_errors
from danube_fast.schema.types import (
    build_definition,
    definition_bytes,
    mode_name,
    parse_mode,
    parse_policy,
    parse_type,
)
from danube_fast.schema.validators import validator_for

BACKWARD, FORWARD, FULL, NONE = (CompatibilityMode.BACKWARD, CompatibilityMode.FORWARD,
                                 CompatibilityMode.FULL, CompatibilityMode.NONE)


def avro(*fields: dict[str, object], name: str = "User") -> bytes:
    return json.dumps({"type": "record", "name": name, "fields": list(fields)}).encode()


def json_schema(props: dict[str, object], required: Sequence[str] = (), **extra: object) -> bytes:
    return json.dumps({"type": "object", "properties": props, "required": list(required), **extra}).encode()


def errors(kind: SchemaType, old: bytes, new: bytes, mode: CompatibilityMode) -> list[str]:
    return compatibility_errors(build_definition(kind, old), build_definition(kind, new), mode)


# ------------------------------------------------------------------------------------ names and settings

@pytest.mark.parametrize(("text", "expected"), [
    ("bytes", SchemaType.BYTES), ("STRING", SchemaType.STRING), ("number", SchemaType.NUMBER),
    ("int64", SchemaType.NUMBER), ("Int", SchemaType.NUMBER), ("float", SchemaType.NUMBER),
    ("double", SchemaType.NUMBER), ("Avro", SchemaType.AVRO), ("json_schema", SchemaType.JSON_SCHEMA),
    ("JSON", SchemaType.JSON_SCHEMA), ("protobuf", SchemaType.PROTOBUF), ("PROTO", SchemaType.PROTOBUF),
])
def test_type_names_are_case_insensitive_with_aliases(text: str, expected: SchemaType) -> None:
    assert parse_type(text) is expected


@pytest.mark.parametrize("text", ["", "jsonschema", "xml", "json-schema"])
def test_unknown_type_names_are_refused(text: str) -> None:
    with pytest.raises(InvalidSchema, match="Unknown schema type"):
        parse_type(text)


def test_modes_and_policies() -> None:
    assert parse_mode("FULL") is CompatibilityMode.FULL and mode_name(CompatibilityMode.FULL) == "full"
    assert parse_mode("backward") is CompatibilityMode.BACKWARD
    assert parse_policy("Enforce") is ValidationPolicy.ENFORCE
    assert parse_policy("WARN") is ValidationPolicy.WARN
    with pytest.raises(InvalidSetting):
        parse_mode("transitive")
    with pytest.raises(InvalidSetting):
        parse_policy("strict")


# ------------------------------------------------------------------------------------------ fingerprints

def test_fingerprints_of_the_plain_types_are_their_names() -> None:
    for kind in (SchemaType.BYTES, SchemaType.STRING, SchemaType.NUMBER):
        d = build_definition(kind, b"anything")
        assert d.fingerprint == kind.value and d.raw_schema is None
        assert definition_bytes(d) == kind.value.encode()


def test_json_fingerprint_is_sha256_of_compact_sorted_json() -> None:
    pretty = b'{\n  "type": "object",\n  "properties": {"name": {"type": "string"}}\n}'
    reordered = b'{"properties":{"name":{"type":"string"}},"type":"object"}'
    compact = '{"properties":{"name":{"type":"string"}},"type":"object"}'
    expected = "sha256:" + hashlib.sha256(compact.encode()).hexdigest()
    a = build_definition(SchemaType.JSON_SCHEMA, pretty)
    b = build_definition(SchemaType.JSON_SCHEMA, reordered)
    assert a.fingerprint == b.fingerprint == expected
    assert definition_bytes(a) == pretty  # the registered bytes, untouched


def test_avro_fingerprint_ignores_whitespace_and_protobuf_hashes_raw_text() -> None:
    one = build_definition(SchemaType.AVRO, avro({"name": "id", "type": "long"}))
    two = build_definition(SchemaType.AVRO, b' { "fields" : [ {"type":"long","name":"id"} ], "name":"User",'
                                            b' "type":"record" } ')
    assert one.fingerprint == two.fingerprint and one.fingerprint is not None
    assert one.fingerprint.startswith("sha256:") and len(one.fingerprint) == 7 + 64
    text = 'syntax = "proto3";\nmessage M { int64 id = 1; }\n'
    proto = build_definition(SchemaType.PROTOBUF, text.encode())
    assert proto.kind is SchemaKind.PROTOBUF and proto.message_name == "DefaultMessage"
    assert proto.fingerprint == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    assert build_definition(SchemaType.PROTOBUF, text.encode() + b" ").fingerprint != proto.fingerprint
    assert definition_bytes(proto) == text.encode()


@pytest.mark.parametrize(("kind", "data", "match"), [
    (SchemaType.JSON_SCHEMA, b"{not json", "Invalid JSON"),
    (SchemaType.JSON_SCHEMA, b'{"type": "invalid_type"}', r'\$\.type: "invalid_type" is not a JSON Schema'),
    (SchemaType.JSON_SCHEMA, b'{"items": {"type": ["string", 3]}}', r"\$\.items\.type: .* is not a JSON"),
    (SchemaType.JSON_SCHEMA, b'{"properties": {"a": 3}}', r'\$\.properties\.a: 3 is not of types "boolean"'),
    (SchemaType.JSON_SCHEMA, b'{"required": "a"}', r'\$\.required: "a" is not of type "array"'),
    (SchemaType.JSON_SCHEMA, b'{"minLength": -1}', "less than the minimum of 0"),
    (SchemaType.JSON_SCHEMA, b'{"pattern": "(unclosed"}', "regex"),
    (SchemaType.JSON_SCHEMA, b'{"$ref": "#/$defs/missing"}', "does not exist"),
    (SchemaType.JSON_SCHEMA, b'{"$ref": "http://127.0.0.1:9/other.json"}', "outside the definition"),
    (SchemaType.JSON_SCHEMA, b'{"$schema": "http://example.com/mine", "type": "string"}', "meta-schema"),
    (SchemaType.JSON_SCHEMA, b"3", "an object or a boolean"),
    (SchemaType.JSON_SCHEMA, b'{"maximum": 1e999}', "out of range"),
    (SchemaType.JSON_SCHEMA, b"\xff\xfe", "UTF-8"),
    (SchemaType.AVRO, b'{"type": "invalid_type", "name": "User"}', "Undefined type"),
    (SchemaType.AVRO, b'{"type": "record", "name": "User"}', "fields"),
    (SchemaType.AVRO, b'{"type": "record", "name": "U", "fields": [{"name": "a"}]}', "not a valid Avro"),
    (SchemaType.AVRO, b'{"type": "record", "name": "U", "fields": [{"name": "a", "type": "No"}]}', "No"),
    (SchemaType.AVRO, b'{"type": "enum", "name": "E", "symbols": ["A", "A"]}', "Duplicate symbol"),
    (SchemaType.AVRO, b'[["int"]]', "Unions cannot contain other unions"),
    (SchemaType.AVRO, b'["int", "int"]', "int type already in Union"),
    (SchemaType.AVRO, b'[{"type": "map", "values": "int"}, {"type": "map", "values": "long"}]', "map type"),
    (SchemaType.AVRO, b'{"type": "enum", "name": "E", "symbols": ["A"], "default": "B"}', "Enum default 'B'"),
    (SchemaType.AVRO, b'{"type": "record", "name": "U", "fields": [{"name": "a", "type": "int", '
                      b'"default": "x"}]}', "Default value <x> must match schema type: int"),
    (SchemaType.AVRO, b'{"type": "array", "items": "null"}', "an array of null takes no bytes"),
    (SchemaType.AVRO, b'{"type": "record", "name": "U", "fields": [{"name": "a", "type": {"type": "array", '
                      b'"items": {"type": "record", "name": "E", "fields": []}}}]}', "an array of record"),
    (SchemaType.PROTOBUF, b"   ", "empty"),
])
def test_bad_definitions_are_refused(kind: SchemaType, data: bytes, match: str) -> None:
    with pytest.raises(InvalidSchema, match=match):
        build_definition(kind, data)


def test_avro_named_types_resolve_including_recursion() -> None:
    linked = {"type": "record", "name": "Node", "namespace": "x.y", "fields": [
        {"name": "value", "type": "int"},
        {"name": "next", "type": ["null", "Node"], "default": None},
        {"name": "tag", "type": {"type": "enum", "name": "Tag", "symbols": ["A", "B"]}},
        {"name": "again", "type": "x.y.Tag"},
        {"name": "blob", "type": {"type": "fixed", "name": "Blob", "size": 4}},
        {"name": "tags", "type": {"type": "array", "items": "Tag"}},
        {"name": "attrs", "type": {"type": "map", "values": "string"}},
    ]}
    d = build_definition(SchemaType.AVRO, json.dumps(linked).encode())
    assert compatibility_errors(d, d, FULL) == []


# ---------------------------------------------------------------------------------------- compatibility

def test_mode_none_accepts_anything_and_type_changes_break_every_other_mode() -> None:
    old = avro({"name": "a", "type": "int"})
    new = avro({"name": "b", "type": "string"}, name="Other")
    assert errors(SchemaType.AVRO, old, new, NONE) == []
    string, number = build_definition(SchemaType.STRING, b"s"), build_definition(SchemaType.NUMBER, b"n")
    assert compatibility_errors(string, number, NONE) == []
    for mode in (BACKWARD, FORWARD, FULL):
        assert "Schema types must match" in compatibility_errors(string, number, mode)[0]
    assert compatibility_errors(string, build_definition(SchemaType.STRING, b"other"), FULL) == []


def test_avro_new_field_without_default_breaks_backward_only() -> None:
    old = avro({"name": "name", "type": "string"})
    new = avro({"name": "name", "type": "string"}, {"name": "age", "type": "int"})
    found = errors(SchemaType.AVRO, old, new, BACKWARD)
    assert len(found) == 1 and "'age'" in found[0] and found[0].startswith("backward:")
    assert errors(SchemaType.AVRO, old, new, FORWARD) == []
    assert errors(SchemaType.AVRO, old, new, FULL) == found
    with_default = avro({"name": "name", "type": "string"},
                        {"name": "age", "type": ["null", "int"], "default": None})
    assert errors(SchemaType.AVRO, old, with_default, FULL) == []


def test_avro_removed_field_breaks_forward_unless_it_had_a_default() -> None:
    old = avro({"name": "name", "type": "string"}, {"name": "age", "type": "int"})
    new = avro({"name": "name", "type": "string"})
    assert errors(SchemaType.AVRO, old, new, BACKWARD) == []
    found = errors(SchemaType.AVRO, old, new, FORWARD)
    assert len(found) == 1 and "'age'" in found[0] and found[0].startswith("forward:")
    assert errors(SchemaType.AVRO, old, new, FULL) == found
    old_default = avro({"name": "name", "type": "string"}, {"name": "age", "type": "int", "default": 0})
    assert errors(SchemaType.AVRO, old_default, new, FULL) == []


def test_avro_type_promotion_unions_enums_and_aliases() -> None:
    widened = errors(SchemaType.AVRO, avro({"name": "n", "type": "int"}), avro({"name": "n", "type": "long"}),
                     FULL)
    assert len(widened) == 1 and widened[0].startswith("forward:")  # long data is not readable as int
    assert errors(SchemaType.AVRO, avro({"name": "n", "type": "int"}),
                  avro({"name": "n", "type": ["null", "int"]}), BACKWARD) == []
    assert errors(SchemaType.AVRO, avro({"name": "n", "type": ["null", "int"]}),
                  avro({"name": "n", "type": "int"}), BACKWARD)  # null is not readable as int
    assert errors(SchemaType.AVRO, avro({"name": "n", "type": "string"}),
                  avro({"name": "n", "type": "boolean"}), BACKWARD)
    renamed = avro({"name": "full_name", "type": "string", "aliases": ["name"]})
    assert errors(SchemaType.AVRO, avro({"name": "name", "type": "string"}), renamed, BACKWARD) == []

    def enum(*symbols: str, default: bool = False) -> bytes:
        e: dict[str, object] = {"type": "enum", "name": "Color", "symbols": list(symbols)}
        if default:
            e["default"] = symbols[0]
        return avro({"name": "c", "type": e})

    assert errors(SchemaType.AVRO, enum("RED"), enum("RED", "BLUE"), BACKWARD) == []
    assert errors(SchemaType.AVRO, enum("RED", "BLUE"), enum("RED"), BACKWARD)
    assert errors(SchemaType.AVRO, enum("RED", "BLUE"), enum("RED", default=True), BACKWARD) == []
    assert errors(SchemaType.AVRO, avro({"name": "a", "type": "int"}, name="A"),
                  avro({"name": "a", "type": "int"}, name="B"), BACKWARD)


def test_json_new_required_field_breaks_backward_removed_required_field_breaks_forward() -> None:
    v1 = json_schema({"name": {"type": "string"}}, ["name"])
    v2 = json_schema({"name": {"type": "string"}, "age": {"type": "integer"}}, ["name", "age"])
    back = errors(SchemaType.JSON_SCHEMA, v1, v2, BACKWARD)
    assert len(back) == 1 and "'age'" in back[0] and back[0].startswith("backward:")
    assert errors(SchemaType.JSON_SCHEMA, v1, v2, FORWARD) == []
    v2_default = json_schema({"name": {"type": "string"}, "age": {"type": "integer", "default": 0}},
                             ["name", "age"])
    assert errors(SchemaType.JSON_SCHEMA, v1, v2_default, BACKWARD) == []
    v0 = json_schema({}, [])
    fwd = errors(SchemaType.JSON_SCHEMA, v1, v0, FORWARD)
    assert len(fwd) == 1 and "'name'" in fwd[0] and fwd[0].startswith("forward:")
    assert errors(SchemaType.JSON_SCHEMA, v1, v0, BACKWARD) == []
    assert len(errors(SchemaType.JSON_SCHEMA, v1, v0, FULL)) == 1
    optional = json_schema({"name": {"type": "string"}, "nick": {"type": "string"}}, ["name"])
    assert errors(SchemaType.JSON_SCHEMA, optional, v1, FULL) == []  # an optional field may go


def test_json_type_changes_and_closed_objects() -> None:
    as_int = json_schema({"n": {"type": "integer"}})
    as_number = json_schema({"n": {"type": "number"}})
    assert errors(SchemaType.JSON_SCHEMA, as_int, as_number, BACKWARD) == []  # number reads integers
    assert errors(SchemaType.JSON_SCHEMA, as_int, as_number, FORWARD)
    as_string = json_schema({"n": {"type": "string"}})
    assert len(errors(SchemaType.JSON_SCHEMA, as_int, as_string, FULL)) == 2
    closed = json_schema({"a": {"type": "string"}}, additionalProperties=False)
    wider = json_schema({"a": {"type": "string"}, "b": {"type": "string"}})
    assert errors(SchemaType.JSON_SCHEMA, wider, closed, BACKWARD)  # old data may carry b
    assert errors(SchemaType.JSON_SCHEMA, closed, wider, FORWARD)


def test_protobuf_changes_are_accepted() -> None:
    old = b'syntax = "proto3"; message M { int64 id = 1; }'
    new = b'syntax = "proto3"; message M { string id = 1; }'
    assert errors(SchemaType.PROTOBUF, old, new, FULL) == []


# ------------------------------------------------------------------------------------------ validators

def _zigzag(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def test_plain_validators() -> None:
    assert validator_for(build_definition(SchemaType.BYTES, b"b"))(b"\xff") is None
    utf8 = validator_for(build_definition(SchemaType.STRING, b"s"))
    assert utf8("héllo".encode()) is None and utf8(b"\xff\xfe") is not None
    number = validator_for(build_definition(SchemaType.NUMBER, b"n"))
    assert number(struct.pack("<i", 7)) is None and number(struct.pack("<d", 1.5)) is None
    assert number(b"12") is not None
    assert validator_for(build_definition(SchemaType.PROTOBUF, b"message M {}"))(b"\x00garbage") is None


def test_json_payload_validation() -> None:
    schema = json_schema({"name": {"type": "string", "minLength": 1},
                          "age": {"type": "integer", "minimum": 0},
                          "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                          "kind": {"enum": ["a", "b"]}}, ["name"], additionalProperties=False)
    check = validator_for(build_definition(SchemaType.JSON_SCHEMA, schema))
    assert check(b'{"name": "x", "age": 3, "tags": ["t"], "kind": "a"}') is None
    assert check(b'{"name": "x", "age": 3.0}') is None
    for bad in (b'{"age": 3}', b'{"name": 5}', b'{"name": ""}', b'{"name": "x", "age": -1}',
                b'{"name": "x", "tags": ["a", "b", "c"]}', b'{"name": "x", "tags": [1]}',
                b'{"name": "x", "kind": "c"}', b'{"name": "x", "extra": 1}', b"not json", b"[]"):
        assert check(bad) is not None, bad


def test_avro_payload_validation() -> None:
    schema = avro({"name": "id", "type": "long"}, {"name": "name", "type": "string"},
                  {"name": "score", "type": ["null", "double"]},
                  {"name": "tags", "type": {"type": "array", "items": "string"}})
    check = validator_for(build_definition(SchemaType.AVRO, schema))
    good = (_zigzag(42) + _zigzag(3) + b"bob" + _zigzag(1) + struct.pack("<d", 0.5)
            + _zigzag(2) + _zigzag(1) + b"a" + _zigzag(1) + b"b" + _zigzag(0))
    assert check(good) is None
    assert check(good[:-1]) is not None  # truncated
    assert check(good + b"\x00") is not None  # trailing bytes
    assert check(_zigzag(42) + _zigzag(2) + b"\xff\xfe" + _zigzag(0) + _zigzag(0)) is not None  # bad UTF-8
    assert check(_zigzag(42) + _zigzag(0) + _zigzag(5) + _zigzag(0)) is not None  # union index out of range


@pytest.mark.parametrize(("schema", "payload"), [
    ({"enum": [1]}, b"true"), ({"const": 0}, b"false"), ({"type": "integer"}, b"true"),
    ({"uniqueItems": True}, b"[1, 1]"), ({"multipleOf": 2}, b"3"),
    ({"if": {"minimum": 10}, "then": {"multipleOf": 5}}, b"12"),
    ({"patternProperties": {"^n_": {"type": "integer"}}}, b'{"n_a": "x"}'),
    ({"prefixItems": [{"type": "string"}]}, b"[1]"),
    ({"$defs": {"pos": {"minimum": 0}}, "$ref": "#/$defs/pos"}, b"-1"),
    ({"type": "number"}, b"NaN"), ({}, b'{"a": Infinity}'),
    ({"properties": {"n": {"maximum": 5}}}, b'{"n": 1e999}'),  # infinity reaches the validator as null
])
def test_json_payloads_the_old_subset_let_through_are_refused(schema: object, payload: bytes) -> None:
    check = validator_for(build_definition(SchemaType.JSON_SCHEMA, json.dumps(schema).encode()))
    assert check(payload) is not None


def test_json_payload_errors_name_where_and_why() -> None:
    check = validator_for(build_definition(SchemaType.JSON_SCHEMA, json_schema(
        {"a": {"type": "string"}, "b": {"type": "array", "items": {"type": "integer"}}}, ["c"])))
    found = check(b'{"a": 1, "b": [1, "x"]}')
    assert found is not None and found.startswith("JSON Schema validation failed: ")
    assert '$.a: 1 is not of type "string"' in found and '$.b[1]: "x" is not of type "integer"' in found
    assert '"c" is a required property' in found
    assert check(b'{"c": 1, "b": [1, 2]}') is None


def test_avro_payloads_are_decoded_by_the_schema() -> None:
    check = validator_for(build_definition(SchemaType.AVRO, json.dumps(
        {"type": "record", "name": "R", "fields": [
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
            {"name": "m", "type": {"type": "map", "values": "null"}}]}).encode()))
    assert check(_zigzag(1) + _zigzag(0)) is None
    assert check(_zigzag(2) + _zigzag(0)) is not None  # enum index outside the symbols
    assert check(_zigzag(1) + _zigzag(2 ** 40)) is not None  # a map's entries each need a key: ends at EOF


def test_deep_payloads_are_refused_not_fatal() -> None:
    """A recursive Avro schema lets a payload nest as deep as its bytes go: fastavro's C reader overflowed
    the stack at about 10,000 levels and killed the process (found by tests/fuzz). And jsonschema-rs stops
    at its recursion limit with a ValueError, which must be a refusal, not an error of the publish path."""
    linked = validator_for(build_definition(SchemaType.AVRO, json.dumps(
        {"type": "record", "name": "N", "fields": [{"name": "next", "type": ["null", "N"]}]}).encode()))
    assert linked(b"\x02" * 50 + b"\x00") is None
    assert linked(b"\x02" * 50) is not None  # truncated
    refused = linked(b"\x02" * 100_000 + b"\x00")
    assert refused is not None and "nested too deeply" in refused
    deep = validator_for(build_definition(SchemaType.JSON_SCHEMA, json.dumps(
        {"anyOf": [{"type": "array", "items": {"$ref": "#"}}, {"type": "integer"}]}).encode()))
    found = deep(b'{"a":' * 400 + b"1" + b"}" * 400)
    assert found == "JSON Schema validation failed: Recursion limit reached"
    long = deep(b'{"a":' * 100 + b"1" + b"}" * 100)
    assert long is not None and len(long) < 400  # each reason is clipped: the instance is not echoed whole

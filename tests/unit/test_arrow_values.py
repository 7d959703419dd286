"""danube_fast.schema.arrow_values without Spark: the Arrow type of every row of the Avro and JSON Schema
mapping tables, values decoded from payloads written by fastavro and by hand, an Avro record of an older
version read with the latest, and the exact rows that do not decode (`Decoded.bad`), while a payload that
decodes to null is a value, not a bad row."""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from decimal import Decimal
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from danube_fast.schema.arrow_values import (
    AvroDecoder,
    AvroMapping,
    Decoded,
    JsonDecoder,
    Resolved,
    ValueSchemaError,
    arrow_type,
    decoder_for,
    json_mapping,
)

INNER = {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]}
EVERY_TYPE: dict[str, Any] = {"type": "record", "name": "Every", "namespace": "t", "fields": [
    {"name": "n", "type": "null"},
    {"name": "b", "type": "boolean"},
    {"name": "i", "type": "int"},
    {"name": "l", "type": "long"},
    {"name": "f", "type": "float"},
    {"name": "d", "type": "double"},
    {"name": "by", "type": "bytes"},
    {"name": "fx", "type": {"type": "fixed", "name": "Three", "size": 3}},
    {"name": "s", "type": "string"},
    {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
    {"name": "r", "type": INNER},
    {"name": "a", "type": {"type": "array", "items": ["null", "string"]}},
    {"name": "m", "type": {"type": "map", "values": "long"}},
    {"name": "opt", "type": ["null", "string"], "default": None},
    {"name": "il", "type": ["int", "long"]},
    {"name": "fd", "type": ["null", "float", "double"]},
    {"name": "u", "type": ["null", "int", "string", "Inner"]},
    {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "lts_ms", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
    {"name": "lts_us", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "dec_b", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "dec_f", "type": {"type": "fixed", "name": "D8", "size": 8, "logicalType": "decimal",
                               "precision": 18, "scale": 4}},
    {"name": "t_ms", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "t_us", "type": {"type": "long", "logicalType": "time-micros"}},
    {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
]}
INNER_TYPE = pa.struct([pa.field("x", pa.int32(), False)])
EVERY_TYPE_ARROW = pa.struct([
    pa.field("n", pa.null(), True),
    pa.field("b", pa.bool_(), False),
    pa.field("i", pa.int32(), False),
    pa.field("l", pa.int64(), False),
    pa.field("f", pa.float32(), False),
    pa.field("d", pa.float64(), False),
    pa.field("by", pa.binary(), False),
    pa.field("fx", pa.binary(), False),
    pa.field("s", pa.string(), False),
    pa.field("e", pa.string(), False),
    pa.field("r", INNER_TYPE, False),
    pa.field("a", pa.list_(pa.field("element", pa.string(), True)), False),
    pa.field("m", pa.map_(pa.string(), pa.field("value", pa.int64(), False)), False),
    pa.field("opt", pa.string(), True),
    pa.field("il", pa.int64(), False),
    pa.field("fd", pa.float64(), True),
    pa.field("u", pa.struct([pa.field("member0", pa.int32(), True), pa.field("member1", pa.string(), True),
                             pa.field("member2", INNER_TYPE, True)]), True),
    pa.field("ts_ms", pa.timestamp("us", tz="UTC"), False),
    pa.field("ts_us", pa.timestamp("us", tz="UTC"), False),
    pa.field("lts_ms", pa.timestamp("us"), False),
    pa.field("lts_us", pa.timestamp("us"), False),
    pa.field("day", pa.date32(), False),
    pa.field("dec_b", pa.decimal128(10, 2), False),
    pa.field("dec_f", pa.decimal128(18, 4), False),
    pa.field("t_ms", pa.int32(), False),
    pa.field("t_us", pa.int64(), False),
    pa.field("id", pa.string(), False),
])
ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def every(i: int) -> dict[str, Any]:
    """A record of EVERY_TYPE whose general union takes branch i % 3."""
    return {
        "n": None, "b": i % 2 == 0, "i": -i, "l": 2**40 + i, "f": 0.5 * i, "d": 0.25 * i,
        "by": bytes([i, 255]), "fx": bytes([i, i, i]), "s": f"s{i}", "e": ["RED", "GREEN"][i % 2],
        "r": {"x": i}, "a": ["a", None], "m": {"k": i}, "opt": None if i % 2 else f"o{i}", "il": 2**35 + i,
        "fd": None if i % 2 else 1.5, "u": [7 + i, f"u{i}", {"x": 100 + i}][i % 3],
        "ts_ms": dt.datetime(2024, 5, 1, 12, 0, i, 123_000, tzinfo=dt.UTC),
        "ts_us": dt.datetime(2024, 5, 1, 12, 0, i, 654_321, tzinfo=dt.UTC),
        "lts_ms": dt.datetime(2024, 5, 1, 12, 0, i, 123_000),
        "lts_us": dt.datetime(2024, 5, 1, 12, 0, i, 654_321),
        "day": dt.date(2024, 5, 1 + i), "dec_b": Decimal(f"{i}.{i:02d}"), "dec_f": Decimal(f"-{i}.1234"),
        "t_ms": dt.time(1, 2, 3, 456_000), "t_us": dt.time(1, 2, 3, 456_789), "id": ID,
    }


def every_row(i: int) -> dict[str, Any]:
    """What the decoded array holds for every(i): a map is (key, value) pairs, a general union names its
    branch, times of day are ms or us after midnight, a uuid is its text."""
    row = every(i)
    row["m"] = list(row["m"].items())
    row["u"] = {f"member{m}": row["u"] if m == i % 3 else None for m in range(3)}
    row["t_ms"], row["t_us"] = 3_723_456, 3_723_456_789
    row["id"] = str(ID)
    return row


def avro_bytes(schema: Any, record: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def batch(payloads: list[bytes | None], schema_id: int | None = None,
          version: int | None = None) -> pa.RecordBatch:
    n = len(payloads)
    return pa.RecordBatch.from_pydict({"value": pa.array(payloads, pa.binary()),
                                       "schema_id": pa.array([schema_id] * n, pa.int64()),
                                       "schema_version": pa.array([version] * n, pa.int64())})


def avro(*versions: Any, schema_id: int = 5) -> Resolved:
    return Resolved("avro", "s", schema_id, len(versions),
                    {v: json.dumps(d) for v, d in enumerate(versions, start=1)})


def json_subject(schema: Any) -> Resolved:
    return Resolved("json", "j", 1, 1, {1: json.dumps(schema)})


def bad_rows(decoded: Decoded) -> list[int]:
    assert decoded.bad.type == pa.int64() and decoded.bad.null_count == 0
    assert decoded.failed == len(decoded.bad)
    return list(decoded.bad.to_pylist())


# -- the mapping ---------------------------------------------------------------------------------------------


def test_every_avro_type_has_its_arrow_type() -> None:
    assert AvroMapping(EVERY_TYPE).type == EVERY_TYPE_ARROW
    assert arrow_type(avro(EVERY_TYPE)) == EVERY_TYPE_ARROW


@pytest.mark.parametrize(("schema", "expected"), [
    ("null", pa.null()),
    (["null", "int", "long"], pa.int64()),
    (["float", "double"], pa.float64()),
    ({"type": "array", "items": "int"}, pa.list_(pa.field("element", pa.int32(), False))),
    ({"type": "map", "values": ["null", "string"]},
     pa.map_(pa.string(), pa.field("value", pa.string(), True))),
    ({"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 0}, pa.decimal128(38, 0)),
    ({"type": "string", "logicalType": "unknown-to-fastavro"}, pa.string()),
])
def test_avro_mapping(schema: Any, expected: pa.DataType) -> None:
    assert AvroMapping(schema).type == expected


@pytest.mark.parametrize(("schema", "words"), [
    ({"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]},
     "contains itself"),
    ({"type": "bytes", "logicalType": "decimal", "precision": 39, "scale": 0}, "precision 39"),
    ({"type": "record", "name": "R", "fields": [{"name": "x", "type": "Nowhere"}]}, "fastavro can read"),
])
def test_avro_schemas_without_an_arrow_type(schema: Any, words: str) -> None:
    with pytest.raises(ValueSchemaError, match=words):
        AvroMapping(schema)
    assert issubclass(ValueSchemaError, ValueError)


PEOPLE: dict[str, Any] = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "height": {"type": "number"},
    "admin": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                 "zip": {"type": ["string", "null"]}}},
    "extra": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}
PEOPLE_ARROW = pa.struct([
    pa.field("name", pa.string()), pa.field("age", pa.int64()), pa.field("height", pa.float64()),
    pa.field("admin", pa.bool_()), pa.field("tags", pa.list_(pa.field("element", pa.string(), True))),
    pa.field("address", pa.struct([pa.field("city", pa.string()), pa.field("zip", pa.string())])),
    pa.field("extra", pa.string())])


def test_json_schema_arrow_types() -> None:
    mapped, _convert, raw = json_mapping(PEOPLE)
    assert mapped == PEOPLE_ARROW and raw, "extra has no Arrow type: raw JSON text"
    assert arrow_type(json_subject(PEOPLE)) == PEOPLE_ARROW
    assert json_mapping({"type": ["null", "integer"]})[0] == pa.int64()
    assert json_mapping({"type": "object"})[0] == pa.string()
    assert json_mapping(True)[0] == pa.string()


# -- Avro decoding -------------------------------------------------------------------------------------------


def test_avro_values_of_every_type() -> None:
    resolved = avro(EVERY_TYPE)
    decoder = AvroDecoder(resolved, arrow_type(resolved))
    decoded = decoder.decode(batch([avro_bytes(EVERY_TYPE, every(i)) for i in range(4)], 5, 1))
    assert bad_rows(decoded) == [] and decoded.reason is None
    assert decoded.values.type == EVERY_TYPE_ARROW
    assert decoded.values.to_pylist() == [every_row(i) for i in range(4)]


V1: dict[str, Any] = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}}]}
V2: dict[str, Any] = {**V1, "fields": [*V1["fields"],
                                       {"name": "channel", "type": "string", "default": "web"}]}


def test_an_older_avro_version_is_read_with_the_latest() -> None:
    resolved = avro(V1, V2)
    decoder = AvroDecoder(resolved, arrow_type(resolved))
    old = avro_bytes(V1, {"id": 1, "amount": Decimal("1.50")})
    new = avro_bytes(V2, {"id": 2, "amount": Decimal("2.50"), "channel": "app"})
    decoded = decoder.decode(pa.RecordBatch.from_pydict({
        "value": pa.array([old, new, new], pa.binary()),
        "schema_id": pa.array([5, 5, None], pa.int64()),
        "schema_version": pa.array([1, 2, None], pa.int64())}))
    assert bad_rows(decoded) == []
    assert decoded.values.to_pylist() == [{"id": 1, "amount": Decimal("1.50"), "channel": "web"},
                                          {"id": 2, "amount": Decimal("2.50"), "channel": "app"},
                                          {"id": 2, "amount": Decimal("2.50"), "channel": "app"}]


def test_avro_rows_that_do_not_decode_are_named() -> None:
    resolved = avro(V1, V2)
    decoder = AvroDecoder(resolved, arrow_type(resolved))
    good = avro_bytes(V2, {"id": 3, "amount": Decimal("3.00"), "channel": "x"})
    # The unscaled value 12345678 is 123456.78: eight digits where decimal(6, 2) holds six.
    too_wide = avro_bytes({"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"}, {"name": "amount", "type": "bytes"},
        {"name": "channel", "type": "string"}]}, {"id": 4, "amount": (12345678).to_bytes(4, "big"),
                                                  "channel": "y"})
    payloads: list[bytes | None] = [good, good[:-2], good, b"\xff\xff\xff", good + b"\x00", too_wide, good]
    decoded = decoder.decode(batch(payloads, 5, 2))
    assert bad_rows(decoded) == [1, 3, 4, 5], decoded.reason
    assert [None if v is None else v["id"] for v in decoded.values.to_pylist()] == [3, None, 3, None, None,
                                                                                      None, 3]
    assert decoded.values.type == decoder.type
    good_rows = batch(payloads, 5, 2).take(pa.array([0, 2, 6]))
    assert decoder.decode(good_rows).failed == 0

    assert bad_rows(decoder.decode(batch([good, good], 6, 2))) == [0, 1], "another subject's schema id"
    assert bad_rows(decoder.decode(batch([good], 5, 9))) == [0], "a version the subject did not have"


def test_a_value_the_arrow_type_cannot_hold_is_bad_alone() -> None:
    resolved = avro({"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2})
    decoder = AvroDecoder(resolved, arrow_type(resolved))
    payloads = [avro_bytes("bytes", n.to_bytes(3, "big", signed=True)) for n in (1234, 123456, -9999, 10000)]
    decoded = decoder.decode(batch(payloads))
    assert bad_rows(decoded) == [1, 3] and "ArrowInvalid" in (decoded.reason or ""), decoded.reason
    assert decoded.values.to_pylist() == [Decimal("12.34"), None, Decimal("-99.99"), None]


def test_an_avro_null_is_a_value_not_a_bad_row() -> None:
    resolved = avro(["null", "string"])
    decoded = AvroDecoder(resolved, arrow_type(resolved)).decode(batch([b"\x00", b"\x02\x06abc", b"\x04"]))
    assert decoded.values.to_pylist() == [None, "abc", None]
    assert bad_rows(decoded) == [2], "branch 2 does not exist"


# -- JSON decoding -------------------------------------------------------------------------------------------


def test_json_rows_that_do_not_decode_are_named() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    decoder = JsonDecoder(json_subject(schema), arrow_type(json_subject(schema)))
    good = b'{"name": "n", "age": 1}'
    bad = {3: b"garbage", 8: b'{"age": "one"}', 9: b'{"age": 1}{"age": 2}', 20: b"", 31: b"[1]"}
    payloads: list[bytes | None] = [bad.get(i, good) for i in range(33)]
    payloads[12] = b"null"
    decoded = decoder.decode(batch(payloads))
    assert bad_rows(decoded) == sorted(bad), decoded.reason
    names = [None if v is None else v["name"] for v in decoded.values.to_pylist()]
    assert names == [None if i in bad or i == 12 else "n" for i in range(33)]
    assert decoded.values.type == decoder.type


def test_json_with_raw_text_parts_is_read_per_record() -> None:
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "any": {}}}
    resolved = json_subject(schema)
    decoded = decoder_for(resolved.to_json(), arrow_type(resolved)).decode(batch(
        [b'{"id": 1, "any": [1, "a"]}', b'{"id": "x"}', b"null", b"{", b'{"id": 2}']))
    assert decoded.values.to_pylist() == [{"id": 1, "any": '[1,"a"]'}, None, None, None,
                                          {"id": 2, "any": None}]
    assert bad_rows(decoded) == [1, 3]


def test_decoders_are_cached_by_subject_and_type() -> None:
    resolved = avro(V1, V2)
    one = decoder_for(resolved.to_json(), arrow_type(resolved))
    assert isinstance(one, AvroDecoder) and one is decoder_for(resolved.to_json(), arrow_type(resolved))
    assert isinstance(decoder_for(json_subject(PEOPLE).to_json(), PEOPLE_ARROW), JsonDecoder)

"""`valueFormat=avro|json`: the `value` column decoded with the topic's registered schema. Schemas are
registered and records produced through the official client (producers with a schema subject, one pinned to
an older version), then read back in local[2] with every field's value and Spark type checked; the mapping
and the decoders are also checked on their own (failures counted, the JSON bisection), and the errors before
any task runs (no subject, different subjects, a subject of the other kind)."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import io
import json
from decimal import Decimal
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from danube import SchemaType
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_type
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)
from pyspark_danube import values
from spark_support import produce_fast, reader_options

from danube_fast.schema import arrow_values
from danube_fast.testing.broker import Broker
from tests.compat.compat_support import Session, send_all

pytestmark = pytest.mark.spark

BROKER_CONFIG = """
[cluster]
upload_interval_ms = 200
"""
AVRO, AVRO_SUBJECT = "/default/avro_orders", "spark-avro-orders"
PEOPLE, PEOPLE_SUBJECT = "/default/json_people", "spark-json-people"
LOOSE, LOOSE_SUBJECT = "/default/json_loose", "spark-json-loose"
PLAIN = "/default/plain_values"

ADDRESS = {"type": "record", "name": "Address", "fields": [
    {"name": "street", "type": "string"},
    {"name": "zip", "type": ["null", "int"], "default": None}]}
ORDER_V1: dict[str, Any] = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "price", "type": "double"},
    {"name": "qty", "type": "int"},
    {"name": "paid", "type": "boolean"},
    {"name": "score", "type": "float"},
    {"name": "raw", "type": "bytes"},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["NEW", "PAID", "SHIPPED"]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "counts", "type": {"type": "map", "values": "long"}},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "ship_to", "type": ["null", ADDRESS], "default": None},
    {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
        {"name": "sku", "type": "string"}, {"name": "n", "type": "int"}]}}},
    {"name": "choice", "type": ["null", "int", "string", "Address"], "default": None},
    {"name": "big", "type": ["int", "long"]},
    {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
]}
ORDER_V2 = copy.deepcopy(ORDER_V1)  # backward compatible: one more field, with a default
ORDER_V2["fields"].append({"name": "channel", "type": "string", "default": "web"})

ADDRESS_TYPE = StructType([StructField("street", StringType(), False),
                           StructField("zip", IntegerType(), True)])
ORDER_TYPE = StructType([  # what spark-avro's SchemaConverters makes of ORDER_V2
    StructField("id", LongType(), False),
    StructField("name", StringType(), False),
    StructField("price", DoubleType(), False),
    StructField("qty", IntegerType(), False),
    StructField("paid", BooleanType(), False),
    StructField("score", FloatType(), False),
    StructField("raw", BinaryType(), False),
    StructField("kind", StringType(), False),
    StructField("tags", ArrayType(StringType(), False), False),
    StructField("counts", MapType(StringType(), LongType(), False), False),
    StructField("note", StringType(), True),
    StructField("ship_to", ADDRESS_TYPE, True),
    StructField("lines", ArrayType(StructType([StructField("sku", StringType(), False),
                                               StructField("n", IntegerType(), False)]), False), False),
    StructField("choice", StructType([StructField("member0", IntegerType(), True),
                                      StructField("member1", StringType(), True),
                                      StructField("member2", ADDRESS_TYPE, True)]), True),
    StructField("big", LongType(), False),
    StructField("hash", BinaryType(), False),
    StructField("at", TimestampType(), False),
    StructField("at_us", TimestampType(), False),
    StructField("day", DateType(), False),
    StructField("amount", DecimalType(10, 2), False),
    StructField("channel", StringType(), False),
])

PEOPLE_SCHEMA = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "height": {"type": "number"},
    "admin": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                 "zip": {"type": ["string", "null"]}}},
    "nick": {"type": ["string", "null"]}}}
PEOPLE_TYPE = StructType([
    StructField("name", StringType(), True), StructField("age", LongType(), True),
    StructField("height", DoubleType(), True), StructField("admin", BooleanType(), True),
    StructField("tags", ArrayType(StringType(), True), True),
    StructField("address", StructType([StructField("city", StringType(), True),
                                       StructField("zip", StringType(), True)]), True),
    StructField("nick", StringType(), True)])
LOOSE_SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer"}, "any": {}, "either": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    "items": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "object"}]}}}}
LOOSE_TYPE = StructType([StructField("id", LongType(), True), StructField("any", StringType(), True),
                         StructField("either", StringType(), True),
                         StructField("items", ArrayType(StringType(), True), True)])

UTC = dt.UTC


def order(i: int, **changes: Any) -> dict[str, Any]:
    """An Order (v1 fields) with values that differ per record and cover every branch of its unions."""
    choices: list[Any] = [None, 7 + i, f"pick-{i}", {"street": f"choice st {i}", "zip": None}]
    record = {
        "id": 1000 + i, "name": f"order-{i}", "price": 2.5 * i, "qty": i - 2, "paid": i % 2 == 0,
        "score": 0.25 * i, "raw": bytes([i, 0, 255]), "kind": ["NEW", "PAID", "SHIPPED"][i % 3],
        "tags": [f"t{j}" for j in range(i % 3)], "counts": {f"k{j}": j * i for j in range(i % 3 + 1)},
        "note": None if i % 2 else f"note {i}",
        "ship_to": {"street": f"{i} Main St", "zip": 10_000 + i} if i % 2 == 0 else None,
        "lines": [{"sku": f"sku-{i}-{j}", "n": j} for j in range(i % 4)],
        "choice": choices[i % 4], "big": 2**40 + i if i % 2 else i,
        "hash": bytes([i, i, i, i]),
        "at": dt.datetime(2024, 5, 1, 12, 0, i, 123_000, tzinfo=UTC),
        "at_us": dt.datetime(2024, 5, 1, 12, 0, i, 654_321, tzinfo=UTC),
        "day": dt.date(2024, 5, 1 + i), "amount": Decimal(f"{i}.{i:02d}"),
    }
    record.update(changes)
    return record


def avro_bytes(schema: Any, record: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def spark_row(record: dict[str, Any]) -> dict[str, Any]:
    """What `row.value.asDict(recursive=True)` holds for `record`: Spark's timestamps are naive (the tests'
    session time zone is UTC), a union read as a struct names its branch."""
    row = dict(record)
    for name in ("at", "at_us"):
        row[name] = row[name].astimezone(UTC).replace(tzinfo=None)
    choice = row["choice"]
    if choice is not None:
        member = 0 if isinstance(choice, int) else 1 if isinstance(choice, str) else 2
        row["choice"] = {f"member{m}": choice if m == member else None for m in range(3)}
    return row


async def schema_producer(s: Session, topic: str, name: str, subject: str, version: int | None = None) -> Any:
    """A Reliable producer stamping its messages with `subject` (its latest version, or `version`)."""
    return await s.producer(topic, name, reliable=True, subject=subject, version=version)


OLD, NEW = 3, 4  # Avro records written with version 1, then with version 2
BAD_AVRO = b"\xff\xff\xff"  # a varint that never ends: not an Order
PEOPLE_PAYLOADS = [
    json.dumps({"name": "Ann", "age": 41, "height": 1.68, "admin": True, "tags": ["a", "b"],
                "address": {"city": "Oslo", "zip": "0150", "country": "NO"}, "nick": None},
               indent=2).encode(),  # pretty: newlines between the tokens
    b'{"name": "Bo\\nLine", "age": 7, "height": 2, "unknown": {"deep": [1]}}\r\n',
    b'{"name": "Cy", "age": "seven"}',  # a string where an integer belongs: null
    b"",  # not JSON: null
    b'{"name": "Di", "tags": [], "address": {"city": null}}',
]
PEOPLE_ROWS = [
    {"name": "Ann", "age": 41, "height": 1.68, "admin": True, "tags": ["a", "b"],
     "address": {"city": "Oslo", "zip": "0150"}, "nick": None},
    {"name": "Bo\nLine", "age": 7, "height": 2.0, "admin": None, "tags": None, "address": None, "nick": None},
    None,
    None,
    {"name": "Di", "age": None, "height": None, "admin": None, "tags": [],
     "address": {"city": None, "zip": None}, "nick": None},
]
LOOSE_PAYLOADS = [
    b'{"id": 1, "any": {"x": [1, 2.5, "s"]}, "either": "text", "items": ["a", {"b": 2}]}',
    b'{"id": 2, "any": 3, "either": 4, "items": []}',
    b'{"id": "two"}',
    b'{"id": 3}',
]
LOOSE_ROWS = [
    {"id": 1, "any": '{"x":[1,2.5,"s"]}', "either": '"text"', "items": ['"a"', '{"b":2}']},
    {"id": 2, "any": "3", "either": "4", "items": []},
    None,
    {"id": 3, "any": None, "either": None, "items": None},
]


@pytest.fixture(scope="module")
def data(shared_broker: Broker) -> dict[str, Any]:
    async def produce() -> dict[str, Any]:
        async with Session(shared_broker.url) as s:
            schema_id = await s.register_schema(AVRO_SUBJECT, SchemaType.AVRO, ORDER_V1)
            v1 = await schema_producer(s, AVRO, "orders-v1", AVRO_SUBJECT, version=1)
            old = [order(i) for i in range(OLD)]
            await send_all(v1, [avro_bytes(ORDER_V1, r) for r in old])
            assert await s.register_schema(AVRO_SUBJECT, SchemaType.AVRO, ORDER_V2) == schema_id
            v2 = await schema_producer(s, AVRO, "orders-v2", AVRO_SUBJECT)
            new = [order(i, channel=f"ch-{i}") for i in range(OLD, OLD + NEW)]
            await send_all(v2, [avro_bytes(ORDER_V2, r) for r in new])
            await send_all(v2, [BAD_AVRO])

            await s.register_schema(PEOPLE_SUBJECT, SchemaType.JSON_SCHEMA, PEOPLE_SCHEMA)
            await send_all(await schema_producer(s, PEOPLE, "people", PEOPLE_SUBJECT), PEOPLE_PAYLOADS)
            await s.register_schema(LOOSE_SUBJECT, SchemaType.JSON_SCHEMA, LOOSE_SCHEMA)
            await send_all(await schema_producer(s, LOOSE, "loose", LOOSE_SUBJECT), LOOSE_PAYLOADS)
            return {"schema_id": schema_id, "orders": [{**r, "channel": "web"} for r in old] + new}

    produced = asyncio.run(produce())
    asyncio.run(produce_fast(shared_broker, PLAIN, 10))
    return produced


def load(spark: SparkSession, broker: Broker, **options: str) -> DataFrame:
    return spark.read.format("danube").options(**reader_options(broker, **options)).load()


def test_avro_values_of_every_type_and_of_an_older_version(spark: SparkSession, broker: Broker,
                                                           data: dict[str, Any]) -> None:
    df = load(spark, broker, topic=AVRO, valueFormat="avro")
    value = df.schema["value"]
    assert value.dataType == ORDER_TYPE, value.dataType.simpleString()
    assert value.nullable
    rows = df.orderBy("offset").collect()
    assert len(rows) == OLD + NEW + 1
    for i, (row, sent) in enumerate(zip(rows, data["orders"], strict=False)):
        assert (row.offset, row.schema_id, row.schema_version) == (i, data["schema_id"], 1 if i < OLD else 2)
        assert row.value.asDict(recursive=True) == spark_row(sent), i
    assert rows[0].value.channel == "web", "a version 1 record gets version 2's default"
    bad = rows[-1]
    assert bad.value is None and bytes(load(spark, broker, topic=AVRO).where(
        f"offset = {bad.offset}").collect()[0].value) == BAD_AVRO, "a value that does not decode is null"
    assert df.where("value.kind = 'PAID'").count() == sum(1 for r in data["orders"] if r["kind"] == "PAID")


def test_json_values_read_batch_wise(spark: SparkSession, broker: Broker, data: dict[str, Any]) -> None:
    df = load(spark, broker, topic=PEOPLE, valueFormat="json")
    assert df.schema["value"].dataType == PEOPLE_TYPE, df.schema["value"].dataType.simpleString()
    rows = df.orderBy("offset").collect()
    got = [None if r.value is None else r.value.asDict(recursive=True) for r in rows]
    assert got == PEOPLE_ROWS
    assert [r.schema_version for r in rows] == [1] * len(PEOPLE_PAYLOADS)


def test_json_parts_without_a_spark_type_are_json_text(spark: SparkSession, broker: Broker,
                                                       data: dict[str, Any]) -> None:
    df = load(spark, broker, topic=LOOSE, valueFormat="JSON")
    assert df.schema["value"].dataType == LOOSE_TYPE, df.schema["value"].dataType.simpleString()
    got = [None if r.value is None else r.value.asDict(recursive=True)
           for r in df.orderBy("offset").collect()]
    assert got == LOOSE_ROWS


@pytest.mark.parametrize(("options", "words"), [
    ({"topic": PLAIN, "valueFormat": "avro"}, [PLAIN, "no schema subject", "valueFormat=binary"]),
    ({"topics": f"{AVRO},{PEOPLE}", "valueFormat": "json"},
     [AVRO, PEOPLE, AVRO_SUBJECT, PEOPLE_SUBJECT, "share a schema subject"]),
    ({"topic": AVRO, "valueFormat": "json"}, [AVRO, AVRO_SUBJECT, "holds avro", "valueFormat=avro"]),
    ({"topic": PEOPLE, "valueFormat": "avro"}, [PEOPLE_SUBJECT, "holds json_schema", "valueFormat=json"]),
    ({"topic": AVRO, "valueFormat": "protobuf"}, ["valueFormat", "binary, avro or json"]),
])
def test_a_value_format_that_cannot_apply_fails_before_any_task(
        spark: SparkSession, broker: Broker, data: dict[str, Any], options: dict[str, str],
        words: list[str]) -> None:
    with pytest.raises((PySparkException, Py4JJavaError)) as raised:
        load(spark, broker, **options).count()
    text = str(raised.value).lower()
    assert all(w.lower() in text for w in words), text[:3000]


# -- the mapping and the decoders, without Spark ------------------------------------------------------------


def arrow(spark_type: DataType) -> pa.DataType:
    return to_arrow_type(spark_type, timezone="UTC")


def batch(payloads: list[bytes], schema_id: int | None = None, version: int | None = None) -> pa.RecordBatch:
    n = len(payloads)
    return pa.RecordBatch.from_pydict({"value": pa.array(payloads, pa.binary()),
                                       "schema_id": pa.array([schema_id] * n, pa.int64()),
                                       "schema_version": pa.array([version] * n, pa.int64())})


@pytest.mark.parametrize(("schema", "expected"), [
    (["null", "int", "long"], LongType()),
    (["float", "double"], DoubleType()),
    ({"type": "array", "items": ["null", "string"]}, ArrayType(StringType(), True)),
    ({"type": "map", "values": {"type": "long", "logicalType": "local-timestamp-micros"}},
     MapType(StringType(), TimestampNTZType(), False)),
    ({"type": "int", "logicalType": "time-millis"}, IntegerType()),
    ({"type": "string", "logicalType": "uuid"}, StringType()),
    ({"type": "fixed", "name": "D", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 4},
     DecimalType(18, 4)),
    ({"type": "enum", "name": "E", "symbols": ["A"]}, StringType()),
    ("string", StringType()),
])
def test_avro_mapping(schema: Any, expected: DataType) -> None:
    assert from_arrow_type(arrow_values.AvroMapping(schema).type) == expected


@pytest.mark.parametrize(("fmt", "definition", "expected"), [
    ("avro", ORDER_V2, ORDER_TYPE), ("json", PEOPLE_SCHEMA, PEOPLE_TYPE), ("json", LOOSE_SCHEMA, LOOSE_TYPE)])
def test_the_spark_type_is_the_arrow_type_converted(fmt: str, definition: Any, expected: DataType) -> None:
    """Spark hands the decoders its Arrow form of the column's type: the very type the decoders map to."""
    resolved = arrow_values.Resolved(fmt, "s", 1, 1, {1: json.dumps(definition)})
    assert values.value_type(resolved) == expected
    assert arrow(expected) == arrow_values.arrow_type(resolved)


def test_avro_types_spark_cannot_hold_fail_resolution() -> None:
    with pytest.raises(arrow_values.ValueSchemaError, match="contains itself"):
        arrow_values.AvroMapping({"type": "record", "name": "Node", "fields": [
            {"name": "next", "type": ["null", "Node"]}]})
    with pytest.raises(arrow_values.ValueSchemaError, match="precision"):
        arrow_values.AvroMapping({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 0})


def test_avro_decoder_counts_what_does_not_decode() -> None:
    resolved = arrow_values.Resolved("avro", "s", 5, 2, {1: json.dumps(ORDER_V1), 2: json.dumps(ORDER_V2)})
    decoder = arrow_values.AvroDecoder(resolved, arrow(values.value_type(resolved)))
    good_v1, good_v2 = avro_bytes(ORDER_V1, order(1)), avro_bytes(ORDER_V2, order(2, channel="x"))
    cases = [
        (batch([good_v1], 5, 1), ["web"]),
        (batch([good_v2], None, None), ["x"]),  # no schema id: written with the latest
        (batch([good_v2 + b"\x00", BAD_AVRO, good_v2], 5, 2), [None, None, "x"]),  # bytes left over
        (batch([good_v2], 6, 2), [None]),  # another subject's id
        (batch([good_v1], 5, 9), [None]),  # a version the subject did not have
    ]
    for b, channels in cases:
        decoded = decoder.decode(b)
        got = [None if v is None else v["channel"] for v in decoded.values.to_pylist()]
        assert got == channels and decoded.failed == channels.count(None), (got, decoded.reason)
        assert decoded.values.type == decoder.type


def test_json_decoder_bisects_to_the_bad_values() -> None:
    resolved = arrow_values.Resolved("json", "p", 1, 1, {1: json.dumps(PEOPLE_SCHEMA)})
    decoder = arrow_values.JsonDecoder(resolved, arrow(PEOPLE_TYPE))
    good = b'{"name": "n", "age": 1}'
    bad = [b"", b"{", b'{"age": 1.5}', b'{"age": 1}{"age": 2}', b"[1]", b'{"name": "\xff"}', b"7"]
    payloads = [good] * 40
    for i, b in enumerate(bad):
        payloads[3 + 5 * i] = b
    decoded = decoder.decode(batch(payloads))
    assert decoded.failed == len(bad), decoded.reason
    names = [None if v is None else v["name"] for v in decoded.values.to_pylist()]
    assert names == [None if p in bad else "n" for p in payloads]
    assert decoder.decode(batch([b"null"])).values.to_pylist() == [None]
    assert decoder.decode(batch([b"null"])).failed == 0, "a JSON null is a null value, not a failure"


@pytest.mark.parametrize(("schema", "expected"), [
    ({"type": "integer"}, LongType()),
    ({"type": ["null", "number"]}, DoubleType()),
    ({"type": ["string", "integer"]}, StringType()),
    ({"type": "object"}, StringType()),
    ({"type": "array", "items": [{"type": "string"}]}, StringType()),
    ({"type": "string", "oneOf": [{"maxLength": 3}]}, StringType()),
    (True, StringType()),
])
def test_json_mapping(schema: Any, expected: DataType) -> None:
    assert from_arrow_type(arrow_values.json_mapping(schema)[0]) == expected


def test_a_json_schema_without_a_spark_type_keeps_the_payload_text() -> None:
    resolved = arrow_values.Resolved("json", "p", 1, 1, {1: json.dumps({"anyOf": [{"type": "string"}]})})
    decoded = arrow_values.JsonDecoder(resolved, pa.string()).decode(batch([b' {"a": 1} ', b"nope", b"null"]))
    assert decoded.values.to_pylist() == [' {"a": 1} ', None, None] and decoded.failed == 1

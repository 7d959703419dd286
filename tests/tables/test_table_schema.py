"""Table mode schema on a real standalone broker (docs/TABLES.md, "Schema mode"): records produced through the
official client with a registered Avro (or JSON Schema) subject become typed columns; a newer version's added
field becomes a new column while the writer runs; a record that does not decode goes whole to the
`<topic>__dlq` table and is counted; pyiceberg and DuckDB read the same rows; a topic without a subject, and a
table of the other mode, say why they wait."""

from __future__ import annotations

import asyncio
import copy
import io
from typing import Any

import fastavro
import pyarrow as pa
from danube import SchemaType

from danube_fast.tables.catalog import open_catalog
from danube_fast.testing.broker import Broker, BrokerFactory
from tests.compat.compat_support import Session, scrape, send_all
from tests.tables.test_table_broker import CONFIG, admin, catalog_of, caught_up, duckdb_count, produce, until

ORDER_V1: dict[str, Any] = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"},
    {"name": "offset", "type": "int"},  # an envelope column's name: the column is value_offset
    {"name": "price", "type": "double"},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "ship_to", "type": ["null", {"type": "record", "name": "Address", "fields": [
        {"name": "city", "type": "string"}]}], "default": None},
]}
ORDER_V2 = copy.deepcopy(ORDER_V1)  # one more field, with a default
ORDER_V2["fields"].append({"name": "channel", "type": "string", "default": "web"})
BAD_AVRO = b"\xff\xff\xff"  # a varint that never ends: not an Order

PEOPLE_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}


def avro(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def order(i: int, **more: Any) -> dict[str, Any]:
    return {"id": i, "offset": -i, "price": i * 1.5, "tags": [f"t{i}"] * (i % 3),
            "ship_to": {"city": f"c{i}"} if i % 2 else None, **more}


async def send(s: Session, topic: str, name: str, subject: str, payloads: list[bytes]) -> None:
    await send_all(await s.producer(topic, name, reliable=True, subject=subject), payloads)


def scan(broker: Broker, table: str) -> pa.Table:
    cat = open_catalog(catalog_of(broker), read_only=True)
    return cat.load_table(tuple(table.split("."))).scan().to_arrow().sort_by("offset")


def status_row(broker: Broker, topic: str) -> dict[str, Any]:
    row: dict[str, Any] = admin(broker, "tables", "status", topic)["tables"][0]
    return row


def test_avro_records_become_typed_columns_a_new_version_adds_one_and_bad_records_go_to_the_dlq(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(CONFIG)
    topic, subject = "/default/orders", "table-orders"

    async def first() -> None:
        async with Session(broker.url) as s:
            await s.register_schema(subject, SchemaType.AVRO, ORDER_V1)
            await send(s, topic, "v1", subject, [avro(ORDER_V1, order(i)) for i in range(4)])

    asyncio.run(first())
    admin(broker, "policies", "set", topic, "--table", "schema")
    until("the v1 records", lambda: caught_up(broker, topic, 4))
    rows = scan(broker, "default.orders")
    assert "value" not in rows.column_names and "channel" not in rows.column_names
    assert rows.column("value_offset").to_pylist() == [0, -1, -2, -3]
    assert rows.column("tags").to_pylist() == [[], ["t1"], ["t2", "t2"], []]
    assert rows.column("ship_to").to_pylist() == [None, {"city": "c1"}, None, {"city": "c3"}]
    assert rows.column("offset").to_pylist() == [0, 1, 2, 3] and rows.column("topic")[0].as_py() == topic

    async def second() -> None:  # while the writer runs: a new version, its records, and one that is garbage
        async with Session(broker.url) as s:
            await s.register_schema(subject, SchemaType.AVRO, ORDER_V2)
            await send(s, topic, "v2", subject, [avro(ORDER_V2, order(i, channel=f"ch{i}")) for i in (4, 5)] +
                       [BAD_AVRO, avro(ORDER_V2, order(7, channel="last"))])

    asyncio.run(second())
    status = until("the v2 records", lambda: caught_up(broker, topic, 8))
    rows = scan(broker, "default.orders")
    assert rows.column("offset").to_pylist() == [0, 1, 2, 3, 4, 5, 7]  # 6 did not decode
    assert rows.column("channel").to_pylist() == [None] * 4 + ["ch4", "ch5", "last"]
    assert rows.column("id").to_pylist() == [0, 1, 2, 3, 4, 5, 7]
    assert rows.column("schema_version").to_pylist() == [1] * 4 + [2] * 3
    dead = scan(broker, "default.orders__dlq")
    assert dead.column("offset").to_pylist() == [6] and dead.column("value").to_pylist() == [BAD_AVRO]
    assert dead.column("schema_version").to_pylist() == [2]
    row = status["tables"][0]
    assert row["mode"] == "schema" and row["dlq_records"] == 1 and row["error"] == ""
    assert scrape(broker)[f'danube_table_dlq_records_total{{topic="{topic}"}}'] == 1
    assert duckdb_count(row["metadata_location"])[:2] == (7, 7)


def test_json_schema_records_and_the_ones_that_do_not_fit(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(CONFIG + '[policy]\ntable_mode = "schema"\n')
    topic, subject = "/default/people", "table-people"
    payloads = [b'{"name": "Ann", "age": 41}', b'{"name": "Bo", "age": "seven"}', b"not json",
                b'{"name": "Cy"}']

    async def run() -> None:
        async with Session(broker.url) as s:
            await s.register_schema(subject, SchemaType.JSON_SCHEMA, PEOPLE_SCHEMA)
            await send(s, topic, "people", subject, payloads)

    asyncio.run(run())
    status = until("the records", lambda: caught_up(broker, topic, 4))
    rows = scan(broker, "default.people")
    assert rows.column("offset").to_pylist() == [0, 3]
    assert rows.column("name").to_pylist() == ["Ann", "Cy"] and rows.column("age").to_pylist() == [41, None]
    dead = scan(broker, "default.people__dlq")
    assert dead.column("offset").to_pylist() == [1, 2] and dead.column("value").to_pylist() == payloads[1:3]
    assert status["tables"][0]["dlq_records"] == 2


def test_a_topic_without_a_subject_and_a_table_of_the_other_mode_say_why_they_wait(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(CONFIG)
    plain, enveloped = "/default/plain", "/default/enveloped"
    produce(broker, plain, 0, 10)
    produce(broker, enveloped, 0, 10)
    admin(broker, "policies", "set", plain, "--table", "schema")
    row = until("the status of the topic without a subject",
                lambda: (r := status_row_or_none(broker, plain)) and r["error"] and r)
    assert "has no schema subject" in row["error"] and row["committed_offset"] == 0
    admin(broker, "policies", "set", enveloped, "--table", "envelope")
    until("the envelope table", lambda: caught_up(broker, enveloped, 10))
    admin(broker, "policies", "set", enveloped, "--table", "schema")
    row = until("the mode mismatch",
                lambda: (r := status_row_or_none(broker, enveloped)) and r["stopped"] and r)
    assert "table mode envelope" in row["stopped"] and "drop the table" in row["stopped"]
    admin(broker, "policies", "set", enveloped, "--table", "envelope")  # back: the table goes on
    produce(broker, enveloped, 10, 5)
    until("the envelope table again", lambda: caught_up(broker, enveloped, 15))


def status_row_or_none(broker: Broker, topic: str) -> dict[str, Any] | None:
    try:
        return status_row(broker, topic)
    except AssertionError:  # no status yet
        return None


def test_a_schema_table_partitioned_by_its_value_fields_waits_for_a_column_it_lacks(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(CONFIG)
    topic, subject = "/default/channels", "table-channels"

    async def orders(first: int, count: int) -> None:
        async with Session(broker.url) as s:
            await s.register_schema(subject, SchemaType.AVRO, ORDER_V2)
            await send(s, topic, f"p{first}", subject, [
                avro(ORDER_V2, order(i, channel=("web", "app")[i % 2])) for i in range(first, first + count)])

    asyncio.run(orders(0, 10))
    shown = admin(broker, "policies", "set", topic, "--table", "schema",
                  "--table-partition-by", "channel,  bucket(2, id)")
    assert shown["tablePartitionBy"] == "channel, bucket(2, id)"  # stored as read
    status = until("the first records", lambda: caught_up(broker, topic, 10))
    assert status["tables"][0]["partitioning"] == "hour, channel, bucket(2, id)"
    table = open_catalog(catalog_of(broker), read_only=True).load_table(("default", "channels"))
    assert [f.name for f in table.spec().fields] == ["timestamp_hour", "channel", "id_bucket_2"]
    tasks = list(table.scan().plan_files())
    assert len({repr(t.file.partition) for t in tasks}) == len(tasks) >= 2
    web = table.scan(row_filter="channel = 'web'").to_arrow()
    assert sorted(web.column("id").to_pylist()) == [0, 2, 4, 6, 8]

    admin(broker, "policies", "set", topic, "--table-partition-by", "region")  # no such field
    asyncio.run(orders(10, 4))
    row = until("the table waiting", lambda: (lambda r: r if "tablePartitionBy names region" in r["error"]
                                              else None)(status_row(broker, topic)))
    assert row["committed_offset"] == 10 and row["stopped"] == "", row
    admin(broker, "policies", "set", topic, "--table-partition-by", "")  # cleared: the hour alone
    status = until("the records after", lambda: caught_up(broker, topic, 14))
    assert status["tables"][0]["partitioning"] == "hour" and status["tables"][0]["error"] == ""
    assert scan(broker, "default.channels").column("id").to_pylist() == list(range(14))
    bad = admin(broker, "policies", "set", topic, "--table-partition-by", "bucket(x)", code=1)
    assert "bucket needs a number from 1" in bad

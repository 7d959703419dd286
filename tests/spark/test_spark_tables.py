"""`read_table` (spark/pyspark_danube/tables.py, docs/TABLES.md) on a real broker, real Iceberg tables and a
real local[2] Spark: the table's snapshot scanned by Spark's Parquet reader plus the records the table lacks
from format("danube") give exactly format("danube")'s rows, column for column, for a plain and a partitioned
topic; filters and SQL work on it; time travel reads one snapshot alone; a topic without a table is refused
by name."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import time
from typing import Any

import fastavro
import pytest
from danube import SchemaType
from pyspark.sql import DataFrame, SparkSession
from pyspark_danube import create_table_view, options, read_table, table_snapshots
from pyspark_danube.tables import TableError, plan_table

from danube_fast.testing.broker import Broker
from tests.compat.compat_support import Session, send_all
from tests.spark.spark_support import produce_fast, produce_rich, reader_options

pytestmark = pytest.mark.spark

BROKER_CONFIG = """
[cluster]
upload_interval_ms = 200
[wal]
segment_bytes = 65536
[tables]
lag_ms = 400
policy_check_ms = 200
"""
PLAIN, PARTS, TYPED = "/default/tplain", "/default/tparts", "/default/ttyped"
SUBJECT = "spark-table-orders"
CLI = [sys.executable, "-m", "danube_fast.cli.main"]
COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "producer_name",
           "attributes", "schema_id", "schema_version"]


def admin(broker: Broker, *args: str) -> Any:
    done = subprocess.run([*CLI, "admin", *args, "--admin-addr", f"127.0.0.1:{broker.admin_port}",
                           "--output", "json"], capture_output=True, timeout=60, check=False)
    return json.loads(done.stdout) if done.returncode == 0 else None


def wait_table(broker: Broker, topic: str, offsets: dict[str, int]) -> None:
    deadline = time.monotonic() + 60
    while True:
        got = admin(broker, "tables", "status", topic)
        held = {t["stored_topic"]: t["committed_offset"] for t in got["tables"]} if got else {}
        if all(held.get(k, -1) >= v for k, v in offsets.items()):
            return
        assert time.monotonic() < deadline, f"{topic}: the table holds {held}, waiting for {offsets}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def data(shared_broker: Broker) -> dict[str, Any]:
    b = shared_broker
    asyncio.run(produce_fast(b, PLAIN, 1500))
    parts = asyncio.run(produce_rich(b, PARTS, 30, partitions=2))
    stored = [PLAIN, f"{PARTS}-part-0", f"{PARTS}-part-1"]  # a policy is per stored topic
    for topic in stored:
        assert admin(b, "policies", "set", topic, "--table", "envelope") is not None
    per_part = {f"{PARTS}-part-{i}": sum(1 for j in range(30) if j % 2 == i) for i in range(2)}
    wait_table(b, PLAIN, {PLAIN: 1500})
    asyncio.run(produce_fast(b, PLAIN, 1500, start=1500))  # a second commit, a second file
    wait_table(b, PLAIN, {PLAIN: 3000})
    wait_table(b, PARTS, {k: 1 for k in per_part})
    asyncio.run(produce_orders(b, ORDER_V1, 1, range(3)))
    assert admin(b, "policies", "set", TYPED, "--table", "schema") is not None
    wait_table(b, TYPED, {TYPED: 3})
    # The table stops following (policy none): what comes next is the tail read_table takes from the broker.
    for topic in [*stored, TYPED]:
        assert admin(b, "policies", "set", topic, "--table", "none") is not None
    deadline = time.monotonic() + 60
    while any(admin(b, "tables", "status", topic) is not None for topic in (PLAIN, PARTS, TYPED)):
        assert time.monotonic() < deadline, "the writer still follows the topics 60 s after tableMode none"
        time.sleep(0.2)
    asyncio.run(produce_fast(b, PLAIN, 500, start=3000))
    asyncio.run(produce_orders(b, ORDER_V2, 2, range(3, 5), bad=True))  # a new version, in the tail only
    return {"parts": parts}


ORDER_V1: dict[str, Any] = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "offset", "type": "int"},  # the column value_offset
    {"name": "tags", "type": {"type": "array", "items": "string"}}]}
ORDER_V2: dict[str, Any] = {**ORDER_V1, "fields": [*ORDER_V1["fields"],
                                                  {"name": "channel", "type": "string", "default": "web"}]}


async def produce_orders(broker: Broker, schema: dict[str, Any], version: int, ids: range,
                         bad: bool = False) -> None:
    """Orders of `ids` written with `schema` (registered as `version` of the subject), and a record that
    is not Avro after them when `bad`."""
    async with Session(broker.url) as s:
        await s.register_schema(SUBJECT, SchemaType.AVRO, schema)
        producer = await s.producer(TYPED, f"orders-v{version}", reliable=True, subject=SUBJECT)
        payloads = []
        for i in ids:
            out = io.BytesIO()
            fastavro.schemaless_writer(out, fastavro.parse_schema(schema), {
                "id": i, "offset": -i, "tags": ["t"] * i, "channel": f"ch{i}"})
            payloads.append(out.getvalue())
        await send_all(producer, payloads + [b"\xff\xff"] * bad)


def rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.select(*COLUMNS).collect()), key=lambda r: (r[3], r[4]))


def test_the_table_and_its_tail_are_exactly_the_topic(spark: SparkSession, shared_broker: Broker,
                                                      data: dict[str, Any]) -> None:
    opts = reader_options(shared_broker)
    table = read_table(spark, PLAIN, **opts)
    direct = spark.read.format("danube").options(**opts).option("topic", PLAIN).load()
    got = rows(table)
    assert [r[4] for r in got] == list(range(3500))
    plan = asyncio.run(plan_table(options.parse({**opts, "topic": PLAIN}), PLAIN))
    assert plan.offsets == {PLAIN: 3000} and plan.committed == {PLAIN: 3500}  # 3,000 from files, 500 tail
    assert got == rows(direct)
    assert [(f.name, f.dataType) for f in table.schema] == [(f.name, f.dataType) for f in direct.schema]


def test_a_partitioned_topic_reads_as_one_table(spark: SparkSession, shared_broker: Broker,
                                                data: dict[str, Any]) -> None:
    opts = reader_options(shared_broker)
    table = read_table(spark, PARTS, **opts)
    direct = spark.read.format("danube").options(**opts).option("topic", PARTS).load()
    got = rows(table)
    assert len(got) == 30 and got == rows(direct)
    assert sorted(r[1] for r in got) == sorted(s["value"] for s in data["parts"])


def test_filters_and_sql_on_the_table(spark: SparkSession, shared_broker: Broker,
                                      data: dict[str, Any]) -> None:
    opts = reader_options(shared_broker)
    df = read_table(spark, PLAIN, **opts)
    assert df.where("offset >= 100 AND offset < 200").count() == 100
    assert df.where("offset >= 2990 AND offset < 3010").count() == 20  # across the table and the tail
    pruned = asyncio.run(plan_table(options.parse({**opts, "topic": PLAIN}), PLAIN, "offset < 100"))
    full = asyncio.run(plan_table(options.parse({**opts, "topic": PLAIN}), PLAIN))
    assert len(pruned.files) == 1 < len(full.files)  # the files past offset 100 are not opened
    for where in ("offset >= 2990 AND offset < 3010", "offset BETWEEN 2990 AND 3009"):  # pruned; Spark's only
        assert read_table(spark, PLAIN, where=where, **opts).count() == 20
    create_table_view(spark, PLAIN, "tplain", **opts)  # a view fixed now: what comes later is not in it
    got = spark.sql("SELECT count(*), count(DISTINCT offset), max(offset) FROM tplain").collect()[0]
    assert tuple(got) == (3500, 3500, 3499)


def test_a_typed_table_and_its_tail_of_a_newer_version(spark: SparkSession, shared_broker: Broker,
                                                       data: dict[str, Any]) -> None:
    opts = reader_options(shared_broker)
    df = read_table(spark, TYPED, **opts)
    assert "value" not in df.columns and {"value_offset", "id", "tags", "channel"} <= set(df.columns)
    got = sorted(df.select("offset", "id", "value_offset", "tags", "channel", "schema_version").collect())
    assert [tuple(r) for r in got] == [
        (0, 0, 0, [], None, 1), (1, 1, -1, ["t"], None, 1), (2, 2, -2, ["t", "t"], None, 1),  # the table
        (3, 3, -3, ["t"] * 3, "ch3", 2), (4, 4, -4, ["t"] * 4, "ch4", 2)]  # the tail; offset 5 is no Order
    plan = asyncio.run(plan_table(options.parse({**opts, "topic": TYPED}), TYPED))
    assert plan.mode == "schema" and plan.value_format == "avro" and plan.offsets == {TYPED: 3}


def test_a_topic_without_a_table_and_row_options_are_refused(spark: SparkSession, shared_broker: Broker,
                                                             data: dict[str, Any]) -> None:
    asyncio.run(produce_fast(shared_broker, "/default/notable", 5))
    opts = reader_options(shared_broker)
    with pytest.raises(TableError, match="/default/notable has no table"):
        read_table(spark, "/default/notable", **opts)
    with pytest.raises(ValueError, match="startingOffsets do not apply"):
        read_table(spark, PLAIN, startingOffsets="earliest", **opts)


def test_time_travel_reads_one_snapshot_alone_by_id_or_time(spark: SparkSession, shared_broker: Broker,
                                                          data: dict[str, Any]) -> None:
    """Each snapshot table_snapshots lists reads back as exactly the offsets its summary says the table
    held, with no tail; by time, the snapshot current then; one the table does not keep is refused."""
    import datetime

    opts = reader_options(shared_broker)
    snapshots = table_snapshots(PLAIN, **opts)
    held = [s["offsets"][PLAIN] for s in snapshots]
    assert held == sorted(held) and held[-1] == 3000 and len(snapshots) >= 2, snapshots  # 2 commits at least
    assert all(s["operation"] == "append" for s in snapshots)
    for snapshot in (snapshots[0], snapshots[-1]):
        df = read_table(spark, PLAIN, snapshotId=str(snapshot["snapshot_id"]), **opts)
        got = sorted(r[0] for r in df.select("offset").collect())
        assert got == list(range(snapshot["offsets"][PLAIN])), snapshot  # the tail's 500 are not in it
        assert snapshot["records"] == len(got)
    first_at = datetime.datetime.fromisoformat(snapshots[0]["committed_at"])
    as_ms = str(int(first_at.timestamp() * 1000))
    assert read_table(spark, PLAIN, asOfTimestamp=as_ms, **opts).count() == held[0]
    now = datetime.datetime.now(datetime.UTC).isoformat()
    assert read_table(spark, PLAIN, asOfTimestamp=now, **opts).count() == 3000  # the newest snapshot, no tail
    assert read_table(spark, PLAIN, **opts).count() == 3500  # without time travel: the tail too
    plan = asyncio.run(plan_table(options.parse({**opts, "topic": PLAIN}), PLAIN, "offset < 100"))
    assert plan.snapshot_id == snapshots[-1]["snapshot_id"] and not plan.pinned

    before = (first_at - datetime.timedelta(hours=1)).isoformat()
    with pytest.raises(TableError, match=r"does not keep a snapshot current at .* the oldest it keeps was"):
        read_table(spark, PLAIN, asOfTimestamp=before, **opts)
    with pytest.raises(TableError, match="does not keep snapshot 12345"):
        read_table(spark, PLAIN, snapshotId="12345", **opts)
    with pytest.raises(ValueError, match="give one of snapshotId and asOfTimestamp, not both"):
        read_table(spark, PLAIN, snapshotId="1", asOfTimestamp=as_ms, **opts)
    with pytest.raises(ValueError, match="ISO 8601 time with its zone"):
        read_table(spark, PLAIN, asOfTimestamp="2026-11-29T10:00:00", **opts)
    with pytest.raises(ValueError, match="snapshotId must be a snapshot's id"):
        read_table(spark, PLAIN, snapshotid="latest", **opts)  # names without case, as Spark's options

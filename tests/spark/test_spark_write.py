"""`df.write.format("danube")` and `writeStream` in local[2] into a real broker, read back with
`spark.read.format("danube")`: every row exactly once with its key and attributes, in each task's order; both
publishers (value alone through FastProducer, records with keys or attributes on a stream of their own);
options, columns and save modes refused before any task; a streaming sink's micro-batches."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from spark_support import reader_options

from danube_fast.testing.broker import Broker
from danube_fast.testing.ports import free_ports

pytestmark = pytest.mark.spark

BROKER_CONFIG = """
[cluster]
upload_interval_ms = 200
"""
ROWS, TASKS = 6000, 4  # 1,500 rows a task: two batches each (writer.BATCH_RECORDS)
STREAM_ROWS = 400  # rows per micro-batch


def source(spark: SparkSession, columns: list[str]) -> DataFrame:
    """ROWS rows in TASKS partitions of contiguous ids; value `w#<id>`, key and attributes null for some."""
    return spark.range(ROWS, numPartitions=TASKS).selectExpr(*columns)


def expected(i: int) -> dict[str, Any]:
    return {"value": f"w#{i:05d}".encode(),
            "key": None if i % 10 == 0 else f"key-{i % 7}".encode(),
            "attributes": None if i % 3 == 0 else {"n": str(i), "parity": "even" if i % 2 == 0 else "odd"}}


VALUE = "cast(format_string('w#%05d', id) as binary) as value"
VALUE_TEXT = "format_string('w#%05d', id) as value"
KEY = "if(id % 10 = 0, null, concat('key-', id % 7)) as key"
KEY_BYTES = f"cast({KEY.removesuffix(' as key')} as binary) as key"
ATTRIBUTES = ("if(id % 3 = 0, null, map('n', cast(id as string), 'parity', "
              "if(id % 2 = 0, 'even', 'odd'))) as attributes")


def read(spark: SparkSession, broker: Broker, topic: str) -> list[Any]:
    return spark.read.format("danube").options(**reader_options(broker, topic=topic)).load() \
        .orderBy("offset").collect()


def write(df: DataFrame, broker: Broker, topic: str, **options: str) -> None:
    df.write.format("danube").mode("append").option("broker", broker.target).option("topic", topic) \
        .options(**options).save()


@pytest.mark.parametrize(("columns", "carried", "options"), [
    ([VALUE, KEY, ATTRIBUTES], {"key", "attributes"}, {}),
    ([VALUE_TEXT], set(), {}),
    ([VALUE_TEXT, KEY_BYTES], {"key"}, {}),
    # compressed by the tasks, stored compressed, decompressed by the reader (docs/FORMAT.md#compression)
    ([VALUE, KEY, ATTRIBUTES], {"key", "attributes"}, {"compression": "zstd"}),
    ([VALUE_TEXT], set(), {"compression": "lz4"}),
], ids=["records", "value-only", "text-value-binary-key", "records-zstd", "value-only-lz4"])
def test_every_row_is_read_back_exactly_in_each_tasks_order(spark: SparkSession, broker: Broker,
                                                           columns: list[str], carried: set[str],
                                                           options: dict[str, str],
                                                           request: pytest.FixtureRequest) -> None:
    topic = f"/default/w_{request.node.callspec.id.replace('-', '_')}"
    write(source(spark, columns), broker, topic, **options)
    rows = read(spark, broker, topic)
    assert [r.offset for r in rows] == list(range(ROWS)), "every row once, offsets from 0"
    names = {r.producer_name for r in rows}
    assert len(names) == TASKS and all(re.fullmatch(r"spark-[0-9a-f]{12}-p[0-3]-a0", n) for n in names), names
    per_task = ROWS // TASKS
    for name in names:
        ids = [int(bytes(r.value)[2:]) for r in rows if r.producer_name == name]
        p = int(name.split("-p")[1].split("-")[0])
        assert ids == list(range(p * per_task, (p + 1) * per_task)), f"{name}: its partition's rows in order"
    for r in rows:
        want = expected(int(bytes(r.value)[2:]))
        assert bytes(r.value) == want["value"]
        assert (bytes(r.key) if r.key is not None else None) == (want["key"] if "key" in carried else None)
        assert r.attributes == (want["attributes"] if "attributes" in carried else None), r


def test_an_empty_partition_opens_no_producer(spark: SparkSession, broker: Broker) -> None:
    """range(10) in 4 partitions is [0, 1], [2, 3, 4], [5, 6], [7, 8, 9]: `id < 3` leaves two of them."""
    topic = "/default/w_sparse"
    write(spark.range(10, numPartitions=4).where("id < 3").selectExpr(VALUE, KEY), broker, topic)
    rows = read(spark, broker, topic)
    assert sorted((r.producer_name.rsplit("-", 2)[1], bytes(r.value)) for r in rows) == \
        [("p0", expected(0)["value"]), ("p0", expected(1)["value"]), ("p1", expected(2)["value"])]


def test_a_topic_of_the_other_delivery_mode_fails_the_task_naming_it(spark: SparkSession,
                                                                     broker: Broker) -> None:
    topic = "/default/w_mode"
    write(source(spark, [VALUE]).limit(10), broker, topic)
    for columns in ([VALUE], [VALUE, KEY]):  # both publishers
        with pytest.raises((PySparkException, Py4JJavaError)) as raised:
            write(source(spark, columns).limit(10), broker, topic, reliable="false")
        assert "does not match topic strategy" in str(raised.value), str(raised.value)[:3000]
    assert len(read(spark, broker, topic)) == 10


@pytest.mark.parametrize(("options", "columns", "mode", "words"), [
    ({"brokr": "x"}, [VALUE], "append", ["unknown option", "brokr", "known: broker, topic"]),
    ({"broker": ""}, [VALUE], "append", ["option broker is required", "host:port"]),
    ({"topic": "default/t"}, [VALUE], "append", ["option topic", "/namespace/topic", "default/t"]),
    ({"reliable": "maybe"}, [VALUE], "append", ["option reliable", "maybe", "true", "false"]),
    ({"brokerTimeoutMs": "soon"}, [VALUE], "append", ["option brokerTimeoutMs", "integer"]),
    ({"compression": "gzip"}, [VALUE], "append", ["option compression", "gzip", "none, zstd, lz4"]),
    ({"broker": "unreachable"}, [VALUE], "append", ["no broker answers", "brokerTimeoutMs"]),
    ({}, ["id as offset", VALUE], "append", ["column 'offset' cannot be written", "value", "attributes"]),
    ({}, [KEY], "append", ["needs a value column"]),
    ({}, [VALUE, "map('n', id) as attributes"], "append", ["attributes is map<string,bigint>",
                                                           "map<string,string>"]),
    ({}, ["id as value"], "append", ["value is bigint", "binary or string"]),
    ({}, [VALUE], "overwrite", ["mode('overwrite')", "append-only", "mode('append')"]),
    ({}, [VALUE], "errorifexists", ["ErrorIfExists", "Append"]),  # Spark's own refusal
], ids=["unknown", "no-broker", "topic", "reliable", "timeout", "compression", "unreachable", "column",
        "no-value", "attribute-type", "value-type", "overwrite", "errorifexists"])
def test_bad_options_columns_and_modes_fail_before_any_task(spark: SparkSession, broker: Broker,
                                                            options: dict[str, str], columns: list[str],
                                                            mode: str, words: list[str],
                                                            request: pytest.FixtureRequest) -> None:
    merged = {"broker": broker.target, "topic": "/default/w_never", "brokerTimeoutMs": "500", **options}
    if merged["broker"] == "unreachable":
        merged["broker"] = f"127.0.0.1:{free_ports(1)[0]}"
    group = request.node.name
    spark.sparkContext.setJobGroup(group, "a write that must not start")
    try:
        with pytest.raises((PySparkException, Py4JJavaError)) as raised:
            source(spark, columns).write.format("danube").mode(mode).options(**merged).save()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    text = str(raised.value).lower()
    assert all(w.lower() in text for w in words), text[:3000]
    assert spark.sparkContext.statusTracker().getJobIdsForGroup(group) == [], "a task ran"


def test_a_stream_publishes_every_micro_batch_under_stable_producer_names(spark: SparkSession,
                                                                          broker: Broker,
                                                                          tmp_path: Path) -> None:
    """Two runs of an availableNow query on one checkpoint: two micro-batches, every row once, the same
    producer name per partition in both (names must not grow with the batches)."""
    topic = "/default/w_stream"
    checkpoint = tmp_path / "checkpoint"
    query_ids = set()
    for run in range(2):
        stream = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", STREAM_ROWS)
                  .option("numPartitions", 2).load()
                  .selectExpr("cast(value as string) as value", "concat('k', value % 3) as key"))
        query = (stream.writeStream.format("danube").option("broker", broker.target).option("topic", topic)
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(60), f"run {run} did not finish in 60 s"
        finally:
            query.stop()
        assert query.exception() is None, query.exception()
        query_ids.add(query.id)
    assert len(query_ids) == 1, "a restarted query keeps its id"
    rows = read(spark, broker, topic)
    values = sorted(int(bytes(r.value)) for r in rows)
    assert values == list(range(2 * STREAM_ROWS)), f"{len(values)} rows: {values[:5]}..."
    assert all(bytes(r.key) == f"k{int(bytes(r.value)) % 3}".encode() for r in rows)
    names = {r.producer_name for r in rows}
    query_id = query_ids.pop()
    assert names == {f"spark-{query_id}-p{p}-a0" for p in range(2)}, names


@pytest.mark.parametrize(("options", "complete", "words"), [
    ({"reliabel": "true"}, False, ["unknown option", "reliabel"]),
    ({}, True, ["outputMode('complete')", "append-only"]),
], ids=["unknown", "complete"])
def test_a_stream_refuses_bad_options_and_complete_mode(spark: SparkSession, broker: Broker, tmp_path: Path,
                                                        options: dict[str, str], complete: bool,
                                                        words: list[str]) -> None:
    stream = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
    if complete:
        stream = stream.groupBy((stream.value % 2).alias("k")).count()
    writer = (stream.selectExpr("cast(value as string) as value" if not complete else
                                "cast(count as string) as value")
              .writeStream.format("danube").option("broker", broker.target)
              .option("topic", "/default/w_never").options(**options)
              .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True))
    with pytest.raises((PySparkException, Py4JJavaError)) as raised:
        query = writer.outputMode("complete" if complete else "append").start()
        try:
            query.awaitTermination(60)
        finally:
            query.stop()
    text = str(raised.value).lower()
    assert all(w.lower() in text for w in words), text[:3000]

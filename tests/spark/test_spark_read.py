"""`spark.read.format("danube")` in local[2] against what a real broker produced and uploaded to a folder:
every record back exactly with every column, offset and time ranges, partitioned topics, the tail not yet
uploaded, filter pushdown on and off, data loss, and errors before any task runs."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from spark_support import (
    UPLOAD_WAIT,
    payload,
    produce_fast,
    produce_rich,
    reader_options,
    uploaded_end,
    wait_uploaded,
)

from danube_fast.testing.broker import Broker, BrokerFactory
from tests.compat.compat_support import RawApi

pytestmark = pytest.mark.spark

BROKER_CONFIG = """
[cluster]
upload_interval_ms = 200
[wal]
segment_bytes = 65536
"""
BULK, BULK_COUNT = "/default/bulk", 20_000
RICH, RICH_COUNT = "/default/rich", 40
PARTS, PARTS_COUNT = "/default/parts", 30


@pytest.fixture(scope="module")
def data(shared_broker: Broker) -> dict[str, Any]:
    before = time.time()
    rounds = 5  # each round after the last upload: several objects
    for k in range(rounds):
        asyncio.run(produce_fast(shared_broker, BULK, BULK_COUNT // rounds, start=k * BULK_COUNT // rounds))
        wait_uploaded(shared_broker, BULK, (k + 1) * BULK_COUNT // rounds)
    rich = asyncio.run(produce_rich(shared_broker, RICH, RICH_COUNT))
    parts = asyncio.run(produce_rich(shared_broker, PARTS, PARTS_COUNT, partitions=3))
    after = time.time()
    wait_uploaded(shared_broker, BULK, BULK_COUNT)
    wait_uploaded(shared_broker, RICH, RICH_COUNT)
    # Every partition too (offsets count from 0 in each): a test that compares the object tier before and
    # after a read must not see the partitions' uploads land in between.
    deadline = time.monotonic() + UPLOAD_WAIT
    while sum(uploaded_end(shared_broker, f"{PARTS}-part-{i}") for i in range(3)) < PARTS_COUNT:
        assert time.monotonic() < deadline, f"{PARTS}: not every record uploaded in {UPLOAD_WAIT} s"
        time.sleep(0.1)
    return {"rich": rich, "parts": parts, "before": before, "after": after}


def load(spark: SparkSession, broker: Broker, **options: str) -> DataFrame:
    return spark.read.format("danube").options(**reader_options(broker, **options)).load()


@pytest.fixture
def pushdown(spark: SparkSession, request: pytest.FixtureRequest) -> Iterator[bool]:
    on = bool(getattr(request, "param", True))
    spark.conf.set("spark.sql.python.filterPushdown.enabled", str(on).lower())
    yield on
    spark.conf.unset("spark.sql.python.filterPushdown.enabled")


def test_every_record_is_read_back_exactly(spark: SparkSession, broker: Broker, data: dict[str, Any]) -> None:
    df = load(spark, broker, topic=BULK)
    objects = len(list((broker.data_dir / "objects" / "default" / "bulk").glob("*.dnb1")))
    assert df.rdd.getNumPartitions() == objects, "one input partition per object"
    split = load(spark, broker, topic=BULK, maxRecordsPerPartition="1500")
    assert split.rdd.getNumPartitions() >= BULK_COUNT // 1500
    assert sorted(r.offset for r in split.select("offset").collect()) == list(range(BULK_COUNT))
    assert load(spark, broker, topic=BULK, minPartitions="12").rdd.getNumPartitions() >= 12
    rows = df.select("offset", "value").orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(BULK_COUNT))
    assert [bytes(r.value) for r in rows] == [payload(BULK, i) for i in range(BULK_COUNT)]
    assert df.count() == BULK_COUNT


def test_every_column_of_records_with_keys_and_attributes(spark: SparkSession, broker: Broker,
                                                         data: dict[str, Any]) -> None:
    rows = load(spark, broker, topic=RICH).orderBy("offset").collect()
    assert len(rows) == RICH_COUNT
    low = dt.datetime.fromtimestamp(data["before"] - 1, dt.UTC).replace(tzinfo=None)
    high = dt.datetime.fromtimestamp(data["after"] + 1, dt.UTC).replace(tzinfo=None)
    for i, (row, sent) in enumerate(zip(rows, data["rich"], strict=True)):
        assert row.offset == i and row.topic == RICH and row.partition == -1
        assert bytes(row.value) == sent["value"] and bytes(row.key) == sent["key"]
        assert row.attributes == sent["attributes"]
        assert row.timestampType == 0 and low <= row.timestamp <= high, row.timestamp
        assert row.producer_name and row.schema_id is None and row.schema_version is None


def test_a_partitioned_topic_reads_as_its_partitions(spark: SparkSession, broker: Broker,
                                                     data: dict[str, Any]) -> None:
    for i in range(3):
        wait_uploaded(broker, f"{PARTS}-part-{i}", 1)
    rows = load(spark, broker, topic=PARTS).collect()
    assert len(rows) == PARTS_COUNT
    assert {r.topic for r in rows} == {PARTS} and {r.partition for r in rows} <= {0, 1, 2}
    assert sorted(bytes(r.value) for r in rows) == sorted(s["value"] for s in data["parts"])
    for p in {r.partition for r in rows}:
        assert sorted(r.offset for r in rows if r.partition == p) == \
            list(range(sum(1 for r in rows if r.partition == p))), "offsets per partition from 0"
    # Every key went to one partition (the client routes by key).
    by_key: dict[bytes, set[int]] = {}
    for r in rows:
        by_key.setdefault(bytes(r.key), set()).add(r.partition)
    assert all(len(ps) == 1 for ps in by_key.values()), by_key
    one = load(spark, broker, topics=f"{PARTS},{RICH}").where("partition = 1 or partition = -1").count()
    assert one == RICH_COUNT + sum(1 for r in rows if r.partition == 1)


def test_offset_options_select_a_range(spark: SparkSession, broker: Broker, data: dict[str, Any]) -> None:
    starting = json.dumps({BULK: {"-1": 1234}})
    ending = json.dumps({BULK: {"-1": 17_001}})
    offsets = [r.offset for r in load(spark, broker, topic=BULK, startingOffsets=starting,
                                      endingOffsets=ending).select("offset").collect()]
    assert sorted(offsets) == list(range(1234, 17_001))
    assert load(spark, broker, topic=BULK, startingOffsets="latest").count() == 0


@pytest.mark.parametrize("pushdown", [True, False], indirect=True, ids=["pushdown", "no-pushdown"])
def test_where_on_offset_is_exact_and_prunes_with_pushdown(spark: SparkSession, broker: Broker,
                                                           data: dict[str, Any], pushdown: bool) -> None:
    """Each query loads its DataFrame (with filterPushdown=true, see source.py); the pruned query plans
    fewer partitions than the full one when Spark's pushdown is on, the same number when it is off."""

    def everything() -> DataFrame:
        return load(spark, broker, topic=BULK, filterPushdown="true")

    selected = everything().where("offset >= 19000 and offset < 19500")
    assert sorted(r.offset for r in selected.select("offset").collect()) == list(range(19000, 19500))
    assert everything().where("offset in (3, 5, 19999)").select("offset").count() == 3
    assert everything().where("topic = '/default/nothing'").count() == 0
    assert everything().where("partition = -1 and offset = 7").count() == 1
    parts_all = everything().rdd.getNumPartitions()
    parts_some = everything().where("offset >= 19000 and offset < 19500").rdd.getNumPartitions()
    if pushdown:
        assert parts_some < parts_all, (parts_some, parts_all)
    else:
        assert parts_some == parts_all


@pytest.mark.parametrize("pushdown", [True], indirect=True)
def test_auto_pushdown_keeps_a_reused_dataframe_exact(spark: SparkSession, broker: Broker,
                                                      data: dict[str, Any], pushdown: bool) -> None:
    """The default (auto) never lets a filtered action's pruning leak into a later action on the same
    DataFrame, whatever the PySpark version."""
    df = load(spark, broker, topic=BULK)
    assert df.where("offset >= 19000").count() == 1000
    assert df.count() == BULK_COUNT


def test_time_bounds(spark: SparkSession, broker: Broker, data: dict[str, Any]) -> None:
    rows = load(spark, broker, topic=RICH).orderBy("offset").collect()
    middle = rows[RICH_COUNT // 2].timestamp.replace(tzinfo=dt.UTC)
    ms = int(middle.timestamp() * 1000)
    expected = sorted(r.offset for r in rows if r.timestamp.replace(tzinfo=dt.UTC) >= middle)
    got = load(spark, broker, topic=RICH, startingTimestamp=str(ms)).select("offset").collect()
    assert sorted(r.offset for r in got) == expected
    got = load(spark, broker, topic=RICH, endingTimestamp=str(ms)).select("offset").collect()
    assert sorted(r.offset for r in got) == sorted(set(range(RICH_COUNT)) - set(expected))
    where = load(spark, broker, topic=RICH).where(f"timestamp >= timestamp_millis({ms})")
    assert sorted(r.offset for r in where.select("offset").collect()) == expected


def test_the_tail_not_yet_uploaded_comes_from_the_broker(spark: SparkSession,
                                                         broker_factory: BrokerFactory) -> None:
    """endingOffsets=latest: what was acknowledged before the query, uploaded or not; `uploaded`: the object
    tier alone."""
    slow = broker_factory.start("[cluster]\nupload_interval_ms = 3600000\n")
    topic = "/default/tail"
    asyncio.run(produce_fast(slow, topic, 3000))
    assert uploaded_end(slow, topic) == 0
    df = load(spark, slow, topic=topic)
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(3000))
    assert load(spark, slow, topic=topic, endingOffsets="uploaded").count() == 0
    asyncio.run(produce_fast(slow, topic, 500, start=3000))
    assert load(spark, slow, topic=topic).count() == 3500, "a new query sees what was acknowledged since"


def test_reading_changes_nothing(spark: SparkSession, broker: Broker, data: dict[str, Any]) -> None:
    before = sorted(p.name for p in (broker.data_dir / "objects").rglob("*"))
    meta = (broker.data_dir / "metadata.db").stat().st_size
    load(spark, broker, topic=BULK).count()

    async def subscriptions() -> int:
        async with RawApi(broker.target):
            return 0

    asyncio.run(subscriptions())
    assert sorted(p.name for p in (broker.data_dir / "objects").rglob("*")) == before
    assert (broker.data_dir / "metadata.db").stat().st_size == meta


@pytest.mark.parametrize(("options", "words"), [
    ({"topic": BULK, "startingOfsets": "earliest"}, ["unknown option", "startingOfsets"]),
    ({"topic": "/default/no_such_topic"}, ["/default/no_such_topic", "does not exist"]),
    ({"topic": BULK, "startingOffsets": "{bad"}, ["startingOffsets"]),
    ({"topic": BULK, "failOnDataLoss": "maybe"}, ["failOnDataLoss", "true or false"]),
    ({"topic": BULK, "topics": RICH}, ["exactly one of"]),
    ({"topic": BULK, "metadataStore": "embedded:/nonexistent/meta.db"}, ["no embedded metadata store"]),
    ({"topic": BULK, "minPartitions": "0"}, ["minPartitions"]),
])
def test_bad_options_fail_before_any_task_naming_the_problem(spark: SparkSession, broker: Broker,
                                                             data: dict[str, Any], options: dict[str, str],
                                                             words: list[str]) -> None:
    merged = {**reader_options(broker), **options}
    with pytest.raises((PySparkException, Py4JJavaError)) as raised:
        spark.read.format("danube").options(**merged).load().count()
    text = str(raised.value).lower()  # Spark passes option names lowercased
    assert all(w.lower() in text for w in words), text[:2000]


def test_a_nonreliable_topic_is_refused(spark: SparkSession, broker: Broker, data: dict[str, Any]) -> None:
    async def create() -> None:
        async with RawApi(broker.target) as api:
            await api.create_producer("/default/live_only", "p")

    asyncio.run(create())
    with pytest.raises((PySparkException, Py4JJavaError)) as raised:
        load(spark, broker, topic="/default/live_only").count()
    assert "NonReliable" in str(raised.value)


def test_a_given_schema_reads_only_its_columns(spark: SparkSession, broker: Broker,
                                               data: dict[str, Any]) -> None:
    """`.schema(...)` with some of the columns: only those are built and shipped; others refused clearly."""
    df = spark.read.format("danube").schema("offset long, value binary").options(
        **reader_options(broker, topic=BULK)).load()
    assert df.columns == ["offset", "value"]
    rows = df.where("offset >= 100 and offset < 200").orderBy("offset").collect()
    assert [(r.offset, bytes(r.value)) for r in rows] == [(i, payload(BULK, i)) for i in range(100, 200)]
    for bad, words in (("offset long, nope string", ["nope", "not one of"]),
                       ("offset string", ["offset", "bigint"])):
        with pytest.raises((PySparkException, Py4JJavaError)) as raised:
            reader = spark.read.format("danube").schema(bad).options(**reader_options(broker, topic=BULK))
            reader.load().count()
        assert all(w in str(raised.value) for w in words), str(raised.value)[:2000]

"""`spark.readStream.format("danube")` in local[2] against a real broker: each record exactly once across
micro-batches and query restarts from a checkpoint (also over a broker restart and a batch Spark runs
again), maxOffsetsPerTrigger shared by the topics, partitions that appear later read from their start,
data loss, bad options; and the offset arithmetic itself, without Spark."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark_danube import columns, options
from pyspark_danube.fetch import DataLossError
from pyspark_danube.plan import Chunk
from pyspark_danube.stream import DanubeStreamReader, fair_share, next_end
from spark_support import payload, produce_fast, produce_rich, reader_options, uploaded_end, wait_uploaded

from danube_fast.proto import DanubeAdmin_pb2 as admin
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.testing.broker import Broker, BrokerFactory

pytestmark = pytest.mark.spark

BROKER_CONFIG = "[cluster]\nupload_interval_ms = 200\n[wal]\nsegment_bytes = 65536\n"
QUERY_WAIT = 60  # seconds for an availableNow query to finish

Row = tuple[str, int, int, bytes]  # topic, partition, offset, value


class Sink:
    """A foreachBatch sink keeping each micro-batch's rows by batch id, and the batches Spark ran again."""

    def __init__(self) -> None:
        self.batches: dict[int, list[Row]] = {}
        self.again: list[tuple[int, list[Row]]] = []

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        rows = sorted((r.topic, r.partition, r.offset, bytes(r.value))
                      for r in df.select("topic", "partition", "offset", "value").collect())
        if batch_id in self.batches:
            self.again.append((batch_id, rows))
        self.batches[batch_id] = rows

    def rows(self) -> list[Row]:
        """Every row of every batch, sorted: a row read twice appears twice."""
        return sorted(r for rows in self.batches.values() for r in rows)


def run_available(spark: SparkSession, broker: Broker, sink: Sink, checkpoint: Path, **opts: str) -> None:
    """A query with Trigger.AvailableNow from `checkpoint`: what is committed when it starts; then stop."""
    query = (spark.readStream.format("danube").options(**reader_options(broker, **opts)).load()
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(QUERY_WAIT), f"the query did not finish within {QUERY_WAIT} s"
    finally:
        query.stop()


def last_offsets(checkpoint: Path) -> dict[str, int]:
    """The end offsets of the checkpoint's last batch: the offset log's last line is our source's JSON."""
    last = max((p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    offsets: dict[str, int] = json.loads(last.read_text().splitlines()[-1])
    return offsets


def fast_rows(topic: str, first: int, end: int) -> list[Row]:
    return [(topic, -1, i, payload(topic, i)) for i in range(first, end)]


# -- in local[2] ---------------------------------------------------------------------------------------------


def test_each_record_once_across_batches_and_new_partitions(spark: SparkSession, broker: Broker,
                                                            tmp_path: Path) -> None:
    """Two runs from one checkpoint: the first reads what was uploaded, the second exactly what came since
    (mostly the broker's tail), and a partitioned topic matching the pattern that appeared in between
    from offset 0 of each partition."""
    one, parts = "/default/sa_one", "/default/sa_parts"
    asyncio.run(produce_fast(broker, one, 300))
    wait_uploaded(broker, one, 300)
    sink, checkpoint = Sink(), tmp_path / "checkpoint"
    run_available(spark, broker, sink, checkpoint, topicPattern="/default/sa_*")
    assert sink.rows() == fast_rows(one, 0, 300)
    assert last_offsets(checkpoint) == {one: 300}, "the next offset to read, per stored topic"

    first_run = len(sink.batches)
    asyncio.run(produce_fast(broker, one, 200, start=300))
    sent = asyncio.run(produce_rich(broker, parts, 20, partitions=2))
    run_available(spark, broker, sink, checkpoint, topicPattern="/default/sa_*")
    new = sorted(r for b, rows in sink.batches.items() if b >= first_run for r in rows)
    assert [r for r in new if r[0] == one] == fast_rows(one, 300, 500)
    got_parts = [r for r in new if r[0] == parts]
    assert sorted(r[3] for r in got_parts) == sorted(s["value"] for s in sent)
    for p in (0, 1):
        offsets = [r[2] for r in got_parts if r[1] == p]
        assert offsets == list(range(len(offsets))), f"partition {p} from its first offset, each once"
    assert last_offsets(checkpoint) == {
        one: 500, f"{parts}-part-0": sum(1 for r in got_parts if r[1] == 0),
        f"{parts}-part-1": sum(1 for r in got_parts if r[1] == 1)}
    assert sink.rows() == sorted(fast_rows(one, 0, 500) + got_parts) and not sink.again


def test_max_offsets_per_trigger_splits_fairly(spark: SparkSession, broker: Broker, tmp_path: Path) -> None:
    """100 offsets per batch shared by two topics: the small one is read whole in the first batch and the
    big one gets the rest of the batch; every batch is full but the last, every record read once."""
    big, small = "/default/sb_big", "/default/sb_small"
    asyncio.run(produce_fast(broker, big, 250))
    asyncio.run(produce_fast(broker, small, 40))
    sink = Sink()
    run_available(spark, broker, sink, tmp_path / "checkpoint", topics=f"{big},{small}",
                  maxOffsetsPerTrigger="100")
    assert [len(sink.batches[b]) for b in sorted(sink.batches)] == [100, 100, 90]
    assert sink.batches[0] == fast_rows(big, 0, 60) + fast_rows(small, 0, 40)
    assert sink.batches[1] == fast_rows(big, 60, 160)
    assert sink.batches[2] == fast_rows(big, 160, 250)


def test_restart_over_a_broker_restart_and_a_batch_run_again(spark: SparkSession,
                                                             broker_factory: BrokerFactory,
                                                             readers: list[DanubeStreamReader],
                                                             tmp_path: Path) -> None:
    """The query stops, its last batch is left uncommitted in the checkpoint, the broker restarts and gets
    more records; the restarted query runs that batch again with the same records, then reads exactly the
    new ones. Nothing is uploaded: every record comes from the broker, before and after its restart."""
    broker = broker_factory.start("[cluster]\nupload_interval_ms = 3600000\n")
    topic = "/default/sc"
    asyncio.run(produce_fast(broker, topic, 400))
    sink, checkpoint = Sink(), tmp_path / "checkpoint"
    run_available(spark, broker, sink, checkpoint, topic=topic, maxOffsetsPerTrigger="150")
    assert sorted(sink.batches) == [0, 1, 2] and sink.rows() == fast_rows(topic, 0, 400)
    assert uploaded_end(broker, topic) == 0
    for name in ("2", ".2.crc"):  # as if the query had stopped before its sink committed batch 2
        (checkpoint / "commits" / name).unlink(missing_ok=True)

    running = open_reader(readers, broker, topic=topic)  # a query's driver side, across the restart
    assert running.latestOffset({topic: 400}, ReadAllAvailable()) == {topic: 400}
    broker.restart()
    asyncio.run(produce_fast(broker, topic, 300, start=400))
    assert running.latestOffset({topic: 400}, ReadAllAvailable()) == {topic: 700}, \
        "the committed offset from the restarted broker, not the object tier's end"
    run_available(spark, broker, sink, checkpoint, topic=topic, maxOffsetsPerTrigger="150")
    assert sink.again == [(2, fast_rows(topic, 300, 400))], "batch 2 again, with the same records"
    assert sorted(sink.batches) == [0, 1, 2, 3, 4]
    assert sink.batches[3] == fast_rows(topic, 400, 550) and sink.batches[4] == fast_rows(topic, 550, 700)
    assert sink.rows() == fast_rows(topic, 0, 700)
    assert last_offsets(checkpoint) == {topic: 700}


@pytest.mark.parametrize(("extra", "words"), [
    ({"endingOffsets": "latest"}, ["endingOffsets", "batch queries"]),
    ({"endingTimestamp": "1700000000000"}, ["endingTimestamp", "batch queries"]),
    ({"maxOffsetsPerTrigger": "0"}, ["maxOffsetsPerTrigger", "at least 1"]),
])
def test_bad_options_fail_the_stream_naming_the_option(spark: SparkSession, broker: Broker, tmp_path: Path,
                                                       extra: dict[str, str], words: list[str]) -> None:
    asyncio.run(produce_fast(broker, "/default/sd", 1))
    with pytest.raises((PySparkException, Py4JJavaError)) as raised:
        run_available(spark, broker, Sink(), tmp_path / "checkpoint", topic="/default/sd", **extra)
    text = str(raised.value).lower()  # Spark passes option names lowercased
    assert all(w.lower() in text for w in words), text[:2000]


# -- the reader's methods, driven as Spark's driver process drives them ------------------------------------


@pytest.fixture
def readers() -> Iterator[list[DanubeStreamReader]]:
    made: list[DanubeStreamReader] = []
    yield made
    for reader in made:
        reader.stop()


def open_reader(made: list[DanubeStreamReader], broker: Broker, **opts: str) -> DanubeStreamReader:
    reader = DanubeStreamReader(options.parse(reader_options(broker, **opts), streaming=True), columns.SCHEMA)
    made.append(reader)
    return reader


def read_rows(reader: DanubeStreamReader, parts: Any) -> list[tuple[int, bytes]]:
    assert all(isinstance(p, Chunk) for p in parts)
    return sorted((o, bytes(v)) for p in parts for b in reader.read(p)
                  for o, v in zip(b.column("offset").to_pylist(), b.column("value").to_pylist(), strict=True))


def test_offsets_between_two_calls_are_exact(broker: Broker, readers: list[DanubeStreamReader]) -> None:
    topic = "/default/se"
    asyncio.run(produce_fast(broker, topic, 50))
    reader = open_reader(readers, broker, topic=topic)
    start = reader.initialOffset()
    assert start == {topic: 0}
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {topic: 50} and reader.reportLatestOffset() == {topic: 50}
    assert read_rows(reader, reader.partitions({topic: 17}, {topic: 33})) == \
        [(i, payload(topic, i)) for i in range(17, 33)]
    assert reader.partitions(end, end) == []
    assert open_reader(readers, broker, topic=topic, startingOffsets="latest").initialOffset() == {topic: 50}
    at = json.dumps({topic: {"-1": 42}})
    assert open_reader(readers, broker, topic=topic, startingOffsets=at).initialOffset() == {topic: 42}


def test_a_topic_whose_offsets_went_back_is_data_loss(broker: Broker,
                                                      readers: list[DanubeStreamReader]) -> None:
    """The topic is deleted and created again below the stream's offset: an error naming it with
    failOnDataLoss (the default); without, a warning and the new records from offset 0."""
    topic = "/default/sf"
    asyncio.run(produce_fast(broker, topic, 30))
    strict = open_reader(readers, broker, topic=topic)
    lenient = open_reader(readers, broker, topic=topic, failOnDataLoss="false")
    end = strict.latestOffset(strict.initialOffset(), ReadAllAvailable())
    assert end == {topic: 30}

    async def delete() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
            stub: Any = admin_grpc.TopicAdminStub(channel)  # type: ignore[no-untyped-call]
            await stub.DeleteTopic(admin.TopicRequest(name=topic), timeout=10)

    asyncio.run(delete())
    asyncio.run(produce_fast(broker, topic, 5, start=100))
    again = strict.latestOffset(end, ReadAllAvailable())
    assert again == {topic: 5}
    with pytest.raises(DataLossError, match=f"{topic}: its committed offset went back from 30 to 5"):
        strict.partitions(end, again)
    rows = read_rows(lenient, lenient.partitions(end, again))
    assert rows == [(i, payload(topic, 100 + i)) for i in range(5)], "the new records, from offset 0"


# -- the offset arithmetic ---------------------------------------------------------------------------------


def test_fair_share_never_exceeds_the_cap_and_starves_no_topic() -> None:
    assert fair_share({"a": 250, "b": 40}, 100) == {"a": 60, "b": 40}
    assert fair_share({"a": 5, "b": 0, "c": 7}, 100) == {"a": 5, "b": 0, "c": 7}
    assert fair_share({"a": 10, "b": 10, "c": 10}, 7) == {"a": 3, "b": 2, "c": 2}
    assert fair_share({"a": 1, "b": 9, "c": 9}, 2) == {"a": 0, "b": 1, "c": 1}, "the most behind first"
    for cap in range(1, 40):
        shares = fair_share({"a": 3, "b": 17, "c": 11, "d": 0}, cap)
        assert sum(shares.values()) == min(cap, 31)
        assert shares["a"] <= 3 and shares["b"] <= 17 and shares["c"] <= 11 and shares["d"] == 0


def test_next_end() -> None:
    start = {"/n/a": 10, "/n/gone": 4, "/n/reset": 30}
    latest = {"/n/a": 25, "/n/new": 8, "/n/empty": 0, "/n/reset": 5}
    assert next_end(start, latest, None) == {"/n/a": 25, "/n/gone": 4, "/n/new": 8, "/n/reset": 5}
    assert list(next_end(start, latest, None)) == sorted(next_end(start, latest, None)), "keys sorted"
    assert next_end(start, latest, 6) == {"/n/a": 12, "/n/gone": 4, "/n/new": 2, "/n/reset": 2}
    assert next_end(start, start | {"/n/reset": 30}, 6) == start, "nothing new: the start itself"
    target = {"/n/a": 20, "/n/reset": 3}  # Trigger.AvailableNow: /n/new appeared after the query began
    assert next_end(start, latest, None, target) == {"/n/a": 20, "/n/gone": 4, "/n/reset": 3}

"""`python -m bench spark`: our Spark data source against Spark's own Parquet scan of the same records, and
against our codec alone (the ceiling), in one run.

Data, made once per run of the command: RECORDS records of RECORD_BYTES produced through the fast API into a
standalone broker in OBJECTS rounds, each waited for until uploaded (so OBJECTS objects or more, with disjoint
publish times), to its object folder; then the same records written as Parquet by Spark, read from our source
(Spark's defaults: snappy). Queries, each on a freshly loaded DataFrame, `count(*), sum(length(value))`:
- `full`: every record;
- `offset5`: `where offset >= X`, the last 5% of the offsets;
- `one_object`: `where timestamp between` the first and last publish time of one object in the middle.
Systems: `danube` (format("danube"), endingOffsets=uploaded, filterPushdown=true: each query loads its own
DataFrame, every column), `danube_projected` (the same with `.schema(PROJECTED)`: only the columns the queries
use are built and shipped to Spark, as Parquet's scan reads only those), `parquet` (spark.read.parquet) and,
for `full` only, `codec`: this process reading each object file and decoding it with frames.decode_arrow into
pyarrow (one core; Spark runs two tasks at once).

Figures are seconds per query, the median of --runs timed rounds after one warm-up round; the ratio is the
median of the per-round danube / parquet (or danube / codec) time ratios, so below 1 is ours faster. Targets
(issue 11): `full` within 1.25x of Parquet's time (0.8x its speed); the pruned queries faster than Parquet.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Options, Result, Target, median, paired_ratio, progress
from danube_fast import frames
from danube_fast.client import FastProducer
from danube_fast.meta.reader import open_reader
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.storage.objects.format import HEADER_SIZE, parse_footer
from danube_fast.testing.broker import Broker

RECORDS = 8_000_000
QUICK_RECORDS = 400_000
RECORD_BYTES = 256
BATCH_RECORDS = 1000
OBJECTS = 10  # the WAL rolls about this many times over the data: one object each
TOPIC = "/default/spark_bench"
QUERIES = ("full", "offset5", "one_object")
FULL_TARGET = Target("<= 1.25x Parquet's time", "<=", 1.25, of="ratio")
PRUNED_TARGET = Target("< Parquet's time", "<=", 0.999, of="ratio")
AGGREGATE = "count(*) AS n, sum(length(value)) AS bytes"
SYSTEMS = ("danube", "projected", "parquet")
PROJECTED = "offset long, timestamp timestamp, value binary"  # the columns the three queries use


def run_spark(options: Options, records: int | None = None) -> list[Result]:
    count = max(records or (QUICK_RECORDS if options.quick else RECORDS), OBJECTS * BATCH_RECORDS)
    scratch = Path(tempfile.mkdtemp(prefix="bench-spark-", dir=options.parent_dir))
    try:
        data_dir, objects = _produce(scratch, count)
        return _measure(data_dir, objects, scratch, count, options.runs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _produce(scratch: Path, count: int) -> tuple[Path, list[Path]]:
    """The records in the broker's object folder: its data dir, and the object files in offset order."""
    segment = max(1 << 20, count * (RECORD_BYTES + 16) // OBJECTS)  # local WAL segments go once uploaded
    config = f"[wal]\nsegment_bytes = {segment}\nretain_bytes = 0\n[cluster]\nupload_interval_ms = 300\n"
    broker = Broker(scratch / "broker", config, metrics=False, die_with_parent=True)
    data_dir = broker.data_dir
    try:
        broker.start()
        progress(f"producing {count:,} records of {RECORD_BYTES} B in {OBJECTS} rounds, each uploaded")
        per_round = count // OBJECTS
        for k in range(OBJECTS):
            asyncio.run(_send(broker.target, per_round if k < OBJECTS - 1 else count - k * per_round))
            deadline = time.monotonic() + 600
            while asyncio.run(_uploaded(data_dir)) < min(count, (k + 1) * per_round):
                if time.monotonic() > deadline:
                    raise RuntimeError("the broker did not upload the records within 600 s")
                time.sleep(0.2)
    finally:
        broker.stop()
    folder = data_dir / "objects" / TOPIC.split("/")[1] / TOPIC.split("/")[2]
    return data_dir, sorted(folder.glob("*.dnb1"), key=lambda p: int(p.name.split("-")[1]))


async def _send(target: str, count: int) -> None:
    producer = await FastProducer.connect(target, TOPIC, "bench")
    try:
        for start in range(0, count, BATCH_RECORDS):
            await producer.send_batch(_payloads(min(BATCH_RECORDS, count - start)))
        await producer.flush()
    finally:
        await producer.close()


def _payloads(n: int) -> list[bytes]:
    """`n` distinct random payloads: identical ones would let Parquet's dictionary encoding store the
    column as one value (a first run here had Parquet scan 8 M such records in 0.4 s)."""
    blob = os.urandom(RECORD_BYTES * n)
    return [blob[i * RECORD_BYTES:(i + 1) * RECORD_BYTES] for i in range(n)]


async def _uploaded(data_dir: Path) -> int:
    meta = await open_reader(f"embedded:{data_dir / 'metadata.db'}")
    try:
        ns, short = TOPIC.split("/")[1:]
        return max((d.end_offset + 1 for d in await load_descriptors(meta, ns, short)), default=0)
    finally:
        await meta.close()


def _codec_scan(objects: list[Path]) -> tuple[int, int]:
    """count(*), sum(length(value)) by the codec alone: each object read, its body decoded into Arrow."""
    import pyarrow.compute as pc

    n = size = 0
    for path in objects:
        data = path.read_bytes()
        body_end = parse_footer(data).body_end
        batch = frames.decode_arrow(memoryview(data)[HEADER_SIZE:body_end], verify=True)
        n += batch.num_rows
        size += pc.sum(pc.binary_length(batch.column("value"))).as_py()
    return n, size


def _measure(data_dir: Path, objects: list[Path], scratch: Path, count: int, runs: int) -> list[Result]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("bench-spark")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "4g")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.python.filterPushdown.enabled", "true")
             .config("spark.local.dir", str(scratch / "spark")).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        options = {"metadataStore": f"embedded:{data_dir / 'metadata.db'}",
                   "objectStore": str(data_dir / "objects"), "topic": TOPIC, "endingOffsets": "uploaded",
                   "filterPushdown": "true"}
        parquet_dir = str(scratch / "parquet")
        progress(f"{len(objects)} objects; writing the same records as Parquet")
        spark.read.format("danube").options(**options).load().write.parquet(parquet_dir)
        middle = parse_footer(objects[len(objects) // 2].read_bytes()[-(64 << 10):])
        where = {
            "full": None,
            "offset5": f"offset >= {count - count // 20}",
            "one_object": (f"timestamp BETWEEN timestamp_millis({middle.min_time}) "
                           f"AND timestamp_millis({middle.max_time})"),
        }
        expected: dict[str, tuple[int, int] | None] = dict.fromkeys(QUERIES)
        times: dict[str, list[float]] = {}
        for round_ in range(runs + 1):
            progress(f"round {round_ + 1}/{runs + 1}{' (warm-up)' if round_ == 0 else ''}")
            for query, condition in where.items():
                for system in SYSTEMS:
                    if system == "parquet":
                        reader = spark.read.format("parquet").option("path", parquet_dir)
                    else:
                        reader = spark.read.format("danube").options(**options)
                        if system == "projected":
                            reader = reader.schema(PROJECTED)
                    started = time.perf_counter()
                    df = reader.load()
                    if condition is not None:
                        df = df.where(condition)
                    row = df.selectExpr(*AGGREGATE.split(", ")).collect()[0]
                    elapsed = time.perf_counter() - started
                    got = (row.n, row.bytes)
                    if expected[query] is None:
                        expected[query] = got
                    if got != expected[query]:
                        raise RuntimeError(f"{system} {query}: {got}, another system got {expected[query]}")
                    if round_:
                        times.setdefault(f"{system}_{query}", []).append(elapsed)
            started = time.perf_counter()
            got = _codec_scan(objects)
            if got != expected["full"]:
                raise RuntimeError(f"the codec alone counted {got}, Spark {expected['full']}")
            if round_:
                times.setdefault("codec_full", []).append(time.perf_counter() - started)
        full_n = expected["full"][0] if expected["full"] else 0
        if full_n != count:
            raise RuntimeError(f"the full scan counted {full_n} records, {count} were produced")
    finally:
        spark.stop()
    return _results(times, runs, count)


def _results(times: dict[str, list[float]], runs: int, count: int) -> list[Result]:
    out = []
    for query in QUERIES:
        ours, theirs = times[f"danube_{query}"], times[f"parquet_{query}"]
        out.append(Result(f"parquet_{query}", "s", median(theirs), runs))
        target = FULL_TARGET if query == "full" else PRUNED_TARGET
        out.append(Result(f"danube_{query}", "s", median(ours), runs, median(theirs),
                          paired_ratio(ours, theirs), target))
        projected = times[f"projected_{query}"]
        out.append(Result(f"danube_projected_{query}", "s", median(projected), runs, median(theirs),
                          paired_ratio(projected, theirs), target))
    codec = times["codec_full"]
    out.append(Result("codec_full", "s", median(codec), runs))
    out.append(Result("danube_full_vs_codec", "s", median(times["danube_full"]), runs, median(codec),
                      paired_ratio(times["danube_full"], codec)))
    out.append(Result("danube_full_rate", "records/s", count / median(times["danube_full"]), runs))
    out.append(Result("parquet_full_rate", "records/s", count / median(times["parquet_full"]), runs))
    return out


def load_line(count: int) -> str:
    return (f"- Load: {count:,} records of {RECORD_BYTES} B in {OBJECTS}+ objects on the local folder store; "
            "Spark local[2] (driver 4g), filter pushdown on; each query on a freshly loaded DataFrame")

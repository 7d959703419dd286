"""`python -m bench spark`: our Spark data source against Spark's own Parquet scan of the same records, and
against our codec alone (the ceiling), in one run.

Data, made once per run of the command: RECORDS records of RECORD_BYTES produced through the fast API into a
standalone broker in OBJECTS rounds, each waited for until uploaded (so OBJECTS objects or more, with disjoint
publish times), to its object folder; then the same records written as Parquet by Spark, read from our source
(Spark's defaults: snappy). Queries, each on a freshly loaded DataFrame, `count(*), sum(length(value))`:
- `full`: every record;
- `offset5`: `where offset >= X`, the last 5% of the offsets;
- `one_object`: `where timestamp between` the first and last publish time of one object in the middle
  (ISO 8601 literals).
Systems: `danube` (format("danube"), endingOffsets=uploaded, filterPushdown=true: each query loads its own
DataFrame, every column), `danube_projected` (the same with `.schema(PROJECTED)`: only the columns the queries
use are built and shipped to Spark, as Parquet's scan reads only those), `parquet` (spark.read.parquet),
`table` (pyspark_danube.read_table: the topic's Iceberg table, which the broker wrote as the records came
(policy tableMode envelope, [tables] lag_ms 1000; no compaction: TABLES_CONFIG), scanned by Spark's Parquet
reader, plus the records past the table's committed offset from format("danube"), none here, so left out;
read_table is called afresh for each query with the query's condition as its `where`, which also prunes the
table's files by their column bounds, so its planning, a catalog read and one call to the broker for the
committed offset, is timed too) and, for `full` only, `codec`: this process reading each object file and
decoding it with frames.decode_arrow into pyarrow (one core; Spark runs two tasks at once). The broker runs
until the queries end: read_table asks it for the topic's committed offset.

Figures are seconds per query, the median of --runs timed rounds after one warm-up round; the ratio is the
median of the per-round danube / parquet (or danube / codec, table / parquet, table / danube) time ratios, so
below 1 is ours faster. Targets: the data source's `full` within 1.25x of Parquet's time (0.8x its speed),
its pruned queries faster than Parquet; read_table's `full` at least 0.95x Parquet's speed (time ratio <=
1/0.95) and at least 3x the data source's (`table_full_vs_source`: table / danube time <= 1/3), its offset and
time range queries faster than Parquet.

The table writer, measured once while producing: `table_catch_up_s` is the seconds from the last batch's
acknowledgement (the end of producing) until the table's committed offset reached the record count (polled
every 0.2 s on the broker's TableAdmin service); `table_catch_up_rate` is the record batches the table still
lacked at that moment (offsets, at the object files' bytes per record) over that time, in MB/s (10^6 B).
The writer appended the rest while the records were being produced, so this rate is only of the backlog.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Options, Result, Target, median, paired_ratio, progress
from danube_fast.client import FastProducer
from danube_fast.codec import frames
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
TABLE_FULL_TARGET = Target(">= 0.95x Parquet's speed", "<=", 1 / 0.95, of="ratio")
TABLE_SOURCE_TARGET = Target(">= 3x the data source's speed", "<=", 1 / 3, of="ratio")
AGGREGATE = "count(*) AS n, sum(length(value)) AS bytes"
SYSTEMS = ("danube", "projected", "parquet", "table")
# Every topic gets a table, at most about a second behind, and no compaction: with the defaults the writer's
# first maintenance (the first time it has caught up, mid-production) rewrote 8 of its files, into the
# catch-up time, and the next one, 60 s later, rewrote more while the queries ran, on the same two cores. The
# queries read the table as the writer committed it: files of up to commit_bytes (256 MiB) of batches.
TABLES_CONFIG = ('[policy]\ntable_mode = "envelope"\n'
                 "[tables]\nlag_ms = 1000\nmaintenance_ms = 86400000\ncompact_min_files = 1000000\n")
TABLE_WAIT_S = 1800.0  # for the table writer to catch up after producing
PROJECTED = "offset long, timestamp timestamp, value binary"  # the columns the three queries use


def run_spark(options: Options, records: int | None = None) -> list[Result]:
    count = max(records or (QUICK_RECORDS if options.quick else RECORDS), OBJECTS * BATCH_RECORDS)
    scratch = Path(tempfile.mkdtemp(prefix="bench-spark-", dir=options.parent_dir))
    try:
        segment = max(1 << 20, count * (RECORD_BYTES + 16) // OBJECTS)  # local WAL segments go once uploaded
        config = (f"[wal]\nsegment_bytes = {segment}\nretain_bytes = 0\n[cluster]\nupload_interval_ms = 300\n"
                  + TABLES_CONFIG)
        broker = Broker(scratch / "broker", config, metrics=False, die_with_parent=True)
        try:
            broker.start()
            objects, writer = _produce(broker, count)
            return _measure(broker, objects, scratch, count, options.runs) + writer
        finally:
            broker.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _produce(broker: Broker, count: int) -> tuple[list[Path], list[Result]]:
    """The records in the broker's object folder and its topic table: the object files in offset order, and
    the table writer's catch-up figures."""
    data_dir = broker.data_dir
    progress(f"producing {count:,} records of {RECORD_BYTES} B in {OBJECTS} rounds, each uploaded")
    per_round = count // OBJECTS
    produced, behind = 0.0, 0  # when the last batch was acknowledged, and the records the table lacked then
    for k in range(OBJECTS):
        asyncio.run(_send(broker.target, per_round if k < OBJECTS - 1 else count - k * per_round))
        if k == OBJECTS - 1:
            produced = time.monotonic()
            behind = count - (_table_status(broker.admin_port) or (0, 0, 0))[0]
        deadline = time.monotonic() + 600
        while asyncio.run(_uploaded(data_dir)) < min(count, (k + 1) * per_round):
            if time.monotonic() > deadline:
                raise RuntimeError("the broker did not upload the records within 600 s")
            time.sleep(0.2)
    deadline = produced + TABLE_WAIT_S
    while (status := _table_status(broker.admin_port)) is None or status[0] < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the table holds {status and status[0]} of {count} records "
                               f"{TABLE_WAIT_S:.0f} s after producing ended")
        time.sleep(0.2)
    caught_up = time.monotonic() - produced
    if status[0] != count:
        raise RuntimeError(f"the table's committed offset is {status[0]}, {count} records were produced")
    folder = data_dir / "objects" / TOPIC.split("/")[1] / TOPIC.split("/")[2]
    objects = sorted(folder.glob("*.dnb1"), key=lambda p: int(p.name.split("-")[1]))
    per_record = sum(p.stat().st_size for p in objects) / count  # record batches' bytes per record
    progress(f"the table caught up {caught_up:.2f} s after producing ended ({behind:,} records behind then); "
             f"it has {status[1]} data files, {status[2] / 1e6:.1f} MB")
    return objects, [Result("table_catch_up_s", "s", caught_up, 1),
                     Result("table_catch_up_rate", "MB/s", behind * per_record / 1e6 / caught_up, 1)]


def _iso(ms: int) -> str:
    """A publish time (ms) as an ISO 8601 literal both Spark SQL and pyiceberg's expression parser read."""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def _table_status(admin_port: int) -> tuple[int, int, int] | None:
    """(committed offset, data files, bytes) of TOPIC's table from the broker's TableAdmin service; None while
    the writer has no table for it yet."""
    import grpc

    from danube_fast.proto import TableAdmin_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["TableAdmin"].full_name
    with grpc.insecure_channel(f"127.0.0.1:{admin_port}") as channel:
        call = channel.unary_unary(f"/{service}/Status",
                                   request_serializer=pb.TableStatusRequest.SerializeToString,
                                   response_deserializer=pb.TableStatusResponse.FromString)
        try:
            got = call(pb.TableStatusRequest(topic=TOPIC), timeout=30)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:  # no table yet
                return None
            raise
    row = got.tables[0]
    if row.stopped:
        raise RuntimeError(f"the table writer stopped: {row.stopped}")
    return row.committed_offset, row.files, row.bytes


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


def _measure(broker: Broker, objects: list[Path], scratch: Path, count: int, runs: int) -> list[Result]:
    data_dir = broker.data_dir
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from pyspark_danube import read_table

    spark = (SparkSession.builder.master("local[2]").appName("bench-spark")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "4g")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.python.filterPushdown.enabled", "true")
             .config("spark.local.dir", str(scratch / "spark")).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        stores = {"metadataStore": f"embedded:{data_dir / 'metadata.db'}",
                  "objectStore": str(data_dir / "objects")}
        options = {**stores, "topic": TOPIC, "endingOffsets": "uploaded", "filterPushdown": "true"}
        parquet_dir = str(scratch / "parquet")
        progress(f"{len(objects)} objects; writing the same records as Parquet")
        spark.read.format("danube").options(**options).load().write.parquet(parquet_dir)
        middle = parse_footer(objects[len(objects) // 2].read_bytes()[-(64 << 10):])
        where = {
            "full": None,
            "offset5": f"offset >= {count - count // 20}",
            "one_object": f"timestamp BETWEEN '{_iso(middle.min_time)}' AND '{_iso(middle.max_time)}'",
        }
        expected: dict[str, tuple[int, int] | None] = dict.fromkeys(QUERIES)
        times: dict[str, list[float]] = {}
        for round_ in range(runs + 1):
            progress(f"round {round_ + 1}/{runs + 1}{' (warm-up)' if round_ == 0 else ''}")
            for query, condition in where.items():
                for system in SYSTEMS:
                    if system == "parquet":
                        reader = spark.read.format("parquet").option("path", parquet_dir)
                    elif system != "table":
                        reader = spark.read.format("danube").options(**options)
                        if system == "projected":
                            reader = reader.schema(PROJECTED)
                    started = time.perf_counter()
                    if system == "table":  # the condition prunes the table's files too
                        df = read_table(spark, TOPIC, where=condition, **stores)
                    else:
                        df = reader.load() if condition is None else reader.load().where(condition)
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
    warehouse = data_dir / "tables" / "warehouse"
    files = list(warehouse.rglob("*.parquet"))
    size = sum(f.stat().st_size for f in files) / 1e6
    progress(f"the table's warehouse: {len(files)} Parquet files, {size:.1f} MB; the Parquet baseline: "
             f"{len(list((scratch / 'parquet').glob('*.parquet')))} files")
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
        table = times[f"table_{query}"]
        table_target = TABLE_FULL_TARGET if query == "full" else PRUNED_TARGET
        out.append(Result(f"table_{query}", "s", median(table), runs, median(theirs),
                          paired_ratio(table, theirs), table_target))
    table, source = times["table_full"], times["danube_full"]
    out.append(Result("table_full_vs_source", "s", median(table), runs, median(source),
                      paired_ratio(table, source), TABLE_SOURCE_TARGET))
    codec = times["codec_full"]
    out.append(Result("codec_full", "s", median(codec), runs))
    out.append(Result("danube_full_vs_codec", "s", median(times["danube_full"]), runs, median(codec),
                      paired_ratio(times["danube_full"], codec)))
    out.append(Result("danube_full_rate", "records/s", count / median(times["danube_full"]), runs))
    out.append(Result("parquet_full_rate", "records/s", count / median(times["parquet_full"]), runs))
    return out


def load_line(count: int) -> str:
    return (f"- Load: {count:,} records of {RECORD_BYTES} B in {OBJECTS}+ objects on the local folder store, "
            "and in the topic's Iceberg table the broker wrote meanwhile (tableMode envelope, [tables] "
            "lag_ms 1000, not compacted); Spark local[2] (driver 4g), filter pushdown on; each query on a "
            "freshly loaded DataFrame (read_table called afresh, the condition as its where); the broker "
            "runs during the queries")

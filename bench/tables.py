"""`python -m bench tables`: what writing topic tables (docs/TABLES.md) costs the broker, and how fresh the
tables are, against the same broker without tables in the same run.

Per run, three fresh standalone brokers in turn (the order reverses between runs): `off` (tableMode
none), `on` (tableMode envelope, [tables] lag_ms at its default, 10 s) and `on2` (the same with `[tables]
worker_threads` 2: a commit encoded as two Parquet files at once; its figures end in `_threads2`). Each
gets bench/fast.py's workload at full speed: COUNT batches of 1,000 records of 256 B through FastProducer
to a Reliable topic, acks read concurrently; the records are distinct JSON-like events (`payload_pool`).
Figures:
- `produce_{off,on}`: records/s; `ack_p99_{off,on}`, `ack_p50_on`: ms from send_batch to the ack.
  Target: tables hurt the publish-ack p99 by at most 10% (`ack_p99_on` / `ack_p99_off`).
- `freshness_p50`, `freshness_p99`: per batch, seconds from its ack until the table's committed offset (the
  TableAdmin status, polled every POLL_S) covers it. Target: p99 within lag_ms.
- `writer_cpu_ms_per_mb`: the `on` broker's CPU (its table worker process's included) from the first batch
  until its table caught up, less the `off` broker's from the first batch until its uploads went quiet,
  per MB of record batches (what the table writer costs: decoding, Parquet, zstd, commits).
- `table_catch_up_s`: from the last ack until the table held every record.
- `half_rate_*`, `quarter_rate_*`: then, on other topics of the same brokers, once they are quiet, the same
  batches offered at half and at a quarter of the rate the run's first broker reached (one batch every
  BATCH_RECORDS / rate seconds, for PACED_S each): the ack p99 measured from when each batch was due, with
  and without tables, and the freshness: what an operator sees when the broker has headroom, where the
  full-speed figures show a machine both processes saturate (2 cores: the client, the broker and the
  writer). At half rate the writer alone needs about a core here (writer_cpu_ms_per_mb times the MB/s),
  so the quarter rate is the one this machine carries with room to spare.
  `*_ack_p99_late_*`: the same over the second half of the batches, without the one-time cost of the
  first table use.
"""

from __future__ import annotations

import asyncio
import functools
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from bench.broker import percentile
from bench.common import MB, Options, Result, Target, median, paired_ratio, progress, tree_cpu
from bench.fast import BATCH_RECORDS, RECORD_BYTES, quiet
from danube_fast.client import FastProducer
from danube_fast.proto import TableAdmin_pb2 as table_pb
from danube_fast.proto import TableAdmin_pb2_grpc as table_grpc
from danube_fast.testing.broker import Broker

PACED_S = 20.0
QUICK_PACED_S = 2.0
POOL_BATCHES = 64  # distinct batches cycled through: 64 K distinct records, 16 MiB
EVENTS = ("view", "click", "add_to_cart", "purchase", "search")
PACED = (("half_rate", 0.5), ("quarter_rate", 0.25))  # name, fraction of the first broker's full rate
COUNT = 10_000  # batches per run: 10 M records, 2.56 GB: the produce outlasts a writer pass (lag_ms / 2)
QUICK_COUNT = 200
TOPIC = "/default/tables_bench"
POLL_S = 0.05
LAG_S = 10.0  # [tables] lag_ms's default
ON = '[policy]\ntable_mode = "envelope"\n'
# The brokers of a run: without tables, with them, and with them and two worker threads.
CONFIGS: dict[str, str | None] = {"off": None, "on": ON, "on2": ON + "[tables]\nworker_threads = 2\n"}
ACK_TARGET = Target("<= 1.10x without tables", "<=", 1.10, of="ratio")
FRESHNESS_TARGET = Target(f"<= lag_ms ({LAG_S:g} s)", "<=", LAG_S)


class Run:
    def __init__(self) -> None:
        self.rate = 0.0
        self.acks: list[float] = []  # seconds, per batch, in the order the acks came
        self.freshness: list[float] = []  # seconds, per batch (on only)
        self.cpu = 0.0  # broker CPU seconds
        self.catch_up = 0.0
        self.paced: dict[str, Run] = {}  # the paced phases, by name (PACED)


async def _committed(channel: grpc.aio.Channel, topic: str = TOPIC) -> int:
    stub: Any = table_grpc.TableAdminStub(channel)  # type: ignore[no-untyped-call]
    try:
        got = await stub.Status(table_pb.TableStatusRequest(topic=topic), timeout=5)
    except grpc.aio.AioRpcError:
        return 0  # no table yet: the writer has not seen the topic
    return int(got.tables[0].committed_offset)


@functools.cache
def payload_pool(batches: int = POOL_BATCHES) -> list[list[bytes]]:
    """`batches` batches of BATCH_RECORDS distinct JSON-like records of RECORD_BYTES bytes (an event with
    random ids, amounts and a random hex tail), seeded: no two records repeat within 16 MiB, beyond the
    Parquet dictionary's page and zstd's window, so the writer's CPU is what real events cost (a constant
    payload compresses to nothing and halves Parquet's CPU)."""
    rng = random.Random(7)
    pool = []
    for b in range(batches):
        batch = []
        for i in range(BATCH_RECORDS):
            head = (f'{{"id":{b * BATCH_RECORDS + i},"user":"u{rng.randrange(10**6):06d}","event":"'
                    f'{rng.choice(EVENTS)}","amount":{rng.randrange(10**6) / 100},"tail":"')
            tail = rng.randbytes(RECORD_BYTES).hex()[:RECORD_BYTES - len(head) - 2]
            batch.append(f'{head}{tail}"}}'.encode())
        pool.append(batch)
    return pool


async def _one(broker: Broker, count: int, tables: bool, topic: str = TOPIC,
               rate: float | None = None) -> Run:
    """`count` batches to `topic` at full speed, or offered at `rate` records/s (latency from when due)."""
    run = Run()
    producer = await FastProducer.connect(broker.target, topic, "bench", max_inflight_bytes=64 << 20)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}")
    acked: list[tuple[float, int]] = []  # (ack time, offset after the batch)
    visible: list[tuple[float, int]] = []  # (poll time, table committed offset)
    done = asyncio.Event()

    async def poll() -> None:
        while not done.is_set():
            visible.append((time.perf_counter(), await _committed(channel, topic)))
            await asyncio.sleep(POLL_S)

    pool = payload_pool()
    poller = asyncio.create_task(poll()) if tables else None
    try:
        cpu0, start = tree_cpu(broker.pid), time.perf_counter()

        def on_ack(sent: float) -> object:
            def record(future: asyncio.Future[tuple[int, int]]) -> None:
                now = time.perf_counter()
                run.acks.append(now - sent)
                acked.append((now, future.result()[1] + 1))
            return record

        for i in range(count):
            due = time.perf_counter()
            if rate is not None:
                due = start + i * BATCH_RECORDS / rate
                if (wait := due - time.perf_counter()) > 0:
                    await asyncio.sleep(wait)
            future = await producer.send_batch(pool[i % len(pool)])
            future.add_done_callback(on_ack(due))  # type: ignore[arg-type]
        await producer.flush()
        last_ack = time.perf_counter()
        run.rate = count * BATCH_RECORDS / (last_ack - start)
        end = max(offset for _, offset in acked)
        if tables:
            while await _committed(channel, topic) < end:
                await asyncio.sleep(POLL_S)
            run.catch_up = time.perf_counter() - last_ack
        await quiet(broker.pid)
        run.cpu = tree_cpu(broker.pid) - cpu0
    finally:
        done.set()
        if poller is not None:
            await poller
        await producer.close()
        await channel.close()
    if tables:
        visible.append((time.perf_counter(), end))
        i = 0
        for at, offset in sorted(acked, key=lambda a: a[1]):
            while visible[i][1] < offset or visible[i][0] < at:
                i += 1
            run.freshness.append(visible[i][0] - at)
    run.freshness.sort()
    return run


def run_tables(options: Options) -> list[Result]:
    count = QUICK_COUNT if options.quick else COUNT
    paced_s = QUICK_PACED_S if options.quick else PACED_S
    scratch = Path(tempfile.mkdtemp(prefix="danube-bench-tables-", dir=options.parent_dir))
    got: dict[str, list[Run]] = {name: [] for name in CONFIGS}
    try:
        for r in range(options.runs):
            full_rate = None
            for name in CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS)):
                tables = name != "off"
                progress(f"run {r + 1}/{options.runs}: {name}")
                workdir = scratch / f"run{r}-{name}"
                broker = Broker(workdir, CONFIGS[name], die_with_parent=True)
                broker.start()
                try:
                    one = asyncio.run(_one(broker, count, tables))
                    full_rate = full_rate or one.rate
                    for paced, fraction in PACED:
                        rate = full_rate * fraction
                        batches = int(paced_s * rate / BATCH_RECORDS)
                        one.paced[paced] = asyncio.run(_one(broker, batches, tables,
                                                            f"/default/tables_bench_{paced}", rate))
                finally:
                    broker.stop()
                    shutil.rmtree(workdir, ignore_errors=True)  # 3.5 GB a broker: one at a time on disk
                got[name].append(one)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return summarise(got["off"], got["on"], count) + _threads(got["off"], got["on2"])


def summarise(offs: list[Run], ons: list[Run], count: int) -> list[Result]:
    runs = len(ons)
    mb = count * BATCH_RECORDS * RECORD_BYTES / MB
    p99_off = [percentile(sorted(r.acks), 0.99) * 1e3 for r in offs]
    p99_on = [percentile(sorted(r.acks), 0.99) * 1e3 for r in ons]
    rate_off, rate_on = [r.rate for r in offs], [r.rate for r in ons]
    return [
        Result("produce_off", "records/s", median(rate_off), runs),
        Result("produce_on", "records/s", median(rate_on), runs, median(rate_off),
               paired_ratio(rate_on, rate_off)),
        Result("ack_p99_off", "ms", median(p99_off), runs),
        Result("ack_p99_on", "ms", median(p99_on), runs, median(p99_off), paired_ratio(p99_on, p99_off),
               ACK_TARGET),
        Result("ack_p50_on", "ms", median([percentile(sorted(r.acks), 0.5) * 1e3 for r in ons]), runs),
        Result("freshness_p50", "s", median([percentile(r.freshness, 0.5) for r in ons]), runs),
        Result("freshness_p99", "s", median([percentile(r.freshness, 0.99) for r in ons]), runs,
               target=FRESHNESS_TARGET),
        Result("table_catch_up_s", "s", median([r.catch_up for r in ons]), runs),
        Result("writer_cpu_ms_per_mb", "ms/MB",
               median([(on.cpu - off.cpu) * 1e3 / mb for on, off in zip(ons, offs, strict=True)]), runs),
        *(result for name, _ in PACED for result in _paced(name, [r.paced[name] for r in offs],
                                                             [r.paced[name] for r in ons])),
    ]


def _paced(name: str, offs: list[Run], ons: list[Run]) -> list[Result]:
    runs = len(ons)
    p99_off = [percentile(sorted(r.acks), 0.99) * 1e3 for r in offs]
    p99_on = [percentile(sorted(r.acks), 0.99) * 1e3 for r in ons]
    return [
        Result(f"{name}_records_per_s", "records/s", median([r.rate for r in ons]), runs),
        Result(f"{name}_ack_p99_off", "ms", median(p99_off), runs),
        Result(f"{name}_ack_p99_on", "ms", median(p99_on), runs, median(p99_off),
               paired_ratio(p99_on, p99_off), ACK_TARGET),
        Result(f"{name}_ack_p99_late_off", "ms", median([_late_p99(r) for r in offs]), runs),
        Result(f"{name}_ack_p99_late_on", "ms", median([_late_p99(r) for r in ons]), runs,
               median([_late_p99(r) for r in offs]),
               paired_ratio([_late_p99(r) for r in ons], [_late_p99(r) for r in offs]), ACK_TARGET),
        Result(f"{name}_freshness_p50", "s", median([percentile(r.freshness, 0.5) for r in ons]), runs),
        Result(f"{name}_freshness_p99", "s", median([percentile(r.freshness, 0.99) for r in ons]), runs,
               target=FRESHNESS_TARGET),
    ]


def _threads(offs: list[Run], ons: list[Run]) -> list[Result]:
    """The `on2` broker's figures (`[tables] worker_threads` 2: a commit encoded as two files at once)."""
    runs = len(ons)
    out = []
    for label, off_runs, on_runs in (("", offs, ons), *((f"{name}_", [r.paced[name] for r in offs],
                                                        [r.paced[name] for r in ons]) for name, _ in PACED)):
        p99_off = [percentile(sorted(r.acks), 0.99) * 1e3 for r in off_runs]
        p99_on = [percentile(sorted(r.acks), 0.99) * 1e3 for r in on_runs]
        out += [Result(f"{label}ack_p99_on_threads2", "ms", median(p99_on), runs, median(p99_off),
                       paired_ratio(p99_on, p99_off), ACK_TARGET),
                Result(f"{label}freshness_p99_threads2", "s",
                       median([percentile(r.freshness, 0.99) for r in on_runs]), runs,
                       target=FRESHNESS_TARGET)]
    return out


def _late_p99(run: Run) -> float:
    """The ack p99 of the second half of a run's batches (ms): without what happens once, at the first table
    use (pyiceberg's imports, the first catalog load)."""
    return percentile(sorted(run.acks[len(run.acks) // 2:]), 0.99) * 1e3


def load_line(count: int) -> str:
    return (f"- Load: {count * BATCH_RECORDS:,} records of {RECORD_BYTES} B in batches of {BATCH_RECORDS} "
            f"(JSON-like events, {POOL_BATCHES * BATCH_RECORDS:,} distinct, cycled) through FastProducer to "
            "a Reliable topic at full speed, one fresh standalone broker per configuration (off: tableMode "
            "none; on: envelope, lag_ms 10 s; on2, figures *_threads2: the same with [tables] "
            f"worker_threads 2); the table's committed offset polled every "
            f"{POLL_S * 1000:g} ms")

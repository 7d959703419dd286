"""`python -m bench subscriptions`: what an operator's subscription calls cost on a large topic
(docs/SUBSCRIPTIONS.md).

Per run one fresh standalone broker: RECORDS records of RECORD_BYTES bytes through FastProducer, batches of
BATCH_RECORDS at full speed, to a Reliable topic (its segments upload to the folder object store as they
fill, so lookups cross objects and the WAL), and a subscription created at the earliest offset. Then, CALLS
times each, the SubscriptionAdmin call's round trip on the admin port:
- `seek_time_ms`: Seek to a time drawn at random from the produce's span, as a dry run: the binary search
  over batches (broker/positions.py offset_at_time). Each answer is checked: the offsets grow with the
  times asked.
- `seek_offset_ms` (the baseline): Seek to a random offset, as a dry run: the same call without a lookup.
- `seek_time_move_ms`: Seek to a random time for real (the cursor written to the metadata store).
- `peek_ms`: Peek of PEEK_COUNT records at the position.
- `skip_ms`: Skip of SKIP_RECORDS records as a dry run: a walk that counts records, reading their batches.
Medians and p99s over every call of every run (`runs` says how many runs).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import uvloop

from bench.broker import percentile
from bench.common import Options, Result, median, paired_ratio, progress
from danube_fast.client import FastProducer
from danube_fast.proto import SubscriptionAdmin_pb2 as pb
from danube_fast.proto import SubscriptionAdmin_pb2_grpc as pb_grpc
from danube_fast.testing.broker import Broker

RECORDS = 100_000_000
QUICK_RECORDS = 1_000_000
RECORD_BYTES = 16
BATCH_RECORDS = 10_000
CALLS = 50
PEEK_COUNT = 10
SKIP_RECORDS = 1_000_000
TOPIC = "/default/subscriptions_bench"
SUB = "ops"
IN_FLIGHT_BATCHES = 32

Figures = dict[str, list[float]]


async def fill(broker: Broker, records: int) -> tuple[int, int]:
    """The topic filled; the span of publish times (ms) it holds."""
    batch = [b"s" * RECORD_BYTES] * BATCH_RECORDS
    producer = await FastProducer.connect(broker.target, TOPIC, "bench", reliable=True,
                                          max_inflight_bytes=IN_FLIGHT_BATCHES * BATCH_RECORDS * 64)
    try:
        first = int(time.time() * 1000)
        for _ in range(records // BATCH_RECORDS):
            await producer.send_batch(batch)
        await producer.flush()
        return first, int(time.time() * 1000)
    finally:
        await producer.close()


async def timed(call: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    answer = await call
    return (time.perf_counter() - started) * 1000, answer


async def measure(broker: Broker, records: int, rng: random.Random) -> Figures:
    first_ms, last_ms = await fill(broker, records)
    names = ("seek_time_ms", "seek_offset_ms", "seek_time_move_ms", "peek_ms", "skip_ms")
    figures: Figures = {name: [] for name in names}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
        stub: Any = pb_grpc.SubscriptionAdminStub(channel)  # type: ignore[no-untyped-call]
        await stub.Create(pb.CreateRequest(topic=TOPIC, subscription=SUB, earliest=True), timeout=30)
        found: list[tuple[int, int]] = []
        for _ in range(CALLS):
            at = rng.randint(first_ms, last_ms)
            ms, answer = await timed(stub.Seek(pb.SeekRequest(topic=TOPIC, subscription=SUB, time_ms=at,
                                                              dry_run=True), timeout=60))
            figures["seek_time_ms"].append(ms)
            found.append((at, answer.positions[0].to_offset))
            ms, _ = await timed(stub.Seek(pb.SeekRequest(topic=TOPIC, subscription=SUB,
                                                         offset=rng.randrange(records), dry_run=True),
                                          timeout=60))
            figures["seek_offset_ms"].append(ms)
        found.sort()
        assert all(a[1] <= b[1] for a, b in itertools.pairwise(found)), "offsets must grow with time"
        for _ in range(CALLS):
            at = rng.randint(first_ms, last_ms)
            ms, _ = await timed(stub.Seek(pb.SeekRequest(topic=TOPIC, subscription=SUB, time_ms=at),
                                          timeout=60))
            figures["seek_time_move_ms"].append(ms)
            ms, _ = await timed(stub.Peek(pb.PeekRequest(topic=TOPIC, subscription=SUB, count=PEEK_COUNT),
                                          timeout=60))
            figures["peek_ms"].append(ms)
        for _ in range(max(3, CALLS // 10)):
            ms, _ = await timed(stub.Skip(pb.SkipRequest(topic=TOPIC, subscription=SUB, records=SKIP_RECORDS,
                                                         dry_run=True), timeout=120))
            figures["skip_ms"].append(ms)
    return figures


def run_subscriptions(options: Options) -> list[Result]:
    records = QUICK_RECORDS if options.quick else RECORDS
    scratch = Path(tempfile.mkdtemp(prefix="danube-bench-subscriptions-", dir=options.parent_dir))
    rng = random.Random(20261129)
    runs: list[Figures] = []
    try:
        for run in range(options.runs):
            broker = Broker(scratch / f"broker-{run}", die_with_parent=True)
            try:
                broker.start()
                with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                    figures = runner.run(measure(broker, records, rng))
            finally:
                broker.stop()
                shutil.rmtree(scratch / f"broker-{run}", ignore_errors=True)
            runs.append(figures)
            progress(f"run {run + 1}/{options.runs}: " + ", ".join(
                f"{k} p50 {median(v):.2f}" for k, v in figures.items()))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return summarise(runs)


def summarise(runs: list[Figures]) -> list[Result]:
    n = len(runs)
    every = {name: sorted(v for r in runs for v in r[name]) for name in runs[0]}
    out = []
    base = [median(r["seek_offset_ms"]) for r in runs]
    for name, values in every.items():
        if name == "seek_time_ms":
            out.append(Result(name, "ms", median(values), n, median(base),
                              paired_ratio([median(r[name]) for r in runs], base)))
        else:
            out.append(Result(name, "ms", median(values), n))
        out.append(Result(name.replace("_ms", "_p99_ms"), "ms", percentile(values, 0.99), n))
    return out


def load_line(records: int) -> str:
    return (f"- Load: {records:,} records of {RECORD_BYTES} B in batches of {BATCH_RECORDS:,} through "
            "FastProducer to a Reliable topic on a fresh standalone broker per run (segments uploaded to the "
            f"folder object store as they fill), a subscription at earliest; {CALLS} calls of each kind per "
            "run on the admin port (round trip), ratios against a dry-run Seek to an offset in the same run")

"""`python -m bench delayed`: what delayed delivery (docs/SUBSCRIPTIONS.md, "Delayed delivery") costs.

Per run, one fresh standalone broker whose resident size follows what it holds ([wal] cache_total_bytes
and [broker] malloc_keep_bytes at 16 MiB) and whose consumers may hold everything unacknowledged
([dispatch] window and window_bytes large: the figures are the dispatcher's, not the acks'):
- `pending_bytes_per_record`: the broker's RSS growth per record once PENDING records (RECORD_BYTES,
  through FastProducer in batches of BATCH_RECORDS) wait for a Shared subscription with deliver-at times
  spread over the next 24 h, measured when the subscription's floor has passed every one of them (all in
  the delay index). Baseline: the growth for as many records without a time, to a topic nobody subscribes
  to (what storing them costs the broker).
- `due_per_s`: records a second delivered to one official-client Shared consumer when DUE records become
  due at the same moment, from the first delivery to the last. Baseline: the same consumer reading as many
  plain records from a backlog of the same kind of topic.
- `delay_check_ns_per_record`: what looking for the attribute costs each record the per-message
  dispatcher reads (the only cost delayed delivery adds to ordinary Shared dispatch), measured in this
  process on decoded messages; `decode_ns_per_record`, the decode it comes with, for scale.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import uvloop
from danube import DanubeClientBuilder, SubType

from bench.common import Options, Result, median, paired_ratio, progress
from danube_fast import deliver_at
from danube_fast.broker import messages
from danube_fast.broker.dispatch.reliable import ReliableDispatcher
from danube_fast.client import FastProducer
from danube_fast.codec import frames
from danube_fast.proto import SubscriptionAdmin_pb2 as pb
from danube_fast.proto import SubscriptionAdmin_pb2_grpc as pb_grpc
from danube_fast.testing.broker import Broker

PENDING = 1_000_000
QUICK_PENDING = 20_000
DUE = 50_000
QUICK_DUE = 2_000
RECORD_BYTES = 16
BATCH_RECORDS = 10_000
DAY_MS = 86_400_000
CONFIG = ("[broker]\nmalloc_keep_bytes = 16777216\n[wal]\ncache_total_bytes = 16777216\n"
          "[dispatch]\nwindow = 1000000\nwindow_bytes = 1073741824\n")
Figures = dict[str, float]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def produce(broker: Broker, topic: str, count: int, at: Any) -> None:
    """`count` records to `topic`; `at(i)`: record i's deliver-at time (ms) or None."""
    producer = await FastProducer.connect(broker.target, topic, "bench", reliable=True)
    try:
        for first in range(0, count, BATCH_RECORDS):
            records = []
            for i in range(first, min(first + BATCH_RECORDS, count)):
                when = at(i)
                records.append(frames.Record(b"d" * RECORD_BYTES, attributes=None if when is None
                                             else deliver_at.attributes(when)))
            await producer.send_records(records)
        await producer.flush()
    finally:
        await producer.close()


async def backlog(stub: Any, topic: str, sub: str) -> int:
    got = await stub.Describe(pb.DescribeRequest(topic=topic, subscription=sub), timeout=30)
    return sum(p.backlog for p in got.partitions)


async def settle(pid: int) -> float:
    """The RSS once it stops moving (after a burst of work, freed memory goes back within a second)."""
    await asyncio.sleep(1.0)
    return rss_mb(pid)


async def receive_rate(queue: asyncio.Queue[Any], count: int, timeout: float) -> float:
    """Messages a second from the first of `count` to the last."""
    first = await asyncio.wait_for(queue.get(), timeout)
    started = time.perf_counter()
    del first
    for _ in range(count - 1):
        await asyncio.wait_for(queue.get(), timeout)
    return (count - 1) / (time.perf_counter() - started)


async def measure(broker: Broker, pending: int, due: int, run: int) -> Figures:
    out: Figures = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
        stub: Any = pb_grpc.SubscriptionAdminStub(channel)  # type: ignore[no-untyped-call]
        client = await DanubeClientBuilder().service_url(broker.url).build()
        # Memory: plain records to a topic nobody reads, then delayed ones to a topic a Shared sub reads.
        base = await settle(broker.pid)
        await produce(broker, f"/default/plain-{run}", pending, lambda i: None)
        stored = await settle(broker.pid)
        topic = f"/default/waiting-{run}"
        await produce(broker, topic, 1, lambda i: None)  # the topic, before its subscription
        consumer = client.new_consumer().with_topic(topic).with_consumer_name("c") \
            .with_subscription("s").with_subscription_type(SubType.SHARED).build()
        await consumer.subscribe()
        await consumer.receive()
        now = deliver_at.now_ms()
        await produce(broker, topic, pending, lambda i: now + 3_600_000 + i * DAY_MS // pending)
        while await backlog(stub, topic, "s") > 1:
            await asyncio.sleep(0.2)
        waiting = await settle(broker.pid)
        out["plain_bytes_per_record"] = (stored - base) * 1024 * 1024 / pending
        out["pending_bytes_per_record"] = (waiting - stored) * 1024 * 1024 / pending
        await consumer.close()
        # Dispatch: plain records from a backlog, then as many due at once.
        for kind in ("backlog", "due"):
            topic = f"/default/{kind}-{run}"
            await produce(broker, topic, 1, lambda i: None)
            consumer = client.new_consumer().with_topic(topic).with_consumer_name("c") \
                .with_subscription("s").with_subscription_type(SubType.SHARED).build()
            await consumer.subscribe()
            queue = await consumer.receive()
            if kind == "backlog":
                await consumer.close()  # the records wait in the WAL until it is back
                await produce(broker, topic, due, lambda i: None)
                consumer = client.new_consumer().with_topic(topic).with_consumer_name("c") \
                    .with_subscription("s").with_subscription_type(SubType.SHARED).build()
                await consumer.subscribe()
                queue = await consumer.receive()
            else:
                due_at = deliver_at.now_ms() + 5_000 + due // 10  # after the produce and its indexing
                await produce(broker, topic, due, lambda i, t=due_at: t)
                assert deliver_at.now_ms() < due_at, "the produce outlasted the delay"
            out[f"{kind}_per_s"] = await receive_rate(queue, due, 120)
            await consumer.close()
    return out


def delay_check() -> Figures:
    """ns per record: the attribute lookup the dispatcher adds, and the decode it follows."""
    batch = frames.encode_batch([frames.Record(b"d" * RECORD_BYTES, attributes={"trace": "t"})
                                 for _ in range(BATCH_RECORDS)], producer_id=1, producer_name="p")
    delay_of = ReliableDispatcher.delay_of
    decode, check = [], []
    for _ in range(5):
        started = time.perf_counter()
        msgs = messages.decode(batch, "/default/t", 0)
        decode.append(time.perf_counter() - started)
        started = time.perf_counter()
        for m in msgs:
            delay_of(m)
        check.append(time.perf_counter() - started)
    return {"decode_ns_per_record": median(decode) * 1e9 / BATCH_RECORDS,
            "delay_check_ns_per_record": median(check) * 1e9 / BATCH_RECORDS}


def run_delayed(options: Options) -> list[Result]:
    pending = QUICK_PENDING if options.quick else PENDING
    due = QUICK_DUE if options.quick else DUE
    scratch = Path(tempfile.mkdtemp(prefix="danube-bench-delayed-", dir=options.parent_dir))
    runs: list[Figures] = []
    try:
        for run in range(options.runs):
            broker = Broker(scratch / f"broker-{run}", CONFIG, die_with_parent=True)
            try:
                broker.start()
                with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                    figures = runner.run(measure(broker, pending, due, run))
            finally:
                broker.stop()
                shutil.rmtree(scratch / f"broker-{run}", ignore_errors=True)
            figures.update(delay_check())
            runs.append(figures)
            progress(f"run {run + 1}/{options.runs}: "
                     + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    n = len(runs)

    def each(name: str) -> list[float]:
        return [r[name] for r in runs]

    return [
        Result("plain_bytes_per_record", "B", median(each("plain_bytes_per_record")), n),
        Result("pending_bytes_per_record", "B", median(each("pending_bytes_per_record")), n),
        Result("backlog_per_s", "records/s", median(each("backlog_per_s")), n),
        Result("due_per_s", "records/s", median(each("due_per_s")), n, median(each("backlog_per_s")),
               paired_ratio(each("due_per_s"), each("backlog_per_s"))),
        Result("decode_ns_per_record", "ns", median(each("decode_ns_per_record")), n),
        Result("delay_check_ns_per_record", "ns", median(each("delay_check_ns_per_record")), n,
               median(each("decode_ns_per_record")),
               paired_ratio(each("delay_check_ns_per_record"), each("decode_ns_per_record"))),
    ]


def load_line(pending: int, due: int) -> str:
    return (f"- Load: {pending:,} records of {RECORD_BYTES} B waiting over 24 h for a Shared subscription "
            f"(RSS per record, against as many plain records stored); {due:,} due at once delivered to one "
            "official-client Shared consumer (against as many plain records from a backlog); a fresh "
            "standalone broker per run with [wal] cache_total_bytes and [broker] malloc_keep_bytes at 16 MiB")

"""`python -m bench topics [--topics N] [--step S] [--json] [--dir DIR] [--plot PATH]`: what a broker pays per
topic as topics grow.

A standalone broker (a subprocess, started by the harness, danube_fast/testing) gets N Reliable topics, each
created by a FastProducer that sends one batch of RECORDS records of RECORD_BYTES bytes, waits for its
acknowledgement and closes; CONCURRENCY producers at a time. After every S topics the broker's thread count
and RSS are read from /proc, and the creation rate of those S topics (topics/s) is recorded.

The figures: threads, RSS (MiB) and creation rate at the end, and the rate at the end against the rate of
the first step (1.0: creating a topic costs as much at N topics as at the first S). The broker uploads each
topic's records to the object tier UPLOAD_INTERVAL_MS after they arrive (the default is 30 s), so that every
step pays for the uploads of the topics made just before it: with the default, the first 30 s of topics
were made with no upload running and the rest with one upload per topic, and the ratio compared the two.
One run: a topic count is not noise-limited the way a throughput is, and the run takes minutes at 10,000.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import uvloop

from bench import results
from bench.common import describe_machine, machine_info, median, progress, text_table
from danube_fast.client import FastProducer
from danube_fast.testing.broker import Broker

TOPICS = 10_000
QUICK_TOPICS = 300
STEP = 500
QUICK_STEP = 100
CONCURRENCY = 16
RECORDS = 10
RECORD_BYTES = 256
TITLE = "Topics per broker"
AGGREGATE_TOPICS = 1000
AGGREGATE_BATCH = 100
SINGLE_INFLIGHT = 64  # unacknowledged batches of the lone producer (bench fast's figure)
AGGREGATE_INFLIGHT = 2  # ... and of each of the 1,000
AGGREGATE_SECONDS = 8.0
AGGREGATE_ROUNDS = 3
AGGREGATE_CONFIG = """[wal]
sync = "always"
"""
UPLOAD_INTERVAL_MS = 1000
CONFIG = f"""[wal]
sync = "always"

[cluster]
upload_interval_ms = {UPLOAD_INTERVAL_MS}
"""


@dataclass(frozen=True)
class Step:
    topics: int  # topics created so far
    seconds: float  # time the last step took
    rate: float  # topics/s over the last step
    threads: int  # the broker's threads now
    rss_mib: float  # the broker's resident memory now


def proc_status(pid: int) -> tuple[int, float]:
    """(threads, RSS in MiB) of process `pid`."""
    threads, rss = 0, 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            threads = int(line.split()[1])
        elif line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return threads, rss


async def create_topics(target: str, first: int, count: int) -> None:
    """Topics first .. first + count - 1, each made by a producer that sends one acknowledged batch."""
    batch = [bytes(RECORD_BYTES)] * RECORDS
    queue = iter(range(first, first + count))

    async def worker() -> None:
        for i in queue:
            producer = await FastProducer.connect(target, f"/default/topic-{i}", "p")
            try:
                await (await producer.send_batch(batch))
            finally:
                await producer.close()

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


async def produce_rate(target: str, topics: int, inflight: int, seconds: float) -> float:
    """Records/s acknowledged while one FastProducer per topic (topic-0 .. topic-{topics - 1}, which exist)
    sends AGGREGATE_BATCH-record batches back to back, each with up to `inflight` unacknowledged; after a
    warm-up of a fifth of `seconds`."""
    batch = [bytes(RECORD_BYTES)] * AGGREGATE_BATCH
    producers = await asyncio.gather(*(FastProducer.connect(target, f"/default/topic-{i}", f"agg-{i}")
                                       for i in range(topics)))
    counting = False
    acked = 0
    stop = asyncio.Event()

    async def send(producer: FastProducer, slots: asyncio.Semaphore) -> None:
        nonlocal acked
        while not stop.is_set():
            await slots.acquire()
            future = await producer.send_batch(batch)

            def done(f: asyncio.Future[tuple[int, int]]) -> None:
                nonlocal acked
                slots.release()
                if counting and not f.cancelled() and f.exception() is None:
                    acked += AGGREGATE_BATCH

            future.add_done_callback(done)

    tasks = [asyncio.create_task(send(p, asyncio.Semaphore(inflight))) for p in producers]
    await asyncio.sleep(seconds / 5)
    counting = True
    start = time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - start
    rate = acked / elapsed
    stop.set()
    await asyncio.gather(*(p.flush() for p in producers), return_exceptions=True)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*(p.close() for p in producers))
    return rate


async def measure(broker: Broker, topics: int, step: int) -> list[Step]:
    pid = broker.pid
    steps = []
    made = 0
    while made < topics:
        count = min(step, topics - made)
        start = time.perf_counter()
        await create_topics(broker.target, made, count)
        seconds = time.perf_counter() - start
        made += count
        threads, rss = proc_status(pid)
        steps.append(Step(made, round(seconds, 3), round(count / seconds, 1), threads, round(rss, 1)))
        progress(f"{made:>6} topics: {count / seconds:7.1f} topics/s, {threads} threads, {rss:.0f} MiB")
    return steps


@dataclass(frozen=True)
class Aggregate:
    """Reliable produce, records/s per round: one topic's producer (`single`) and one producer on each of
    `topics` topics at once (`many`), alternating on one broker."""

    topics: int
    single: list[float]
    many: list[float]

    @property
    def ratio(self) -> float:
        return median([m / s for m, s in zip(self.many, self.single, strict=True)])


async def aggregate(broker: Broker, topics: int, rounds: int, seconds: float) -> Aggregate:
    await create_topics(broker.target, 0, topics)
    single: list[float] = []
    many: list[float] = []
    for r in range(rounds):
        single.append(await produce_rate(broker.target, 1, SINGLE_INFLIGHT, seconds))
        many.append(await produce_rate(broker.target, topics, AGGREGATE_INFLIGHT, seconds))
        progress(f"round {r + 1}: one topic {single[-1]:,.0f} records/s, {topics:,} topics {many[-1]:,.0f}")
    return Aggregate(topics, single, many)


def summary(steps: list[Step], agg: Aggregate | None = None) -> dict[str, float]:
    last = steps[-1]
    figures = {"topics": last.topics, "threads": last.threads, "rss_mib": last.rss_mib,
               "rate_first_step": steps[0].rate, "rate_last_step": last.rate,
               "rate_last_over_first": round(last.rate / steps[0].rate, 3)}
    if agg is not None and agg.single:
        figures.update(aggregate_topics=agg.topics, aggregate_single=round(median(agg.single)),
                       aggregate_many=round(median(agg.many)), aggregate_ratio=round(agg.ratio, 3))
    return figures


def plot(steps: list[Step], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [s.topics for s in steps]
    fig, axes = plt.subplots(3, 1, figsize=(7, 8), sharex=True)
    for ax, values, label in ((axes[0], [s.threads for s in steps], "broker threads"),
                              (axes[1], [s.rss_mib for s in steps], "broker RSS (MiB)"),
                              (axes[2], [s.rate for s in steps], "topics created per second")):
        ax.plot(x, values, marker="o")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes[2].set_xlabel("Reliable topics on the broker")
    fig.suptitle("One broker as Reliable topics grow")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def section(steps: list[Step], info: dict[str, object], command: str, date: str,
            agg: Aggregate | None = None) -> str:
    """The RESULTS.md section: the targets' figures, then every step."""
    figures = summary(steps, agg)
    lines = results.head_lines(TITLE, info, command, date, "one run (see bench/topics.py)", False)
    lines += [
        f"- Load: Reliable topics (sync = always), each created by a FastProducer that sends one batch of "
        f"{RECORDS} records of {RECORD_BYTES} B and waits for its acknowledgement; {CONCURRENCY} producers "
        f"at a time; records uploaded to the object tier (a folder) {UPLOAD_INTERVAL_MS} ms after they "
        "arrive; the broker's threads and RSS read from /proc after each step",
        "",
        "| figure | value | target | met? |",
        "|:---|---:|:---|:---:|",
        f"| broker threads at {figures['topics']:,} topics | {figures['threads']} | <= 32 | "
        f"{'yes' if figures['threads'] <= 32 else 'NO'} |",
        f"| broker RSS (MiB) at {figures['topics']:,} topics | {figures['rss_mib']:.0f} | <= 1024 | "
        f"{'yes' if figures['rss_mib'] <= 1024 else 'NO'} |",
        f"| creation rate, last step / first step | {figures['rate_last_over_first']:.2f} | >= 0.5 | "
        f"{'yes' if figures['rate_last_over_first'] >= 0.5 else 'NO'} |",
    ]
    if agg is not None and "aggregate_ratio" in figures:
        many, single = figures["aggregate_many"], figures["aggregate_single"]
        ratio = figures["aggregate_ratio"]
        lines += [
            f"| Reliable produce, one producer on each of {agg.topics:,} topics (records/s) | {many:,} | | |",
            f"| Reliable produce, one topic's producer (records/s) | {single:,} | | |",
            f"| ratio, {agg.topics:,} topics / one topic (median of {len(agg.single)} paired rounds) | "
            f"{ratio:.2f} | >= 0.8 | {'yes' if ratio >= 0.8 else 'NO'} |",
        ]
    lines += [
        "",
        "| topics | topics/s (last step) | threads | RSS MiB |",
        "|---:|---:|---:|---:|",
    ]
    lines += [f"| {s.topics:,} | {s.rate:.1f} | {s.threads} | {s.rss_mib:.0f} |" for s in steps]
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace, argv: list[str]) -> int:
    topics = args.topics or (QUICK_TOPICS if args.quick else TOPICS)
    step = args.step or (QUICK_STEP if args.quick else STEP)
    info = machine_info(args.dir)
    progress(f"machine: {describe_machine(info)}; load average {info['load_average_1m']}")
    scratch = Path(tempfile.mkdtemp(prefix="bench-topics-", dir=args.dir))
    agg = None
    try:
        broker = Broker(scratch / "broker", CONFIG, metrics=False, die_with_parent=True)
        try:
            broker.start()
            steps = uvloop.run(measure(broker, topics, step))
        finally:
            broker.stop()
        rounds = AGGREGATE_ROUNDS if args.aggregate_rounds is None else args.aggregate_rounds
        if rounds:
            # A fresh broker with the default upload interval: the 1 s uploads of the creation phase would
            # upload every one of the 1,000 topics every second.
            broker = Broker(scratch / "aggregate", AGGREGATE_CONFIG, metrics=False, die_with_parent=True)
            try:
                broker.start()
                agg = uvloop.run(aggregate(broker, args.aggregate_topics or AGGREGATE_TOPICS, rounds,
                                           args.aggregate_seconds or AGGREGATE_SECONDS))
            finally:
                broker.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    figures = summary(steps, agg)
    if args.json:
        print(json.dumps({"machine": describe_machine(info), "summary": figures,
                          "steps": [asdict(s) for s in steps],
                          "aggregate": asdict(agg) if agg is not None else None}))
    else:
        print(f"machine: {describe_machine(info)}\n")
        rows = [(f"{s.topics:,}", f"{s.rate:.1f}", str(s.threads), f"{s.rss_mib:.0f}") for s in steps]
        columns = ["topics", "topics/s (last step)", "threads", "RSS MiB"]
        print("\n".join(text_table(columns, rows, {0, 1, 2, 3})))
        print(f"\nat {figures['topics']:,} topics: {figures['threads']} threads, {figures['rss_mib']:.0f} "
              f"MiB; creation rate at the end / at the start: {figures['rate_last_over_first']:.2f}")
        if agg is not None:
            print(f"Reliable produce: {agg.topics:,} topics {figures['aggregate_many']:,} records/s, one "
                  f"topic {figures['aggregate_single']:,}: {figures['aggregate_ratio']:.2f}")
    if args.plot:
        plot(steps, Path(args.plot))
        progress(f"plot: {args.plot}")
    if args.write_results:
        command = shlex.join(["python", "-m", "bench", *argv])
        date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        results.write_section(TITLE, section(steps, info, command, date, agg))
        progress(f"wrote the {TITLE} section of {results.RESULTS_PATH}")
    return 0


"""`python -m bench.large_records`: an A/B probe of large records through a standalone broker.

    python -m bench.large_records --size 65536 --mib 512 --rounds 3 \\
        --variant default --variant 'direct reads: wal.direct_reads=true'

Per round and variant: a fresh standalone broker (its config file from the variant's settings), a
FastProducer in this process sending `--mib` MiB of `--size`-byte records (`send_batch` of at most 1 MiB, 64
batches in flight, every ack checked), then one FastConsumer catching up on them (a cumulative ack per
delivery). Prints produce and consume MB/s with the CPU seconds the broker (every thread, /proc) and this
process used in each phase. Variants take turns within each round, so that this machine's drift falls on
all of them alike; compare variants within one run, never across runs.

Not a recorded suite (nothing goes to RESULTS.md): the decision records in docs/decisions/ name the
command that made them. `python -m bench e2e` gives the figures against the peers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import uvloop

from bench.common import CLIENT_KEEP_BYTES
from bench.peers.servers import _running
from danube_fast.allocator import keep_freed_memory
from danube_fast.client import FastConsumer, FastProducer
from danube_fast.testing.broker import Broker

BATCH_BYTES = 1 << 20
IN_FLIGHT = 64
TOPIC, SUBSCRIPTION = "/default/large", "probe"


@dataclass(frozen=True)
class Variant:
    name: str
    config: str  # TOML of the broker's config file; "" = the defaults


def parse_variant(text: str) -> Variant:
    """`NAME` or `NAME: section.key=value, section.key=value` (values as TOML writes them)."""
    name, _, settings = text.partition(":")
    sections: dict[str, list[str]] = {}
    for item in filter(None, (part.strip() for part in settings.split(","))):
        key, sep, value = item.partition("=")
        section, dot, option = key.strip().partition(".")
        if not sep or not section or not dot or not option:
            raise argparse.ArgumentTypeError(f"{item!r} is not section.key=value")
        sections.setdefault(section, []).append(f"{option} = {value.strip()}")
    config = "".join(f"[{section}]\n" + "".join(f"{line}\n" for line in lines)
                     for section, lines in sections.items())
    return Variant(name.strip(), config)


@dataclass(frozen=True)
class Phase:
    mb_per_s: float
    broker_cpu_s: float
    client_cpu_s: float


def broker_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_round(target: str, pid: int, size: int, total: int) -> tuple[Phase, Phase]:
    per = max(1, BATCH_BYTES // size)
    count = -(-total // (per * size)) * per
    producer = await FastProducer.connect(target, TOPIC, "probe", reliable=True, batch_records=per,
                                          batch_bytes=BATCH_BYTES)
    await (await FastConsumer.connect(target, TOPIC, SUBSCRIPTION, "c")).close()  # reads from the start
    payloads = [os.urandom(size)] * per
    room = asyncio.Semaphore(IN_FLIGHT)
    acked: list[tuple[int, int]] = []

    def done(future: asyncio.Future[tuple[int, int]]) -> None:
        room.release()
        if not future.cancelled() and future.exception() is None:
            acked.append(future.result())

    b0, c0, t0 = broker_cpu(pid), time.process_time(), time.perf_counter()
    futures = []
    for _ in range(count // per):
        await room.acquire()
        future = await producer.send_batch(payloads)
        future.add_done_callback(done)
        futures.append(future)
    await asyncio.gather(*futures)
    produce = Phase(count * size / (time.perf_counter() - t0) / 1e6, broker_cpu(pid) - b0,
                    time.process_time() - c0)
    await producer.close()
    if sum(last - first + 1 for first, last in acked) != count:
        stored = sum(last - first + 1 for first, last in acked)
        raise RuntimeError(f"acknowledged {stored} of {count} records")
    consumer = await FastConsumer.connect(target, TOPIC, SUBSCRIPTION, "c")
    b0, c0, t0, got = broker_cpu(pid), time.process_time(), time.perf_counter(), 0
    async for delivery in consumer.batches():
        got += delivery.last_offset - delivery.first_offset + 1
        await consumer.ack_cumulative(delivery.last_offset)
        if got >= count:
            break
    consume = Phase(got * size / (time.perf_counter() - t0) / 1e6, broker_cpu(pid) - b0,
                    time.process_time() - c0)
    await consumer.close()
    return produce, consume


def run(variants: Sequence[Variant], size: int, mib: int, rounds: int, scratch: Path) -> None:
    width = max(len(v.name) for v in variants)
    print(f"{'round':>5}  {'variant':<{width}}  {'produce MB/s':>12}  {'broker s':>8}  {'client s':>8}  "
          f"{'consume MB/s':>12}  {'broker s':>8}  {'client s':>8}", flush=True)
    for r in range(1, rounds + 1):
        for variant in variants:
            workdir = scratch / f"broker-{r}-{variants.index(variant)}"
            broker = Broker(workdir, variant.config or None, metrics=False, die_with_parent=True)
            with _running(broker) as server:
                produce, consume = uvloop.run(one_round(f"{server.host}:{server.port}", server.pid, size,
                                                        mib << 20))
            shutil.rmtree(workdir, ignore_errors=True)
            cells = [f"{phase.mb_per_s:>12,.0f}  {phase.broker_cpu_s:>8.2f}  {phase.client_cpu_s:>8.2f}"
                     for phase in (produce, consume)]
            print(f"{r:>5}  {variant.name:<{width}}  {cells[0]}  {cells[1]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.large_records",
                                     description="An A/B probe of large records through a standalone broker.")
    parser.add_argument("--size", type=int, default=65536, help="bytes per record (default 65536)")
    parser.add_argument("--mib", type=int, default=512, help="MiB produced per round (default 512)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", type=parse_variant, action="append", dest="variants",
                        help="NAME or 'NAME: section.key=value, ...' (repeat; default: one 'default')")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.size < 1 or args.mib < 1 or args.rounds < 1:
        parser.error("--size, --mib and --rounds must be at least 1")
    keep_freed_memory(CLIENT_KEEP_BYTES)  # as every bench client process
    variants = args.variants or [Variant("default", "")]
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="large-records-") as scratch:
        run(variants, args.size, args.mib, args.rounds, Path(scratch))
    return 0


if __name__ == "__main__":
    sys.exit(main())

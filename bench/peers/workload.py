"""What every peer runs and what it reports: the workload, one phase's measurement, and their figures.

A workload is N records of S bytes from P producers to C consumers on one stream, at a durability setting.
Each peer runs it in these phases, after a short warm-up on a stream of its own:

- produce: the P producers publish N records as fast as the server acknowledges them, at most `window`
  records unacknowledged per producer. Every record's ack is checked. Ack latency is per record: from just
  before the record is handed to the client to the moment its ack is seen, for clients that ack records one
  by one (NATS); for clients that ack a pipeline at once (Redis), every record of the chunk gets the chunk's
  latency, from just before the chunk is sent to its last reply.
- consume: the C consumers read those N records from the start of the stream (a catch-up read), acking
  them as the peer's consumer acks, until all N are in.
- consume_noack: one reader reads them again, keeping its position itself (no acks, nothing written).
- e2e: on a new stream, producers and consumers at once, producers paced at `e2e_rate` records/s in
  total (by default half the produce phase's rate, where ack latency means something: at full speed it is
  the window's queueing time); end-to-end latency is per record, from a perf_counter_ns timestamp written
  into the payload just before publishing to its receipt by a consumer (both in this process).

CPU time is counted per phase for the server process (every thread, /proc/PID/stat) and for this process
(getrusage, every thread): on a 2-core machine both compete for the cores, so CPU per record is the steadier
figure of what each side costs.
"""

from __future__ import annotations

import asyncio
import copy
import math
import resource
import struct
import time
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from typing import Protocol

from bench.common import MB, Result, median, no_gc, process_cpu

PACE_SLEEP = 0.001  # seconds: uvloop's timer resolution
STALL_TIMEOUT = 30.0  # seconds without a record received before a phase is declared stuck
STAMP = struct.Struct("<qq")  # an e2e payload starts with (perf_counter_ns just before publishing, sequence)
PHASES = ("produce", "consume", "consume_noack", "e2e")


@dataclass(frozen=True)
class Workload:
    """The workload of one run of one peer. `durability` is the label the peer's figures carry."""

    size: int = 256  # bytes per record, payload only (at least STAMP.size)
    records: int = 100_000  # N, per phase
    producers: int = 1  # P
    consumers: int = 1  # C
    durability: str = ""
    window: int = 1024  # records a producer may have unacknowledged
    batch: int = 256  # records per pipeline (Redis), per cumulative ack, per read request
    e2e_rate: float | None = None  # records/s offered in the e2e phase; None: half the produce rate
    warmup: int = 2_000  # records produced and consumed on a stream of their own before the phases
    phases: tuple[str, ...] = PHASES  # which phases run_phases runs, in PHASES order; produce always

    def __post_init__(self) -> None:
        if self.size < STAMP.size:
            raise ValueError(f"records must hold at least {STAMP.size} bytes (the e2e timestamp)")
        if min(self.records, self.producers, self.consumers, self.window, self.batch) < 1:
            raise ValueError("records, producers, consumers, window and batch must be at least 1")
        if "produce" not in self.phases or not set(self.phases) <= set(PHASES):
            raise ValueError(f"phases must include produce and be among {PHASES}, not {self.phases}")

    def shares(self, total: int | None = None) -> list[int]:
        """`total` (default N) records split over the producers, the first ones taking the remainder."""
        n = self.records if total is None else total
        return [n // self.producers + (i < n % self.producers) for i in range(self.producers)]

    def payload(self) -> bytes:
        """The produce phase's record: the same bytes every time, like a prebuilt batch."""
        return bytes(range(256)) * (self.size // 256) + bytes(self.size % 256)


def stamped(filler: bytes, seq: int) -> bytes:
    """An e2e record: the send time and the sequence number, then `filler` up to the record size."""
    return STAMP.pack(time.perf_counter_ns(), seq) + filler


def e2e_filler(workload: Workload) -> bytes:
    return workload.payload()[STAMP.size:]


def sent_at_ns(payload: bytes) -> int:
    sent: int = STAMP.unpack_from(payload)[0]
    return sent


class Pacer:
    """Paces one producer at `rate` records/s: records are due on a schedule from the first call, and a
    producer that is ahead sleeps until the next one is due, at least a millisecond (uvloop's timer
    resolution), so records go out in bursts of about a millisecond's worth."""

    def __init__(self, rate: float) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, not {rate}")
        self.rate = rate
        self.t0: float | None = None

    async def due(self, sent: int) -> int:
        """How many records are due by now, once it is more than `sent` (waiting if need be)."""
        now = time.perf_counter()
        if self.t0 is None:
            self.t0 = now
        while True:
            due = int((now - self.t0) * self.rate) + 1
            if due > sent:
                return due
            # Never less than the timer resolution: a shorter sleep returns at once, and the loop would spin.
            await asyncio.sleep(max(PACE_SLEEP, self.t0 + sent / self.rate - now))
            now = time.perf_counter()


class Tally:
    """What the consumers of one phase received: a count, and in the e2e phase each record's latency.
    `wait()` returns once `total` records are in."""

    def __init__(self, total: int, e2e: bool) -> None:
        self.total = total
        self.count = 0
        self.e2e = Latencies() if e2e else None
        self.done = asyncio.Event()
        self.finished_at = 0.0  # perf_counter when the last record came in

    def add(self, records: int) -> None:
        self.count += records
        if self.count >= self.total and not self.done.is_set():
            self.finished_at = time.perf_counter()
            self.done.set()

    def received_one(self, payload: bytes) -> None:
        if self.e2e is not None:
            self.e2e.values.append((time.perf_counter_ns() - STAMP.unpack_from(payload)[0]) * 1e-9)
        self.add(1)

    def received(self, payloads: Sequence[bytes]) -> None:
        """Count these records and, in the e2e phase, their latencies from the stamp in each payload."""
        if self.e2e is not None:
            now, values, unpack = time.perf_counter_ns(), self.e2e.values, STAMP.unpack_from
            for payload in payloads:
                values.append((now - unpack(payload)[0]) * 1e-9)
        self.add(len(payloads))

    async def wait(self, what: str) -> None:
        """Until every record is in; RuntimeError if none comes in for STALL_TIMEOUT seconds."""
        last = -1
        while not self.done.is_set():
            if self.count == last:
                raise RuntimeError(f"{what}: {self.count} of {self.total} records received, then nothing "
                                   f"for {STALL_TIMEOUT:.0f} s")
            last = self.count
            with suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), STALL_TIMEOUT)
        if self.count != self.total:
            raise RuntimeError(f"{what}: {self.count} records received, {self.total} sent (redeliveries?)")


class Latencies:
    """Latencies in seconds, one per record (a chunk's latency is added once per record in it)."""

    def __init__(self) -> None:
        self.values = array("d")

    def add(self, seconds: float, records: int = 1) -> None:
        if records == 1:
            self.values.append(seconds)
        else:
            self.values.extend([seconds] * records)

    def __len__(self) -> int:
        return len(self.values)

    def percentiles(self) -> Percentiles | None:
        return Percentiles.of(self.values) if self.values else None


@dataclass(frozen=True)
class Percentiles:
    """p50, p99, p99.9 and max of one phase, in milliseconds (nearest rank)."""

    p50: float
    p99: float
    p999: float
    max: float

    @staticmethod
    def of(seconds: Sequence[float]) -> Percentiles:
        ordered = sorted(seconds)

        def rank(q: float) -> float:
            return ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1e3

        return Percentiles(rank(0.5), rank(0.99), rank(0.999), ordered[-1] * 1e3)


@dataclass(frozen=True)
class Measurement:
    """One phase of one run: counts, wall and CPU seconds, latency percentiles."""

    phase: str  # produce, consume, consume_noack, e2e
    records: int
    size: int
    wall_s: float
    server_cpu_s: float  # the server process, every thread
    client_cpu_s: float  # this process (producers and consumers), every thread
    ack_ms: Percentiles | None = None  # produce and e2e: publish to ack
    e2e_ms: Percentiles | None = None  # e2e: publish to receipt
    offered_rate: float | None = None  # e2e: the producers' pace, records/s
    # Every latency behind ack_ms and e2e_ms (seconds, one per record): for plots of their distribution.
    ack_s: Sequence[float] = field(default=(), repr=False)
    e2e_s: Sequence[float] = field(default=(), repr=False)

    @property
    def records_per_s(self) -> float:
        return self.records / self.wall_s

    @property
    def mb_per_s(self) -> float:
        return self.records * self.size / self.wall_s / MB


def client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Usage:
    started: float = 0.0  # perf_counter at the start of the section
    wall_s: float = 0.0
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0


@contextmanager
def metered(server_pid: int) -> Iterator[Usage]:
    """Wall and CPU seconds of the body, with the cyclic GC off in this process."""
    usage = Usage()
    with no_gc():
        server0, client0 = process_cpu(server_pid), client_cpu()
        usage.started = time.perf_counter()
        yield usage
        usage.wall_s = time.perf_counter() - usage.started
        usage.client_cpu_s = client_cpu() - client0
        usage.server_cpu_s = process_cpu(server_pid) - server0


def measurement(phase: str, workload: Workload, records: int, usage: Usage, ack: Latencies | None = None,
                e2e: Latencies | None = None, offered_rate: float | None = None,
                finished_at: float | None = None) -> Measurement:
    """`finished_at` (perf_counter; default: the end of the metered section) ends the wall time: the
    consumers' last receipt, when the section goes on after it."""
    wall_s = usage.wall_s if finished_at is None else finished_at - usage.started
    return Measurement(phase, records, workload.size, wall_s, usage.server_cpu_s, usage.client_cpu_s,
                       None if ack is None else ack.percentiles(), None if e2e is None else e2e.percentiles(),
                       offered_rate, () if ack is None else ack.values, () if e2e is None else e2e.values)


# -- figures --------------------------------------------------------------------------------------------


@dataclass
class _Series:
    unit: str
    values: list[float] = field(default_factory=list)


def figure_prefix(peer: str, workload: Workload) -> str:
    """e.g. `redis_aof_always_256b`, or `nats_file_sync2m_4096b_p2c2` with 2 producers and 2 consumers."""
    shape = "" if workload.producers == workload.consumers == 1 else \
        f"_p{workload.producers}c{workload.consumers}"
    return f"{peer}_{workload.durability}_{workload.size}b{shape}"


def _phase_series(m: Measurement) -> Iterator[tuple[str, str, float]]:
    """(suffix, unit, value) of every figure of one phase."""
    yield "", "records/s", m.records_per_s
    yield "_mbps", "MB/s", m.mb_per_s
    for kind, pct in (("ack", m.ack_ms), ("", m.e2e_ms)):
        if pct is not None:
            tag = f"_{kind}" if kind else ""
            yield f"{tag}_p50", "ms", pct.p50
            yield f"{tag}_p99", "ms", pct.p99
            yield f"{tag}_p999", "ms", pct.p999
            yield f"{tag}_max", "ms", pct.max
    if m.offered_rate is not None:
        yield "_offered", "records/s", m.offered_rate
    yield "_server_cpu", "µs/record", m.server_cpu_s / m.records * 1e6
    yield "_client_cpu", "µs/record", m.client_cpu_s / m.records * 1e6


def figures(prefix: str, runs: Sequence[Sequence[Measurement]]) -> list[Result]:
    """One Result per figure: the median over the runs (each run a list of phase measurements)."""
    series: dict[str, _Series] = {}
    for run in runs:
        for m in run:
            for suffix, unit, value in _phase_series(m):
                series.setdefault(f"{prefix}_{m.phase}{suffix}", _Series(unit)).values.append(value)
    return [Result(name, s.unit, median(s.values), len(s.values)) for name, s in series.items()]


class Peer(Protocol):
    """What nats_peer.Peer and redis_peer.Peer offer the run loop: one phase per method."""

    workload: Workload

    async def produce(self, label: str) -> Measurement: ...
    async def consume(self, label: str) -> Measurement: ...
    async def consume_noack(self, label: str) -> Measurement: ...
    async def e2e(self, label: str, rate: float) -> Measurement: ...
    async def close(self) -> None: ...


async def run_phases(peer: Peer, workload: Workload) -> list[Measurement]:
    """Warm-up (produce and consume on the same connections), then those of `workload.phases`: produce,
    consume with and without acks, and end to end at `workload.e2e_rate` (default: half the measured
    produce rate). Closes the peer."""
    try:
        if workload.warmup:
            warm = copy.copy(peer)  # the same connections
            warm.workload = replace(workload, records=workload.warmup)
            await warm.produce("warmup")
            await warm.consume("warmup")
        produce = await peer.produce("bench")
        found = [produce]
        if "consume" in workload.phases:
            found.append(await peer.consume("bench"))
        if "consume_noack" in workload.phases:
            found.append(await peer.consume_noack("bench"))
        if "e2e" in workload.phases:
            found.append(await peer.e2e("bench_e2e", workload.e2e_rate or produce.records_per_s / 2))
        return found
    finally:
        await peer.close()

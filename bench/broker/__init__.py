"""`python -m bench broker`: the official Python client (danube-client, unchanged) through the broker, next
to a bare grpc.aio server measured in the same run at the same concurrency.

Three processes: this one is the load generator (uvloop); the broker (`danube-fast broker`, standalone, data
dir in a scratch directory under --dir) and the bare server (bench/broker/bare_server.py) are subprocesses
(started by the harness, danube_fast/testing), so no two share a GIL. Only one server is loaded at a time.
A fresh broker is started for every run; the bare server lives for the whole session (it keeps no state).

Per run, in the same run and at the same concurrency (CONCURRENCY tasks, PAYLOAD_BYTES payloads):

- `bare_unary`: a raw grpc.aio stub calling the bare server's SendMessage with the StreamMessage the client
  would send. The baseline of both produce figures.
- `produce_nonreliable` / `produce_reliable`: `Producer.send` on a topic whose first producer chose that
  dispatch strategy (Reliable: appended to the WAL and fsynced before the answer).
- `bare_stream`: the bare server's ReceiveMessages streaming prebuilt StreamMessages to a raw stub. The
  baseline of the consume figure.
- `consume_reliable`: end to end. A Reliable topic, a Shared consumer receiving while CONCURRENCY tasks send
  and CONCURRENCY tasks take messages off the client's receive queue and ack them; delivered messages/s from
  the first send to the last receipt, and per-message latency from just before `send` to the receipt
  (a perf_counter timestamp in the payload: producer and consumer are both in this process).

Throughputs are msgs/s; latencies are per send (produce: the await of `send`; bare: the await of the RPC) or
per message (consume), p50 and p99 in ms. `*_server_cpu` is the server process's CPU time (user + system,
every thread, from /proc) per message over the timed section: what the broker spends on a message next to
what gRPC alone spends, a figure that does not depend on who wins the cores when the load generator and the
server together saturate the machine (on 2 cores they do). Every figure is the median over the runs; ratios
are broker / bare per run, then the median of those (bare and broker take turns going first). Each timed
section follows a warm-up at the same concurrency and runs with the cyclic GC off in this process (not in
the servers).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import uvloop
from danube import DanubeClientBuilder, DispatchStrategy, SubType

from bench.broker import bare_server
from bench.common import (
    CLOCK_TICKS,
    Options,
    Result,
    Target,
    median,
    no_gc,
    paired_ratio,
    process_cpu,
    progress,
)
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc
from danube_fast.testing.broker import Broker
from danube_fast.testing.ports import free_port
from danube_fast.testing.process import ServerProcess

CONCURRENCY = 64
PAYLOAD_BYTES = bare_server.PAYLOAD_BYTES
TARGET = Target(">= 80% of baseline", ">=", 0.8, of="ratio")
OTHERS_WARNING = 0.3  # cores used by other processes during a timed section that earn a warning
DELIVERY_TIMEOUT = 30.0  # seconds after the last send for the last message to be received and acked
RUNS_NOTE = "every run starts a fresh broker; ratios are the median of the per-run broker / bare ratios"
STAMP = struct.Struct("<qq")  # consume payloads start with (perf_counter_ns at send, sequence number)


@dataclass(frozen=True)
class Sizes:
    produce: int  # messages per timed produce figure (bare_unary too)
    consume: int  # messages per timed end-to-end consume figure
    stream: int  # messages per timed bare stream
    warmup: int  # messages sent (or streamed) before each timed section

    @staticmethod
    def of(quick: bool) -> Sizes:
        if quick:
            return Sizes(produce=2_000, consume=1_000, stream=10_000, warmup=300)
        return Sizes(produce=10_000, consume=5_000, stream=50_000, warmup=1_000)


@dataclass(frozen=True)
class Sample:
    """One figure of one run."""

    rate: float  # messages per second
    p50: float | None  # ms (None: not measured, the bare stream)
    p99: float | None
    server_us: float  # CPU time of the server process (every thread) per message, µs
    server_busy: float  # the server's CPU seconds per second of the timed section (1.0 = one core)
    client_busy: float  # the same for this process
    others_busy: float  # the same for everything else on the machine: should be near 0


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of an ascending list."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


# -- CPU accounting -------------------------------------------------------------------------------------

def own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def machine_cpu() -> float:
    """CPU seconds every core of the machine spent busy (not idle, not waiting for I/O) since boot."""
    with open("/proc/stat", encoding="ascii") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already counted in user and nice)
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / CLOCK_TICKS


@dataclass
class Usage:
    """Wall and CPU seconds of a timed section, for the server process and this one."""

    wall: float = 0.0
    server: float = 0.0
    client: float = 0.0
    machine: float = 0.0


@contextmanager
def metered(server_pid: int) -> Iterator[Usage]:
    """Time the body with the cyclic GC off in this process, and count both processes' CPU time."""
    usage = Usage()
    with no_gc():
        machine0, server0, client0 = machine_cpu(), process_cpu(server_pid), own_cpu()
        wall0 = time.perf_counter()
        yield usage
        usage.wall = time.perf_counter() - wall0
        usage.client = own_cpu() - client0
        usage.server = process_cpu(server_pid) - server0
        usage.machine = machine_cpu() - machine0


def make_sample(count: int, elapsed: float, latencies_s: list[float] | None, usage: Usage) -> Sample:
    p50 = p99 = None
    if latencies_s is not None:
        latencies_s.sort()
        p50, p99 = percentile(latencies_s, 0.5) * 1e3, percentile(latencies_s, 0.99) * 1e3
    others = max(0.0, usage.machine - usage.server - usage.client)
    return Sample(count / elapsed, p50, p99, usage.server / count * 1e6, usage.server / usage.wall,
                  usage.client / usage.wall, others / usage.wall)


# -- server processes -----------------------------------------------------------------------------------


def start_broker(workdir: Path, native: bool = False) -> Broker:
    """A standalone broker with its data (metadata store, WALs) and log in `workdir` (`native`: serving the
    native transport too)."""
    broker = Broker(workdir, die_with_parent=True, native=native)
    _started(broker)
    return broker


def start_bare_server(log_path: Path) -> ServerProcess:
    return _start_bare("bare server", "bench.broker.bare_server", bare_server.READY, log_path)


def start_bare_native(log_path: Path) -> ServerProcess:
    """bench/broker/bare_native.py: the native transport's frames with nothing behind them."""
    from bench.broker import bare_native

    return _start_bare("bare native server", "bench.broker.bare_native", bare_native.READY, log_path)


def _start_bare(name: str, module: str, ready: str, log_path: Path) -> ServerProcess:
    port = free_port()
    server = ServerProcess(name, [sys.executable, "-m", module, "--port", str(port)], log_path,
                           ready_text=ready, port=port, die_with_parent=True)
    _started(server)
    return server


def _started(server: ServerProcess) -> None:
    try:
        server.start()
    except BaseException:
        server.stop()
        raise


# -- load -----------------------------------------------------------------------------------------------


async def drive(send: Callable[[], Awaitable[object]], total: int, latencies: list[float] | None) -> None:
    """`total` calls of `send`, CONCURRENCY at a time; each call's duration (s) appended to `latencies`."""
    remaining = total
    clock = time.perf_counter

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            start = clock()
            await send()
            if latencies is not None:
                latencies.append(clock() - start)

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


async def unary_load(send: Callable[[], Awaitable[object]], server_pid: int, sizes: Sizes) -> Sample:
    await drive(send, sizes.warmup, None)
    latencies: list[float] = []
    with metered(server_pid) as usage:
        await drive(send, sizes.produce, latencies)
    return make_sample(sizes.produce, usage.wall, latencies, usage)


def payload() -> bytes:
    return bytes(range(256)) * (PAYLOAD_BYTES // 256) + bytes(PAYLOAD_BYTES % 256)


# -- the bare server ------------------------------------------------------------------------------------


async def bare_unary(channel: grpc.aio.Channel, server: ServerProcess, sizes: Sizes) -> Sample:
    """SendMessage through a raw stub, building per call the StreamMessage the client's send builds."""
    stub = pb_grpc.ProducerServiceStub(channel)  # type: ignore[no-untyped-call]
    ids = itertools.count(1)
    data = payload()
    broker_addr = server.url

    async def send() -> None:
        msg = pb.StreamMessage(request_id=next(ids), payload=data, publish_time=int(time.time() * 1000),
                               producer_name="bare-producer", subscription_name="", attributes={},
                               msg_id=pb.MsgID(producer_id=1, topic_name=bare_server.TOPIC,
                                               broker_addr=broker_addr))
        await stub.SendMessage(msg, metadata=None)

    return await unary_load(send, server.pid, sizes)


async def bare_stream(channel: grpc.aio.Channel, server: ServerProcess, sizes: Sizes) -> Sample:
    """Messages per second read from one ReceiveMessages stream of `sizes.stream` prebuilt messages."""
    stub = pb_grpc.ConsumerServiceStub(channel)  # type: ignore[no-untyped-call]

    async def read(count: int) -> int:
        got = 0
        async for msg in stub.ReceiveMessages(pb.ReceiveRequest(request_id=1, consumer_id=count)):
            got += len(msg.payload) > 0
        return got

    await read(sizes.warmup)
    with metered(server.pid) as usage:
        got = await read(sizes.stream)
    if got != sizes.stream:
        raise RuntimeError(f"the bare stream delivered {got} messages, not {sizes.stream}")
    return make_sample(got, usage.wall, None, usage)


# -- the broker, through the official client ------------------------------------------------------------


async def close_client(client: Any) -> None:
    """danube-client 0.5.0 has no close: close the channels its connection manager opened."""
    for conn in list(client.connection_manager._connections.values()):
        await conn.channel.close()


def new_producer(client: Any, topic: str, strategy: DispatchStrategy) -> Any:
    return (client.new_producer().with_topic(topic).with_name("bench-producer")
            .with_dispatch_strategy(strategy).build())


async def produce(client: Any, server: ServerProcess, topic: str, strategy: DispatchStrategy, sizes: Sizes
                  ) -> Sample:
    producer = new_producer(client, topic, strategy)
    await producer.create()  # the topic's first producer: it fixes the dispatch strategy
    data = payload()

    def send() -> Awaitable[object]:
        sent: Awaitable[object] = producer.send(data)
        return sent

    try:
        return await unary_load(send, server.pid, sizes)
    finally:
        await producer.close()


async def consume(client: Any, server: ServerProcess, topic: str, strategy: DispatchStrategy, sizes: Sizes
                  ) -> Sample:
    """End to end: CONCURRENCY senders and CONCURRENCY receivers (take from the client's queue, ack)."""
    producer = new_producer(client, topic, strategy)
    await producer.create()  # first: a consumer can only subscribe to a topic that exists
    consumer = (client.new_consumer().with_topic(topic).with_consumer_name("bench-consumer")
                .with_subscription("bench").with_subscription_type(SubType.SHARED).build())
    try:
        await consumer.subscribe()  # before the first send: a new subscription starts at the latest offset
        queue = await consumer.receive()
        await end_to_end(producer, consumer, queue, 0, sizes.warmup, None)
        latencies: list[float] = []
        with metered(server.pid) as usage:
            elapsed = await end_to_end(producer, consumer, queue, sizes.warmup, sizes.consume, latencies)
        return make_sample(sizes.consume, elapsed, latencies, usage)
    finally:
        await consumer.close()
        await producer.close()


async def end_to_end(producer: Any, consumer: Any, queue: asyncio.Queue[Any], first: int, total: int,
                     latencies: list[float] | None) -> float:
    """Send sequence numbers first..first+total-1 and wait until each was received and acked; returns the
    seconds from the first send to the last first receipt (what comes after is the last acks)."""
    pad = bytes(PAYLOAD_BYTES - STAMP.size)
    end = first + total
    next_seq = first
    seen: set[int] = set()
    acked = 0
    acked_all = asyncio.Event()
    clock = time.perf_counter_ns
    last_receipt = 0

    async def send() -> None:
        nonlocal next_seq
        while next_seq < end:
            seq = next_seq
            next_seq += 1
            await producer.send(STAMP.pack(clock(), seq) + pad)

    async def receive() -> None:
        nonlocal acked, last_receipt
        while True:
            msg = await queue.get()
            now = clock()
            sent, seq = STAMP.unpack_from(msg.payload)
            fresh = first <= seq < end and seq not in seen  # a redelivery or a warm-up straggler is not
            if fresh:
                seen.add(seq)
                last_receipt = now
                if latencies is not None:
                    latencies.append((now - sent) / 1e9)
            await consumer.ack(msg)
            if fresh:
                acked += 1
                if acked == total:
                    acked_all.set()

    receivers = [asyncio.create_task(receive()) for _ in range(CONCURRENCY)]
    try:
        start = clock()
        await asyncio.gather(*(send() for _ in range(CONCURRENCY)))
        try:
            await asyncio.wait_for(acked_all.wait(), DELIVERY_TIMEOUT)
        except TimeoutError:
            raise RuntimeError(f"end to end: {len(seen)} of {total} messages received and {acked} acked "
                               f"{DELIVERY_TIMEOUT:.0f} s after the last send") from None
    finally:
        for task in receivers:
            task.cancel()
        await asyncio.gather(*receivers, return_exceptions=True)
    return (last_receipt - start) / 1e9


# -- one run, the session -------------------------------------------------------------------------------

Figures = dict[str, Sample]


async def measure_bare(server: ServerProcess, sizes: Sizes) -> Figures:
    channel = grpc.aio.insecure_channel(server.target)
    try:
        unary = await bare_unary(channel, server, sizes)
        stream = await bare_stream(channel, server, sizes)
    finally:
        await channel.close()
    return {"bare_unary": unary, "bare_stream": stream}


async def measure_broker(server: ServerProcess, run: int, sizes: Sizes) -> Figures:
    client = await DanubeClientBuilder().service_url(server.url).build()
    topic = f"/default/bench-{run}"
    try:
        return {
            "produce_nonreliable": await produce(client, server, f"{topic}-nonreliable",
                                                 DispatchStrategy.NON_RELIABLE, sizes),
            "produce_reliable": await produce(client, server, f"{topic}-reliable", DispatchStrategy.RELIABLE,
                                              sizes),
            "consume_reliable": await consume(client, server, f"{topic}-consume", DispatchStrategy.RELIABLE,
                                              sizes),
        }
    finally:
        await close_client(client)


def describe(name: str, s: Sample) -> str:
    latency = "" if s.p50 is None else f", p50 {s.p50:.2f} ms, p99 {s.p99:.2f} ms"
    return (f"{name} {s.rate:,.0f} msgs/s{latency}, server {s.server_us:.0f} µs CPU/msg; cores busy: "
            f"server {s.server_busy:.2f}, load generator {s.client_busy:.2f}, others {s.others_busy:.2f}")


def run_broker(options: Options) -> list[Result]:
    sizes = Sizes.of(options.quick)
    scratch = Path(tempfile.mkdtemp(prefix="danube-bench-broker-", dir=options.parent_dir))
    runs: list[Figures] = []
    bare: ServerProcess | None = None
    try:
        bare = start_bare_server(scratch / "bare.log")
        for run in range(options.runs):
            broker = start_broker(scratch / f"broker-{run}")
            figures: Figures = {}
            try:
                with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                    for side in ("bare", "broker") if run % 2 == 0 else ("broker", "bare"):
                        figures.update(runner.run(measure_bare(bare, sizes) if side == "bare"
                                                  else measure_broker(broker, run, sizes)))
            finally:
                broker.stop()
            runs.append(figures)
            for name in FIGURE_ORDER:
                progress(f"run {run + 1}/{options.runs} {describe(name, figures[name])}")
            others, busiest = max((figures[name].others_busy, name) for name in FIGURE_ORDER)
            if others > OTHERS_WARNING:
                progress(f"WARNING: other processes kept {others:.2f} cores busy during {busiest}: "
                         "this run's figures describe a shared machine")
    finally:
        if bare is not None:
            bare.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return summarise(runs)


FIGURE_ORDER = ("bare_unary", "produce_nonreliable", "produce_reliable", "bare_stream", "consume_reliable")


def summarise(runs: list[Figures]) -> list[Result]:
    n = len(runs)

    def values(name: str, field: str) -> list[float]:
        out = []
        for figures in runs:
            value = getattr(figures[name], field)
            assert isinstance(value, float)
            out.append(value)
        return out

    def figure(name: str, unit: str, ours: list[float], base: list[float] | None,
               target: Target | None = None) -> Result:
        if base is None:
            return Result(name, unit, median(ours), n, target=target)
        return Result(name, unit, median(ours), n, median(base), paired_ratio(ours, base), target)

    results = [figure("bare_unary", "msgs/s", values("bare_unary", "rate"), None)]
    for name in ("produce_nonreliable", "produce_reliable"):
        results.append(figure(name, "msgs/s", values(name, "rate"), values("bare_unary", "rate"), TARGET))
        for q in ("p50", "p99"):
            results.append(figure(f"{name}_{q}", "ms", values(name, q), values("bare_unary", q)))
        results.append(figure(f"{name}_server_cpu", "µs/msg", values(name, "server_us"),
                              values("bare_unary", "server_us")))
    results.append(figure("bare_stream", "msgs/s", values("bare_stream", "rate"), None))
    name = "consume_reliable"
    results.append(figure(name, "msgs/s", values(name, "rate"), values("bare_stream", "rate")))
    for q in ("p50", "p99"):
        results.append(figure(f"{name}_{q}", "ms", values(name, q), None))
    # What the same RPCs cost a bare server: a SendMessage, an Ack (a unary call too), a streamed message.
    unary_us, stream_us = values("bare_unary", "server_us"), values("bare_stream", "server_us")
    bare_rpcs = [2 * u + s for u, s in zip(unary_us, stream_us, strict=True)]
    results.append(figure(f"{name}_server_cpu", "µs/msg", values(name, "server_us"), bare_rpcs))
    return results


def load_line() -> str:
    """The RESULTS.md line saying what load the figures are under."""
    from importlib.metadata import version

    return (f"- Load: {CONCURRENCY} concurrent senders (consuming: and {CONCURRENCY} receivers acking), "
            f"{PAYLOAD_BYTES} B payloads, danube-client {version('danube-client')} unchanged, grpcio "
            f"{grpc.__version__}; broker and bare server are subprocesses, the load generator (uvloop) is "
            "this process")

"""The workload against our broker (standalone, Reliable topics) through our fast client
(danube_fast.client: FastProducer, FastConsumer), for `python -m bench e2e`. The clients take the native
transport (frames on TCP, docs/TRANSPORT.md), which a standalone broker serves by default, as a user's do.

- Produce: `FastProducer.send_batch` of `batch_records(size)` records (1,000, fewer where that passes
  BATCH_BYTES), at most IN_FLIGHT batches unacknowledged per producer; the bound is our own semaphore, taken
  before the clock starts (as for NATS), so the client's byte bound never binds. A batch is acknowledged
  once it is appended to the topic's WAL and fdatasync'd. Ack latency is per batch, from `send_batch` to
  its ack, counted once per record in it (as Redis pipelines are). Every ack is checked, and the offsets
  acknowledged must add up to N.
- Consume: a catch-up read through one FastConsumer of a subscription made before the first record was
  produced (a new subscription starts at the topic's end), a cumulative ack per delivery (a delivery is one
  or more whole batches from the WAL, within the consumer's window of unacknowledged bytes). Subscriptions
  of the fast API are exclusive, so the workload takes one consumer.
- consume_noack is not offered: the fast API has no reader that keeps its position itself.
- End to end: one `FastProducer.send` per record as the pacer makes records due, batched by the producer:
  a batch ships when it holds `batch_records(size)` records or `linger_ms` after its first record. Ack
  latency is per batch, from the `send` of its first record (the one that waited longest) to its ack,
  counted once per record in it. The consumer reads each delivery's timestamps (receive_stamped).
  Why a linger and not one `send_batch` of the records due at each pacer tick: the pacer wakes whenever
  the previous send returns, so the batch rate follows the send rate, not the offered rate; measured on
  the 2-core VM at 50,000 records/s of 256 B, that sent ~2,200 batches of ~20 records a second, more than
  the broker serves (~0.45 ms of broker CPU per batch), and acks took 370 ms at p50. With a 1 ms linger,
  about 1,000 batches a second: p50 2.9 ms, p99 7.3 ms at the same rate.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
from collections.abc import Awaitable, Callable
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import uvloop

from bench.peers.workload import (
    Latencies,
    Measurement,
    Pacer,
    Tally,
    Workload,
    e2e_filler,
    measurement,
    metered,
    run_phases,
    stamped,
)
from danube_fast.client import Delivery, FastConsumer, FastProducer
from danube_fast.codec import frames
from danube_fast.storage.config import SyncPolicy
from danube_fast.testing.process import ServerProcess

PEER = "danube"
DURABILITY = "reliable_fsync"  # [wal] sync = "always", the default
DURABILITY_TEXT = ("Reliable topic, standalone broker: acked once the batch is appended to the WAL and "
                   "fdatasync'd (group commit)")
SUBSCRIPTION = "bench"
BATCH_RECORDS = 1000
BATCH_BYTES = 1 << 20  # of payload per batch at most, as FastProducer's default batch_bytes
IN_FLIGHT = 64  # batches a producer may have unacknowledged at full speed (the broker's per-stream bound)
SENT_NS = struct.Struct("<q")  # the send time, at the head of workload.STAMP
BULK_DECODE_RECORDS = 256  # deliveries of this many records or more are decoded through Arrow
NO_BOUND = 1 << 40  # the client's own in-flight byte bound, set out of reach of IN_FLIGHT batches


def receive_stamped(tally: Tally, delivery: Delivery, start: int) -> None:
    """Count a delivery's records from offset `start` on, with the latency of each from the send time at
    the head of its payload. Large deliveries are decoded in bulk through Arrow (0.1 µs a record, but 40 µs
    a call); small ones record by record (0.25 µs a record), as the other peers' payloads are."""
    if delivery.last_offset - delivery.first_offset < BULK_DECODE_RECORDS:
        tally.received([r.payload for r in frames.decode_records(delivery.data, verify=False)
                        if r.offset >= start])
        return
    values = frames.decode_arrow(delivery.data, verify=False).column("value")
    if start > delivery.first_offset:
        values = values.slice(start - delivery.first_offset)
    heads = pc.binary_slice(values, 0, SENT_NS.size).cast(pa.binary(SENT_NS.size))
    sent = np.frombuffer(heads.buffers()[1], dtype=SENT_NS.format, count=len(heads),
                         offset=heads.offset * SENT_NS.size)
    assert tally.e2e is not None
    tally.e2e.values.frombytes(((time.perf_counter_ns() - sent) * 1e-9).tobytes())
    tally.add(len(sent))


def durability(sync: SyncPolicy) -> str:
    """The label of our broker with this `[wal] sync` (a config file's, `bench e2e --broker-config`)."""
    if sync.mode == "always":
        return DURABILITY
    return "reliable_nofsync" if sync.mode == "none" else f"reliable_sync{sync.interval_ms}ms"


def durability_text(sync: SyncPolicy) -> str:
    if sync.mode == "always":
        return DURABILITY_TEXT
    when = ("fdatasync only when a segment rolls and at close" if sync.mode == "none" else
            f"fdatasync at most {sync.interval_ms} ms later")
    return (f"Reliable topic, standalone broker, [wal] sync = {sync}: acked once the batch is written to the "
            f"WAL (the page cache); {when}")


def batch_records(size: int) -> int:
    """Records per batch for records of `size` bytes: BATCH_RECORDS, fewer for large records."""
    return max(1, min(BATCH_RECORDS, BATCH_BYTES // size))


def batching_text(workload: Workload, linger_ms: float) -> str:
    n = batch_records(workload.size)
    return (f"send_batch of {n:,} records, up to {IN_FLIGHT} batches in flight per producer; at a fixed rate "
            f"send() per record, a batch ships at {n:,} records or {linger_ms:g} ms after its first record; "
            "ack latency per batch, from the send() of its first record, counted per record")


class Acks:
    """The acks of one phase: records acknowledged, and the batches that failed."""

    def __init__(self) -> None:
        self.acked = 0
        self.errors: list[BaseException] = []

    def done(self, start: float, ack: Latencies, future: asyncio.Future[tuple[int, int]]) -> None:
        """A batch's future is done: its latency from `start`, once per record of it."""
        if future.cancelled():
            self.errors.append(asyncio.CancelledError())
        elif (error := future.exception()) is not None:
            self.errors.append(error)
        else:
            first, last = future.result()  # the batch's offsets, so its record count
            self.acked += last - first + 1
            ack.add(time.perf_counter() - start, last - first + 1)

    def check(self, expected: int) -> None:
        if self.errors:
            raise RuntimeError(f"{len(self.errors)} batches failed; the first: {self.errors[0]!r}")
        if self.acked != expected:
            raise RuntimeError(f"{self.acked} records acknowledged, {expected} sent")


class Peer:
    """One run against one broker: producers and consumers are made per phase (a producer is bound to a
    topic), outside the timed sections."""

    def __init__(self, server: ServerProcess, workload: Workload, linger_ms: float) -> None:
        if workload.consumers != 1:
            raise ValueError(f"{PEER}: the fast API's subscriptions are exclusive: one consumer, not "
                             f"{workload.consumers}")
        self.target = f"{server.host}:{server.port}"
        self.server = server
        self.workload = workload
        self.linger_ms = linger_ms

    async def close(self) -> None:
        pass  # every phase closes what it opened

    async def _producers(self, topic: str, paced: bool) -> list[FastProducer]:
        n = batch_records(self.workload.size)
        return [await FastProducer.connect(self.target, topic, f"p{i}", reliable=True, batch_records=n,
                                           batch_bytes=BATCH_BYTES, linger_ms=self.linger_ms,
                                           max_inflight_bytes=IN_FLIGHT * BATCH_BYTES if paced else NO_BOUND)
                for i in range(self.workload.producers)]

    @staticmethod
    async def _close(producers: list[FastProducer]) -> None:
        for producer in producers:
            await producer.close()

    # -- produce ----------------------------------------------------------------------------------------

    async def _produce_one(self, producer: FastProducer, count: int, ack: Latencies, outcome: Acks
                           ) -> None:
        per_batch = batch_records(self.workload.size)
        payloads = [self.workload.payload()] * per_batch
        window = asyncio.Semaphore(IN_FLIGHT)
        sent = 0
        while sent < count:
            n = min(per_batch, count - sent)
            await window.acquire()
            start = time.perf_counter()
            future = await producer.send_batch(payloads if n == per_batch else payloads[:n])
            future.add_done_callback(partial(outcome.done, start, ack))
            future.add_done_callback(lambda _f: window.release())
            sent += n
        await producer.flush()

    async def produce(self, label: str) -> Measurement:
        topic = f"/default/{label}"
        producers = await self._producers(topic, paced=False)  # the first one creates the topic
        try:
            # The consume phase's subscription, made while the topic is empty: it will start at offset 0.
            await (await FastConsumer.connect(self.target, topic, SUBSCRIPTION, "c0")).close()
            ack, outcome = Latencies(), Acks()
            with metered(self.server.pid) as usage:
                await asyncio.gather(*(self._produce_one(p, n, ack, outcome)
                                       for p, n in zip(producers, self.workload.shares(), strict=True)))
        finally:
            await self._close(producers)
        outcome.check(self.workload.records)
        return measurement("produce", self.workload, self.workload.records, usage, ack=ack)

    # -- consume ----------------------------------------------------------------------------------------

    @staticmethod
    async def _receive(consumer: FastConsumer, tally: Tally) -> None:
        """Deliveries until the tally is full, a cumulative ack after each; in the e2e phase the records
        are decoded for the timestamps in their payloads."""
        start = consumer.start_offset
        async for delivery in consumer.batches():
            if tally.e2e is None:
                tally.add(delivery.last_offset - max(delivery.first_offset, start) + 1)
            else:
                receive_stamped(tally, delivery, start)
            await consumer.ack_cumulative(delivery.last_offset)
            if tally.done.is_set():
                return
        raise RuntimeError(f"{PEER}: the broker ended the Consume stream after {tally.count} records")

    async def consume(self, label: str) -> Measurement:
        tally = Tally(self.workload.records, e2e=False)
        with metered(self.server.pid) as usage:
            consumer = await FastConsumer.connect(self.target, f"/default/{label}", SUBSCRIPTION, "c0")
            try:
                await self._receive(consumer, tally)
            finally:
                await consumer.close()
        return measurement("consume", self.workload, tally.count, usage, finished_at=tally.finished_at)

    async def consume_noack(self, label: str) -> Measurement:
        raise NotImplementedError(f"{PEER}: the fast API has no reader that keeps its position itself")

    # -- end to end -------------------------------------------------------------------------------------

    async def _paced(self, producer: FastProducer, count: int, seq0: int, pacer: Pacer, ack: Latencies,
                     outcome: Acks) -> None:
        filler = e2e_filler(self.workload)
        clock = time.perf_counter
        current: asyncio.Future[tuple[int, int]] | None = None
        sent = 0
        while sent < count:
            due = min(count, await pacer.due(sent))
            while sent < due:
                start = clock()
                future = await producer.send(stamped(filler, seq0 + sent))
                if future is not current:  # the record opened a batch
                    current = future
                    future.add_done_callback(partial(outcome.done, start, ack))
                sent += 1
        await producer.flush()

    async def e2e(self, label: str, rate: float) -> Measurement:
        topic = f"/default/{label}"
        producers = await self._producers(topic, paced=True)
        consumer = await FastConsumer.connect(self.target, topic, SUBSCRIPTION, "c0")
        tally = Tally(self.workload.records, e2e=True)
        receiving = asyncio.create_task(self._receive(consumer, tally))
        ack, outcome = Latencies(), Acks()
        shares = self.workload.shares()
        seq0s = itertools.accumulate(shares[:-1], initial=0)
        sending: list[Awaitable[None]] = [
            self._paced(p, n, seq0, Pacer(rate / len(shares)), ack, outcome)
            for p, n, seq0 in zip(producers, shares, seq0s, strict=True)]
        waiting = asyncio.create_task(tally.wait(f"{PEER} e2e"))
        try:
            with metered(self.server.pid) as usage:
                await asyncio.gather(*sending)
                await asyncio.wait([receiving, waiting], return_when=asyncio.FIRST_COMPLETED)
            if receiving.done():
                receiving.result()  # raises what stopped it before the last record
            await waiting  # raises a stall
            await receiving  # returns right after the ack of the last delivery
        finally:
            receiving.cancel()
            waiting.cancel()
            await consumer.close()
            await self._close(producers)
        outcome.check(self.workload.records)
        return measurement("e2e", self.workload, tally.count, usage, ack=ack, e2e=tally.e2e,
                           offered_rate=rate, finished_at=tally.finished_at)


def runner(linger_ms: float) -> Callable[[ServerProcess, Workload], list[Measurement]]:
    """`run(server, workload)`: one run of the workload's phases against a running broker, on uvloop, the
    fixed-rate producers lingering `linger_ms`."""

    def run(server: ServerProcess, workload: Workload) -> list[Measurement]:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as loop:
            return loop.run(run_phases(Peer(server, workload, linger_ms), workload))

    return run

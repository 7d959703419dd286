"""The workload against RabbitMQ Streams (one node, the stream plugin) through rstream, the official Python
client of the stream protocol, on asyncio.

- Produce: `Producer.send_batch`, batches of `batch` records (fewer for large records: a batch is one
  Publish frame, which must fit the connection's frame_max, 1 MiB by default on both sides), up to
  `window // batch` batches unconfirmed per producer, each producer on its own connection. `send_batch`
  returns once the frame is written; the server confirms every record once its chunk is in the stream
  (see servers.py: written to the segment file, the page cache, never fsynced). Confirms come to one callback
  per producer, record by record; a record's publishing id says its batch (ids are ours, `_Confirms`), and
  a batch is acknowledged when its last record is confirmed: ack latency is per batch, from `send_batch`
  (which encodes and sends it) to its last confirm, and counts once per record in it. Every confirm is
  checked, and the records confirmed are counted against those sent.
- Consume: a named consumer (`subscriber_name`) subscribed at the first offset, credit-based flow (the
  server sends `CREDIT` chunks ahead; the client grants one more per chunk delivered), one callback per
  record. A stream has no per-record acks: a consumer's position is an offset the server keeps for its name
  when asked (`store_offset`, written into the stream as tracking data). The consume phase stores it every
  `batch` records and at the end, and checks it with `query_offset`: the counterpart of the other peers'
  cumulative acks. The phase ends when every record was read.
- Consume, no acks (`consume_noack`): an unnamed consumer from the first offset; the position is the
  client's, nothing is written.
- End to end: the consumer (named, storing its offset as in the consume phase) reads the new stream live
  while the producers send paced batches.

A stream's consumers each read every record (no competing consumers on one stream; super streams partition
a stream), so this peer runs with one consumer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import uvloop
from rstream import (
    ConfirmationStatus,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
    RawMessage,
)

from bench.peers.servers import RABBITMQ_USER
from bench.peers.workload import (
    STALL_TIMEOUT,
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
from danube_fast.testing.process import ServerProcess

PEER = "rabbitmq"
DURABILITY = "segment_nofsync"
DURABILITY_TEXT = ("stream, 1 node: confirmed once written to the stream's segment file (page cache); "
                   "streams never fsync")
CONSUMER_NAME = "bench"  # the name the consume and e2e phases store their offsets under
# Chunks the server may send ahead of the consumer (the subscription's initial credit; rstream's default).
CREDIT = 10
# A Publish frame must fit the connection's frame_max (rstream's default, and the server's stream.frame_max
# default): 13 bytes of frame header, then 12 per record (publishing id and length) and the record.
FRAME_MAX = 1 << 20
FRAME_OVERHEAD = 13
RECORD_OVERHEAD = 12


def batch_records(workload: Workload) -> int:
    """Records per Publish frame: `batch`, or as many as fit in FRAME_MAX."""
    return max(1, min(workload.batch, (FRAME_MAX - FRAME_OVERHEAD) // (workload.size + RECORD_OVERHEAD)))


def in_flight(workload: Workload) -> int:
    """Batches a producer may have unconfirmed."""
    return max(1, workload.window // workload.batch)


def batching_text(workload: Workload) -> str:
    return (f"send_batch of up to {batch_records(workload):,} records (one Publish frame; at a fixed rate: "
            f"the records due), up to {in_flight(workload)} unconfirmed per producer; ack latency per batch, "
            "counted per record")


class _Confirms:
    """The unconfirmed batches of one producer. Batch k carries the publishing ids k * cap + 1 to
    k * cap + n (n <= cap): ids only have to grow, and the batch of a confirm is one division away.
    `slots` bounds the batches in flight; a slot is taken before a batch is built and freed by its last
    confirm."""

    def __init__(self, ack: Latencies, cap: int, batches: int) -> None:
        self.ack = ack
        self.cap = cap
        self.slots = asyncio.Semaphore(batches)
        self.pending: dict[int, list[float]] = {}  # batch -> [sent at, records unconfirmed, records]
        self.batches = 0
        self.sent = 0
        self.confirmed = 0
        self.failed: list[ConfirmationStatus] = []
        self.settled = asyncio.Event()  # no batch pending
        self.settled.set()

    def batch(self, records: list[bytes]) -> list[RawMessage]:
        """The next batch's messages, to be sent at once: its clock starts here."""
        base = self.batches * self.cap + 1
        messages = [RawMessage(record, base + i) for i, record in enumerate(records)]
        self.pending[self.batches] = [time.perf_counter(), len(records), len(records)]
        self.batches += 1
        self.sent += len(records)
        self.settled.clear()
        return messages

    def on_confirm(self, status: ConfirmationStatus) -> None:
        k = (status.message_id - 1) // self.cap
        entry = self.pending[k]
        if status.is_confirmed:
            self.confirmed += 1
        else:
            self.failed.append(status)
        entry[1] -= 1
        if entry[1] == 0:
            del self.pending[k]
            self.ack.add(time.perf_counter() - entry[0], int(entry[2]))
            self.slots.release()
            if not self.pending:
                self.settled.set()

    async def wait(self, what: str) -> None:
        """Until every batch sent is settled; RuntimeError if a record failed, if fewer were confirmed than
        sent, or if no confirm comes for STALL_TIMEOUT seconds."""
        while not self.settled.is_set():
            before = self.confirmed + len(self.failed)
            try:
                await asyncio.wait_for(self.settled.wait(), STALL_TIMEOUT)
            except TimeoutError:
                if self.confirmed + len(self.failed) == before:
                    raise RuntimeError(f"{what}: {self.confirmed} of {self.sent} records confirmed, then "
                                       f"nothing for {STALL_TIMEOUT:.0f} s") from None
        if self.failed:
            first = self.failed[0]
            raise RuntimeError(f"{what}: {len(self.failed)} of {self.sent} records refused; the first: "
                               f"publishing id {first.message_id}, response code {first.response_code}")
        if self.confirmed != self.sent:
            raise RuntimeError(f"{what}: {self.confirmed} records confirmed, {self.sent} sent")


class _Reader:
    """A subscription's per-record callback: counts the record (its payload is bytes: no decoder) and, for a
    named consumer, returns the store_offset of every `every`-th record and of the last, which the client
    awaits before the next record."""

    def __init__(self, consumer: Consumer, stream: str, tally: Tally, name: str | None, every: int) -> None:
        self.consumer = consumer
        self.stream = stream
        self.tally = tally
        self.name = name
        self.every = every
        self.received = tally.received_one
        self.stored: int | None = None  # the offset stored last

    def __call__(self, payload: Any, context: MessageContext) -> Awaitable[None] | None:
        self.received(payload)
        tally = self.tally
        if self.name is not None and (tally.count % self.every == 0 or tally.count == tally.total):
            self.stored = context.offset
            return self.consumer.store_offset(self.stream, self.name, context.offset)
        return None


class Peer:
    """The connections of one run: a Producer per producer, a Consumer per consumer (one), and a Producer
    for stream management."""

    def __init__(self, server: ServerProcess, workload: Workload) -> None:
        if workload.consumers != 1:
            raise ValueError("a RabbitMQ stream's consumers each read every record: one consumer")
        self.server = server
        self.workload = workload
        self.admin = self._producer()
        self.producers = [self._producer() for _ in range(workload.producers)]
        self.consumer = Consumer(server.host, server.port, username=RABBITMQ_USER, password=RABBITMQ_USER,
                                 frame_max=FRAME_MAX)

    def _producer(self) -> Producer:
        return Producer(self.server.host, self.server.port, username=RABBITMQ_USER, password=RABBITMQ_USER,
                        frame_max=FRAME_MAX)

    async def connect(self) -> None:
        for producer in [self.admin, *self.producers]:
            await producer.start()

    async def close(self) -> None:
        for producer in [*self.producers, self.admin]:
            await producer.close()
        await self.consumer.close()

    async def new_stream(self, stream: str) -> None:
        await self.admin.delete_stream(stream, missing_ok=True)
        await self.admin.create_stream(stream)

    # -- produce ----------------------------------------------------------------------------------------

    async def _produce_one(self, producer: Producer, stream: str, count: int, seq0: int, ack: Latencies,
                           pacer: Pacer | None) -> None:
        cap = batch_records(self.workload)
        confirms = _Confirms(ack, cap, in_flight(self.workload))
        on_confirm = confirms.on_confirm
        payload, filler = self.workload.payload(), e2e_filler(self.workload)
        sent = 0
        while sent < count:
            due = count if pacer is None else min(count, await pacer.due(sent))
            while sent < due:
                n = min(cap, due - sent)
                await confirms.slots.acquire()
                records = [payload] * n if pacer is None else [stamped(filler, seq0 + sent + i)
                                                               for i in range(n)]
                await producer.send_batch(stream, confirms.batch(records), on_publish_confirm=on_confirm)
                sent += n
        await confirms.wait(f"{PEER} producer")

    def _producers(self, stream: str, ack: Latencies, rate: float | None) -> list[Awaitable[None]]:
        shares = self.workload.shares()
        seq0s = [sum(shares[:i]) for i in range(len(shares))]
        return [self._produce_one(producer, stream, n, seq0, ack,
                                  None if rate is None else Pacer(rate / len(shares)))
                for producer, n, seq0 in zip(self.producers, shares, seq0s, strict=True)]

    async def produce(self, stream: str) -> Measurement:
        await self.new_stream(stream)
        ack = Latencies()
        with metered(self.server.pid) as usage:
            await asyncio.gather(*self._producers(stream, ack, None))
        return measurement("produce", self.workload, self.workload.records, usage, ack=ack)

    # -- consume ----------------------------------------------------------------------------------------

    async def _subscribe(self, reader: _Reader) -> int:
        return await self.consumer.subscribe(
            reader.stream, reader, initial_credit=CREDIT, subscriber_name=reader.name,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))

    async def _check_stored(self, reader: _Reader, what: str) -> None:
        """The offset the server holds for the consumer's name is the one it stored last, the last record's.
        (Offsets are not record counts: the tracking data stored meanwhile takes offsets too.)"""
        stored = await self.consumer.query_offset(reader.stream, CONSUMER_NAME)
        if stored != reader.stored:
            raise RuntimeError(f"{what}: offset {stored} stored for {CONSUMER_NAME}, {reader.stored} sent")

    async def consume(self, stream: str) -> Measurement:
        tally = Tally(self.workload.records, e2e=False)
        reader = _Reader(self.consumer, stream, tally, CONSUMER_NAME, self.workload.batch)
        with metered(self.server.pid) as usage:
            subscription = await self._subscribe(reader)
            await tally.wait(f"{PEER} consume")
        await self.consumer.unsubscribe(subscription)
        await self._check_stored(reader, f"{PEER} consume")
        return measurement("consume", self.workload, tally.count, usage, finished_at=tally.finished_at)

    async def consume_noack(self, stream: str) -> Measurement:
        tally = Tally(self.workload.records, e2e=False)
        reader = _Reader(self.consumer, stream, tally, None, self.workload.batch)
        with metered(self.server.pid) as usage:
            subscription = await self._subscribe(reader)
            await tally.wait(f"{PEER} consume_noack")
        await self.consumer.unsubscribe(subscription)
        return measurement("consume_noack", self.workload, tally.count, usage, finished_at=tally.finished_at)

    # -- end to end -------------------------------------------------------------------------------------

    async def e2e(self, stream: str, rate: float) -> Measurement:
        await self.new_stream(stream)
        tally = Tally(self.workload.records, e2e=True)
        reader = _Reader(self.consumer, stream, tally, CONSUMER_NAME, self.workload.batch)
        subscription = await self._subscribe(reader)
        ack = Latencies()
        with metered(self.server.pid) as usage:
            await asyncio.gather(*self._producers(stream, ack, rate))
            await tally.wait(f"{PEER} e2e")
        await self.consumer.unsubscribe(subscription)
        await self._check_stored(reader, f"{PEER} e2e")
        return measurement("e2e", self.workload, tally.count, usage, ack=ack, e2e=tally.e2e,
                           offered_rate=rate, finished_at=tally.finished_at)


async def _run(server: ServerProcess, workload: Workload) -> list[Measurement]:
    peer = Peer(server, workload)
    await peer.connect()
    return await run_phases(peer, workload)


def run(server: ServerProcess, workload: Workload) -> list[Measurement]:
    """One run of the workload's phases against a running RabbitMQ node, on uvloop."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_run(server, workload))

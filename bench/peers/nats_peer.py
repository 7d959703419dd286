"""The workload against NATS JetStream (file storage, one server) through nats-py, the official client.

- Produce: `JetStreamContext.publish_async`, the client's pipelined publish: every record gets its own ack
  future, answered by the server once the record is in the stream's file store (see servers.py for what
  that means in 2.9: the page cache, fsync every 2 minutes). At most `window` records are unacknowledged per
  producer; the bound is our own semaphore, taken before the clock starts, so the ack latency is publish to
  ack and not the wait for a free slot (the client's own bound, `publish_async_max_pending`, is set above
  it and never binds). Each producer has its own connection.
- Consume: a durable push consumer, deliveries to a callback. With one consumer its ack policy is `all`
  (cumulative, as ours): the consumer acks every `ack_every` records (`batch`, fewer for large records)
  and the last one. With several, they
  form a queue group on one durable consumer with the `explicit` policy and ack every record (a cumulative
  ack would ack the other members' records). The server keeps up to `credit` records (at most
  CREDIT_BYTES of them) unacknowledged per consumer in flight. A pull consumer (`fetch` batches) was
  measured slower on nats-py 2.16 (about 26,000 records/s against 130,000 for this one, 256 B records): its
  `fetch` waits for each message with its own timeout.
- Consume, no acks (`consume_noack`): one ordered consumer (ephemeral, ack policy none, flow control): a
  catch-up read that keeps no position on the server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import nats
import uvloop
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, PubAck, StorageType, StreamConfig

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
from danube_fast.testing.process import ServerProcess

PEER = "nats"
DURABILITY = "file_sync2m"
DURABILITY_TEXT = ("JetStream file storage, 1 server: acked once written to the file store (page cache), "
                   "fsync every 2 min (the 2.9 default; 2.9 cannot fsync before the ack)")
ALWAYS_DURABILITY = "file_fsync"
ALWAYS_TEXT = ("JetStream file storage, 1 server, NATS 2.10+ with `sync_interval: always`: every write to "
               "the file store is fsync'd before the ack")


def batching_text(workload: Workload) -> str:
    return (f"publish_async per record, up to {workload.window:,} unacknowledged per producer; ack latency "
            "per record")


# The server cuts a client whose outbound buffer passes its max_pending (64 MiB) as a slow consumer ("Slow
# Consumer Detected: MaxPending of 67108864 Exceeded", then the consumer hangs): a push consumer's credit is
# bounded in bytes too, as a NATS user sizes it for large records.
CREDIT_BYTES = 16 << 20


def credit(workload: Workload) -> int:
    """Records a consumer may hold unacknowledged (the server's max_ack_pending)."""
    return max(16, min(max(workload.window, 4 * workload.batch), CREDIT_BYTES // workload.size))


def ack_every(workload: Workload) -> int:
    """A cumulative ack every this many records: well inside the credit, so the server never waits."""
    return max(1, min(workload.batch, credit(workload) // 4))


class Peer:
    """The connections of one run: one per producer, one per consumer, one for stream management."""

    def __init__(self, server: ServerProcess, workload: Workload) -> None:
        self.url = f"nats://{server.host}:{server.port}"
        self.server = server
        self.workload = workload
        self.admin: Client | None = None
        self.producers: list[Client] = []
        self.consumers: list[Client] = []

    async def connect(self) -> None:
        self.admin = await nats.connect(self.url)
        self.producers = [await nats.connect(self.url) for _ in range(self.workload.producers)]
        self.consumers = [await nats.connect(self.url) for _ in range(self.workload.consumers)]

    async def close(self) -> None:
        for nc in [*self.producers, *self.consumers, *([self.admin] if self.admin else [])]:
            await nc.close()

    @property
    def js(self) -> JetStreamContext:
        assert self.admin is not None
        return self.admin.jetstream()

    async def new_stream(self, name: str) -> str:
        """A fresh file-storage stream `name` on subject `name`; returns the subject."""
        await self.js.add_stream(StreamConfig(name=name, subjects=[name], storage=StorageType.FILE))
        return name

    async def stored(self, stream: str) -> int:
        info = await self.js.stream_info(stream)
        return info.state.messages

    # -- produce ----------------------------------------------------------------------------------------

    async def _produce_one(self, nc: Client, subject: str, count: int, seq0: int, ack: Latencies,
                           pacer: Pacer | None) -> None:
        workload = self.workload
        js = nc.jetstream(publish_async_max_pending=workload.window + 1)
        window = asyncio.Semaphore(workload.window)
        clock = time.perf_counter
        failures: list[BaseException] = []
        payload, filler = workload.payload(), e2e_filler(workload)

        def on_ack(start: float) -> Callable[[asyncio.Future[PubAck]], None]:
            def done(future: asyncio.Future[PubAck]) -> None:
                window.release()
                if future.cancelled():
                    failures.append(asyncio.CancelledError())
                elif (error := future.exception()) is not None:
                    failures.append(error)
                else:
                    ack.add(clock() - start)
            return done

        sent = 0
        while sent < count:
            due = count if pacer is None else min(count, await pacer.due(sent))
            while sent < due:
                await window.acquire()
                start = clock()
                future = await js.publish_async(subject, payload if pacer is None else
                                                stamped(filler, seq0 + sent))
                future.add_done_callback(on_ack(start))
                sent += 1
        await js.publish_async_completed()
        if failures:
            raise RuntimeError(f"{len(failures)} of {count} publishes failed; the first: {failures[0]!r}")

    def _producers(self, subject: str, ack: Latencies, rate: float | None) -> list[Awaitable[None]]:
        shares = self.workload.shares()
        seq0s = [sum(shares[:i]) for i in range(len(shares))]
        return [self._produce_one(nc, subject, n, seq0, ack,
                                  None if rate is None else Pacer(rate / len(shares)))
                for nc, n, seq0 in zip(self.producers, shares, seq0s, strict=True)]

    async def produce(self, stream: str) -> Measurement:
        subject = await self.new_stream(stream)
        ack = Latencies()
        with metered(self.server.pid) as usage:
            await asyncio.gather(*self._producers(subject, ack, None))
        stored = await self.stored(stream)
        if stored != self.workload.records:
            raise RuntimeError(f"{stored} records in stream {stream}, {self.workload.records} acknowledged")
        return measurement("produce", self.workload, self.workload.records, usage, ack=ack)

    # -- consume ----------------------------------------------------------------------------------------

    async def _subscribe(self, subject: str, tally: Tally, durable: str
                         ) -> list[JetStreamContext.PushSubscription]:
        workload = self.workload
        alone = workload.consumers == 1
        batch, total = ack_every(workload), tally.total
        config = ConsumerConfig(ack_policy=AckPolicy.ALL if alone else AckPolicy.EXPLICIT,
                                deliver_policy=DeliverPolicy.ALL, max_ack_pending=credit(workload))

        async def cumulative(msg: Msg) -> None:
            tally.received_one(msg.data)
            if tally.count % batch == 0 or tally.count >= total:
                await msg.ack()

        async def each(msg: Msg) -> None:
            tally.received_one(msg.data)
            await msg.ack()

        subs = []
        for nc in self.consumers:
            subs.append(await nc.jetstream().subscribe(
                subject, queue=None if alone else durable, durable=durable, cb=cumulative if alone else each,
                manual_ack=True, config=config))
        return subs

    async def consume(self, stream: str) -> Measurement:
        tally = Tally(self.workload.records, e2e=False)
        with metered(self.server.pid) as usage:
            subs = await self._subscribe(stream, tally, "catchup")
            await tally.wait(f"{PEER} consume")
        for sub in subs:
            await sub.unsubscribe()
        return measurement("consume", self.workload, tally.count, usage, finished_at=tally.finished_at)

    async def consume_noack(self, stream: str) -> Measurement:
        tally = Tally(self.workload.records, e2e=False)
        assert self.consumers

        async def on_msg(msg: Msg) -> None:
            tally.received_one(msg.data)

        with metered(self.server.pid) as usage:
            sub = await self.consumers[0].jetstream().subscribe(stream, cb=on_msg, ordered_consumer=True)
            await tally.wait(f"{PEER} consume_noack")
        await sub.unsubscribe()
        return measurement("consume_noack", self.workload, tally.count, usage,
                           finished_at=tally.finished_at)

    # -- end to end -------------------------------------------------------------------------------------

    async def e2e(self, stream: str, rate: float) -> Measurement:
        subject = await self.new_stream(stream)
        tally = Tally(self.workload.records, e2e=True)
        subs = await self._subscribe(subject, tally, "e2e")
        ack = Latencies()
        with metered(self.server.pid) as usage:
            await asyncio.gather(*self._producers(subject, ack, rate))
            await tally.wait(f"{PEER} e2e")
        for sub in subs:
            await sub.unsubscribe()
        return measurement("e2e", self.workload, tally.count, usage, ack=ack, e2e=tally.e2e,
                           offered_rate=rate, finished_at=tally.finished_at)


async def _run(server: ServerProcess, workload: Workload) -> list[Measurement]:
    peer = Peer(server, workload)
    await peer.connect()
    return await run_phases(peer, workload)


def run(server: ServerProcess, workload: Workload) -> list[Measurement]:
    """One run of the workload's phases against a running nats-server, on uvloop."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_run(server, workload))

"""The campaign's clients: producers (ours and the official client) and consumers of every subscription type,
each writing what it was told into the history (history.py).

Topics and who uses them (TOPICS): every topic is Reliable; one is partitioned. Every subscription exists
before the first send (a new subscription starts at the latest offset), so each must read every
acknowledged message.

A client that a fault breaks for good (the official client gives up after its retries; ours after about 25 s)
is opened again by its task, and the history records a new session: redeliveries after it are expected.
Sends are bounded by SEND_TIMEOUT: past it, the outcome is unknown (`info`).

The official client's consumer can also get stuck without giving up: once a health check failed (its
broker was down at that moment) its health loop ends, and if that broker restarts without the topic the
client reopens a stream for a consumer id the broker never saw, again and again, and never subscribes anew
(docs/CHAOS.md). An application would restart it, and so does a watchdog here: an official consumer that
whose subscription read nothing from a topic (partition) for WATCHDOG_SECONDS while producers' sends to it
were acknowledged is opened again, counted in `watchdog_restarts`. (Per subscription, not per consumer: a
Failover standby reads nothing by design.) Our consumer has no watchdog: it must recover by itself.

The Workload owns its clients and tasks; stop_producers() and close() end them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from danube import DanubeClientBuilder, DispatchStrategy, SubType

from bench.chaos.history import History, Outcome, Receive, Send, Session, parse_payload, payload
from danube_fast.client import FastConsumer, FastProducer, ProduceRejected
from danube_fast.codec import frames
from danube_fast.proto import DanubeAdmin_pb2 as admin_pb
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc

SEND_TIMEOUT = 20.0  # seconds before a send's outcome is recorded as unknown
FAST_BATCH = 5  # records per batch of our producer
FAST_INFLIGHT = 4  # batches in flight
PACE = 0.02  # seconds between two sends (batches) of one producer
RECEIVE_POLL = 1.0
WATCHDOG_SECONDS = 10.0
ACKS_IN_FLIGHT = 64  # per official consumer


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int  # 0: not partitioned
    fast_producer: bool
    official_producer: bool
    subscriptions: tuple[tuple[str, str, int], ...]  # (name, type, consumers)


TOPICS = (
    TopicSpec("/default/chaos-a", 0, True, True,
              (("a-exclusive", "exclusive", 1), ("a-failover", "failover", 2), ("a-shared", "shared", 2),
               ("a-fast", "fast", 1))),
    TopicSpec("/default/chaos-b", 0, True, False, (("b-exclusive", "exclusive", 1), ("b-fast", "fast", 1))),
    TopicSpec("/default/chaos-p", 2, False, True, (("p-failover", "failover", 2), ("p-shared", "shared", 2))),
)
SUB_TYPES = {"exclusive": SubType.EXCLUSIVE, "failover": SubType.FAILOVER, "shared": SubType.SHARED}


def subscriptions() -> dict[str, str]:
    """Each subscription's name -> its topic, for the checker."""
    return {name: t.name for t in TOPICS for name, _, _ in t.subscriptions}


def partitions() -> list[str]:
    """Every topic the brokers serve (a partitioned topic's partitions by name)."""
    return [p for t in TOPICS
            for p in ([f"{t.name}-part-{i}" for i in range(t.partitions)] if t.partitions else [t.name])]


class Workload:
    def __init__(self, history: History, service_url: str, admin_target: str, seed: int) -> None:
        self.history = history
        self.service_url = service_url  # http://host:port of a broker's proxy
        self.target = service_url.removeprefix("http://")
        self.admin_target = admin_target
        self.random = random.Random(seed)
        self.producing = asyncio.Event()
        self.closing = asyncio.Event()
        self._producers: list[asyncio.Task[None]] = []
        self._consumers: list[asyncio.Task[None]] = []
        self.sent = 0
        self.watchdog_restarts = 0
        self.open_failures = 0  # clients that could not be opened (each retried)
        self.last_open_error = ""
        self._last_read: dict[tuple[str, str], float] = {}  # (subscription, topic partition) -> history time
        self._last_acked: dict[str, float] = {}  # topic -> when a send to it was last acknowledged

    async def start(self) -> None:
        """Create the topics, subscribe every consumer, then start the producers."""
        async with grpc.aio.insecure_channel(self.admin_target) as channel:
            stub: Any = admin_grpc.TopicAdminStub(channel)  # type: ignore[no-untyped-call]
            for t in TOPICS:
                if t.partitions:
                    await stub.CreatePartitionedTopic(admin_pb.PartitionedTopicRequest(
                        base_name=t.name, partitions=t.partitions, dispatch_strategy=admin_pb.Reliable),
                        timeout=30)
                else:
                    await stub.CreateTopic(admin_pb.NewTopicRequest(
                        name=t.name, dispatch_strategy=admin_pb.Reliable), timeout=30)
        ready: list[asyncio.Future[None]] = []
        for t in TOPICS:
            for name, kind, count in t.subscriptions:
                for i in range(count):
                    subscribed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    ready.append(subscribed)
                    run = self._fast_consumer if kind == "fast" else self._official_consumer
                    self._consumers.append(asyncio.create_task(run(t.name, name, kind, f"{name}-{i}",
                                                                   subscribed)))
        await asyncio.wait_for(asyncio.gather(*ready), 60)
        self.producing.set()
        for t in TOPICS:
            if t.fast_producer:
                self._producers.append(asyncio.create_task(self._fast_producer(t.name, f"f{t.name[-1]}")))
            if t.official_producer:
                self._producers.append(asyncio.create_task(
                    self._official_producer(t.name, f"o{t.name[-1]}", t.partitions)))

    async def stop_producers(self) -> None:
        self.producing.clear()
        await asyncio.gather(*self._producers, return_exceptions=True)

    async def close(self) -> None:
        self.closing.set()
        await asyncio.wait(self._consumers, timeout=30)
        for task in self._consumers:
            task.cancel()
        await asyncio.gather(*self._consumers, return_exceptions=True)

    def unread(self) -> int:
        """(subscription, message) pairs acknowledged to a producer and not read yet."""
        acked: dict[str, set[tuple[str, int]]] = {}
        for s in self.history.sends:
            if s.outcome == "ok":
                acked.setdefault(s.topic, set()).add((s.producer, s.n))
        read: dict[str, set[tuple[str, int]]] = {}
        for r in self.history.receives:
            read.setdefault(r.subscription, set()).add((r.producer, r.n))
        return sum(len(acked.get(topic, set()) - read.get(sub, set()))
                   for sub, topic in subscriptions().items())

    # -- producers -------------------------------------------------------------------------------------

    async def _official_producer(self, topic: str, name: str, partitions: int) -> None:
        n = 0
        producer = None
        while self.producing.is_set():
            if producer is None:
                producer = await self._retry(lambda: self._official_producer_open(topic, name, partitions),
                                             self.producing)
                if producer is None:
                    return
            invoked = self.history.now()
            try:
                await asyncio.wait_for(producer.send(payload(name, n)), SEND_TIMEOUT)
                outcome: Outcome = "ok"
                error = ""
            except Exception as e:  # the official client raises many kinds; all leave the outcome unknown
                outcome, error = "info", _describe(e)
                producer = None  # a fresh one next time: this one may be stuck
            self.history.sends.append(Send(name, n, topic, invoked, self.history.now(), outcome, None, error))
            if outcome == "ok":
                self._last_acked[topic] = self.history.now()
            self.sent += 1
            n += 1
            await asyncio.sleep(PACE)

    async def _official_producer_open(self, topic: str, name: str, partitions: int) -> Any:
        client = await DanubeClientBuilder().service_url(self.service_url).build()
        builder = client.new_producer().with_topic(topic).with_name(name) \
            .with_dispatch_strategy(DispatchStrategy.RELIABLE)
        if partitions:
            builder = builder.with_partitions(partitions)
        producer = builder.build()
        await asyncio.wait_for(producer.create(), SEND_TIMEOUT)
        return producer

    async def _fast_producer(self, topic: str, name: str) -> None:
        producer = await self._retry(lambda: FastProducer.connect(
            self.target, topic, name, batch_records=FAST_BATCH, linger_ms=1.0), self.producing)
        if producer is None:
            return
        inflight = asyncio.Semaphore(FAST_INFLIGHT)
        pending: set[asyncio.Task[None]] = set()
        n = 0
        while self.producing.is_set():
            await inflight.acquire()
            batch = list(range(n, n + FAST_BATCH))
            n += FAST_BATCH
            invoked = self.history.now()
            try:
                future = await asyncio.wait_for(producer.send_batch([payload(name, i) for i in batch]),
                                                SEND_TIMEOUT)
            except Exception as e:
                self._settle(name, topic, batch, invoked, None, e)
                inflight.release()
                producer = await self._reopen_fast(producer, topic, name)
                if producer is None:
                    return
                continue
            task = asyncio.create_task(self._await_batch(name, topic, batch, invoked, future, inflight))
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(PACE)
        await asyncio.gather(*pending, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.close(), 10)

    async def _reopen_fast(self, producer: FastProducer, topic: str, name: str) -> FastProducer | None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.close(), 5)
        reopened: FastProducer | None = await self._retry(lambda: FastProducer.connect(
            self.target, topic, name, batch_records=FAST_BATCH, linger_ms=1.0), self.producing)
        return reopened

    async def _await_batch(self, name: str, topic: str, batch: list[int], invoked: float,
                           future: asyncio.Future[tuple[int, int]], inflight: asyncio.Semaphore) -> None:
        try:
            offsets = await asyncio.wait_for(asyncio.shield(future), SEND_TIMEOUT * 3)
            self._settle(name, topic, batch, invoked, offsets, None)
        except Exception as e:
            self._settle(name, topic, batch, invoked, None, e)
        finally:
            inflight.release()

    def _settle(self, name: str, topic: str, batch: list[int], invoked: float,
                offsets: tuple[int, int] | None, error: Exception | None) -> None:
        now = self.history.now()
        if offsets is not None and offsets[1] - offsets[0] + 1 != len(batch):
            error = RuntimeError(f"acknowledged offsets {offsets} for {len(batch)} records")
            offsets = None
        for i, n in enumerate(batch):
            if offsets is not None:
                self.history.sends.append(Send(name, n, topic, invoked, now, "ok", offsets[0] + i))
                self._last_acked[topic] = now
            else:
                definite = isinstance(error, ProduceRejected) and not error.retriable
                self.history.sends.append(Send(name, n, topic, invoked, now, "fail" if definite else "info",
                                               None, _describe(error)))
        self.sent += len(batch)

    # -- consumers -------------------------------------------------------------------------------------

    async def _official_consumer(self, topic: str, sub: str, kind: str, name: str,
                                 subscribed: asyncio.Future[None]) -> None:
        reason = "start"
        while not self.closing.is_set():
            consumer = await self._retry(lambda: self._official_subscribe(topic, sub, kind, name))
            if consumer is None:
                return
            self.history.sessions.append(Session(self.history.now(), sub, name, reason))
            if not subscribed.done():
                subscribed.set_result(None)
            queue = await consumer.receive()
            reason = "the client gave up"
            started = self.history.now()
            acks: set[asyncio.Task[None]] = set()
            while not self.closing.is_set():
                try:
                    message = await asyncio.wait_for(queue.get(), RECEIVE_POLL)
                except TimeoutError:
                    if all(t.done() for t in consumer._tasks):  # every receive loop gave up
                        break
                    if self._stuck(topic, sub, consumer._consumers, started):
                        self.watchdog_restarts += 1
                        reason = "watchdog"
                        break
                    continue
                self._received(message.msg_id.topic_name, sub, kind, name, message.msg_id.topic_offset,
                               message.payload)
                # Acks go out without waiting for each other (one round trip each would hold the reader
                # to ~150 messages/s, below the producers' rate), ACKS_IN_FLIGHT at most.
                ack = asyncio.create_task(_ack(consumer, message))
                acks.add(ack)
                ack.add_done_callback(acks.discard)
                if len(acks) >= ACKS_IN_FLIGHT:
                    await asyncio.wait(acks, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.gather(*acks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.close(), 5)

    async def _official_subscribe(self, topic: str, sub: str, kind: str, name: str) -> Any:
        client = await DanubeClientBuilder().service_url(self.service_url).build()
        consumer = client.new_consumer().with_topic(topic).with_consumer_name(name) \
            .with_subscription(sub).with_subscription_type(SUB_TYPES[kind]).build()
        await asyncio.wait_for(consumer.subscribe(), SEND_TIMEOUT)
        return consumer

    async def _fast_consumer(self, topic: str, sub: str, kind: str, name: str,
                             subscribed: asyncio.Future[None]) -> None:
        reason = "start"
        while not self.closing.is_set():
            consumer = await self._retry(lambda: FastConsumer.connect(self.target, topic, sub, name))
            if consumer is None:
                return
            self.history.sessions.append(Session(self.history.now(), sub, name, reason))
            if not subscribed.done():
                subscribed.set_result(None)
            reconnects = consumer.reconnects
            reason = "the client gave up"
            try:
                deliveries = consumer.batches().__aiter__()
                while not self.closing.is_set():
                    try:
                        d = await asyncio.wait_for(deliveries.__anext__(), RECEIVE_POLL)
                    except TimeoutError:
                        continue
                    if consumer.reconnects != reconnects:
                        reconnects = consumer.reconnects
                        self.history.sessions.append(Session(self.history.now(), sub, name, "reconnected"))
                    for record in frames.decode_records(d.data):
                        if record.offset >= consumer.start_offset:
                            self._received(topic, sub, kind, name, record.offset, record.payload)
                    with contextlib.suppress(Exception):
                        await consumer.ack_cumulative(d.last_offset)
            except StopAsyncIteration:
                reason = "the stream ended"
            except Exception as e:
                reason = f"the client gave up: {_describe(e)}"
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.close(), 5)

    def _stuck(self, topic: str, sub: str, partitions: dict[str, Any], started: float) -> bool:
        """Subscription `sub` read nothing from one of its topic's partitions for WATCHDOG_SECONDS (nor since
        `started`, when this consumer subscribed) while sends to the topic were acknowledged after that."""
        now = self.history.now()
        acked = self._last_acked.get(topic, 0.0)
        for partition in partitions:
            last = max(self._last_read.get((sub, partition), 0.0), started)
            if now - last > WATCHDOG_SECONDS and acked > last + 1.0:
                return True
        return False

    def _received(self, topic: str, sub: str, kind: str, consumer: str, offset: int, data: bytes) -> None:
        parsed = parse_payload(data)
        if parsed is None:
            self.history.unreadable.append(f"{sub}: {bytes(data)[:80]!r} at {topic}@{offset}")
            return
        self.history.receives.append(Receive(self.history.now(), topic, sub, kind, consumer, offset, *parsed))
        self._last_read[(sub, topic)] = self.history.now()

    # -- retrying ---------------------------------------------------------------------------------------

    async def _retry(self, open_: Callable[[], Awaitable[Any]], running: asyncio.Event | None = None) -> Any:
        """open_() until it succeeds; None once the workload closes first (or `running` is cleared)."""
        delay = 0.1
        while not self.closing.is_set() and (running is None or running.is_set()):
            try:
                return await asyncio.wait_for(open_(), SEND_TIMEOUT)
            except Exception as e:
                self.open_failures += 1
                self.last_open_error = f"{self.history.now():.1f} s: {_describe(e)}"
                await asyncio.sleep(delay + self.random.uniform(0, delay))
                delay = min(delay * 2, 2.0)
        return None


async def _ack(consumer: Any, message: Any) -> None:
    with contextlib.suppress(Exception):  # an ack lost to a fault: the message comes again
        await asyncio.wait_for(consumer.ack(message), 5)


def _describe(e: BaseException | None) -> str:
    if isinstance(e, grpc.aio.AioRpcError):
        return f"{e.code().name}: {e.details()}"
    return f"{type(e).__name__}: {e}"[:300]

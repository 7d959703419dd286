"""A topic served by this broker: its producers and subscriptions; a ReliableTopic also its WAL.

The two delivery modes are two types. Publishing on a ReliableTopic appends to the WAL and answers once the
WAL says it is durable (per the topic's sync policy); the subscriptions' dispatchers then read it from the
WAL, or through the object tier (`log`). A NonReliableTopic hands each message straight to every
subscription's live dispatcher and stores nothing.

What differs between the modes is a method of the type: the dispatcher a subscription gets, where a new
subscription starts, what publishing a batch does, whether a sequenced batch is checked for duplicates, and
the storage opened and closed with the topic. Code that exists only for stored records (the object tier,
tables, retention, moves) asks `stored(topic)`, the one place that tells the types apart.

Ownership: the fields are written here only. The registry (topic_registry.py) builds a topic and fills its
producer and subscription maps through the methods below; the object tier attaches and detaches the
uploader, and the schema layer sets the topic's schema configuration, each through a method.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from danube_fast.broker import messages
from danube_fast.broker.config import DispatchConfig
from danube_fast.broker.dispatch.budget import ByteBudget
from danube_fast.broker.dispatch.cursor import Cursor, Delayed, Saver
from danube_fast.broker.dispatch.dispatcher import Dispatcher
from danube_fast.broker.dispatch.live import LiveDispatcher
from danube_fast.broker.dispatch.reliable import ReliableDispatcher
from danube_fast.broker.ownership import Fence
from danube_fast.broker.ratelimit import RateLimiter
from danube_fast.broker.replicas import Replicas
from danube_fast.broker.sequences import Append, Outcome, ProducerSequences
from danube_fast.broker.subscription import Subscription
from danube_fast.errors import precondition, unavailable
from danube_fast.meta.resources import DeliveryMode, Policy, TopicSchemaConfig
from danube_fast.meta.store import Delete, MetadataStore
from danube_fast.names import TopicName
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.storage.tiered import TopicLog
from danube_fast.storage.wal import Wal

if TYPE_CHECKING:
    from danube_fast.schema.topic_schema import SchemaGate
    from danube_fast.storage.uploader import Uploader


@dataclass
class ProducerEntry:
    producer_id: int
    name: str
    topic: Topic


@dataclass(frozen=True)
class DispatchParts:
    """What a topic builds its subscriptions' dispatchers from (subscriptions.py provides them)."""
    config: DispatchConfig
    budget: ByteBudget  # the broker's, shared by every dispatcher
    cursor_saver: Callable[[Topic, str], Saver]  # persists subscription `name`'s cursor, fenced by the topic
    dead_letter: Callable[[Topic, pb.StreamMessage], Awaitable[None]]


class Topic:
    """What both delivery modes share; build a ReliableTopic or a NonReliableTopic."""

    delivery: ClassVar[DeliveryMode]

    def __init__(self, name: TopicName, policy: Policy, fence: Fence) -> None:
        self.name = name
        self.full = name.full
        self.policy = policy
        self.producers: dict[str, ProducerEntry] = {}  # by producer name
        self.subscriptions: dict[str, Subscription] = {}
        self.messages_in = 0
        self.bytes_in = 0
        self.publish_rate = RateLimiter(policy.max_publish_rate)
        # The stored schema configuration (None: the defaults, nothing stored) and the publish check it
        # implies (None: nothing can be refused); set by danube_fast.schema.topic_schema through set_schema.
        self.schema_config: TopicSchemaConfig | None = None
        self.schema_gate: SchemaGate | None = None
        # What every append, acknowledgement and metadata write passes (broker/ownership.py): a no-op
        # standalone, the assignment's fence in cluster mode.
        self.fence = fence
        # Why this broker stopped serving the topic ("unloaded", "deleted", "broken"); None while it serves
        # it. Set by the topic registry before it takes the topic apart: a Subscribe or CreateProducer that
        # awaited its store write meanwhile must not add to it (nothing would ever serve or close that).
        self.gone: str | None = None

    @property
    def reliable(self) -> bool:
        return self.delivery == DeliveryMode.RELIABLE

    def set_schema(self, config: TopicSchemaConfig, gate: SchemaGate | None) -> None:
        self.schema_config = config
        self.schema_gate = gate

    def add_producer(self, entry: ProducerEntry) -> None:
        self.producers[entry.name] = entry

    def add_subscription(self, sub: Subscription) -> None:
        self.subscriptions[sub.name] = sub

    def remove_subscription(self, name: str) -> None:
        self.subscriptions.pop(name, None)

    def clear_subscriptions(self) -> None:
        self.subscriptions.clear()

    def consumer_count(self) -> int:
        return sum(len(s.consumers) for s in self.subscriptions.values())

    @property
    def start_offset(self) -> int:
        """Where a new subscription starts: the next offset published."""
        raise NotImplementedError

    def dispatcher_for(self, sub: Subscription, start: int, parts: DispatchParts,
                       delayed: Delayed | None = None) -> Dispatcher:
        """The dispatcher that serves `sub` from offset `start` (and its delayed records, `delayed`)."""
        raise NotImplementedError

    def require_stored(self, why: str) -> ReliableTopic:
        """This topic as one that keeps its records, or FAILED_PRECONDITION saying `why` it must."""
        raise NotImplementedError

    async def publish(self, msg: pb.StreamMessage) -> None:
        raise NotImplementedError

    async def publish_batch(self, data: bytes | memoryview, records: int,
                            stored: Callable[[int, int], None] | None = None) -> tuple[int, int]:
        """The fast API's publish: whole record batches, already checked by the caller. `stored(first, last)`
        is called once they are in the log, before the acknowledgement's checks (which may still fail)."""
        raise NotImplementedError

    async def ready_for_batches(self) -> None:
        """Before a fast producer's first batch is taken."""

    def publish_once(self, producer: str, sequenced: tuple[int, int] | None,
                     append: Append) -> asyncio.Future[Outcome]:
        """Start `append` for a batch of `producer`; `sequenced`: its (session, sequence), when it has one."""
        return asyncio.ensure_future(append(_nothing))

    def describe(self) -> str:
        """For the log: what the topic holds beyond its producers and subscriptions."""
        return ""

    def _count(self, records: int, size: int) -> None:
        self.messages_in += records
        self.bytes_in += size


class ReliableTopic(Topic):
    delivery = DeliveryMode.RELIABLE

    def __init__(self, name: TopicName, policy: Policy, fence: Fence, wal: Wal,
                 log: TopicLog | None = None) -> None:
        """`log`: what dispatchers read (with an object tier: objects -> WAL -> live tail); the WAL alone by
        default."""
        super().__init__(name, policy, fence)
        self.wal = wal
        self.log = log if log is not None else TopicLog(wal)
        self.uploader: Uploader | None = None  # with an object tier, while the topic is served
        self.sequences = ProducerSequences()  # what idempotent producers stored (sequences.py)
        # The copies of its log on other brokers that acknowledgements wait for (replicas.py); None: none.
        self.replicas: Replicas | None = None
        fence.start_at(wal.committed_offset)

    def replicate(self, replicas: Replicas | None) -> None:
        """From now on acknowledgements wait for `replicas` too (None: for this broker's WAL alone)."""
        self.replicas = replicas

    @property
    def start_offset(self) -> int:
        return self.wal.committed_offset

    def dispatcher_for(self, sub: Subscription, start: int, parts: DispatchParts,
                       delayed: Delayed | None = None) -> Dispatcher:
        sub.cursor = Cursor(start, parts.cursor_saver(self, sub.name), parts.config, delayed)
        return self.per_message(sub, parts)

    def per_message(self, sub: Subscription, parts: DispatchParts) -> ReliableDispatcher:
        """`sub` served per message to Danube API consumers, from its cursor."""
        assert sub.cursor is not None

        async def dead_letter(msg: pb.StreamMessage) -> None:
            await parts.dead_letter(self, msg)

        return ReliableDispatcher(sub, self.log, parts.config, sub.cursor, dead_letter,
                                  self.policy.max_subscription_dispatch_rate, parts.budget)

    def require_stored(self, why: str) -> ReliableTopic:
        return self

    async def ready_for_batches(self) -> None:
        await self.sequences.ready(self.wal)  # what the WAL holds is known before any batch is taken

    def publish_once(self, producer: str, sequenced: tuple[int, int] | None,
                     append: Append) -> asyncio.Future[Outcome]:
        if sequenced is None:
            return asyncio.ensure_future(append(_nothing))
        # A batch the topic already holds is answered with the first copy's offsets (sequences.py).
        return self.sequences.publish(producer, *sequenced, append, self._acknowledgeable)

    async def _acknowledgeable(self, stored: Outcome) -> None:
        """What the acknowledgement of records stored here waits for, a retry's as the first copy's: every
        copy they must be on (the first copy's may have failed for want of them), then the fence."""
        replicas = self.replicas
        if replicas is not None:
            await replicas.admit()  # as a send: waits a moment for copies that fell short (a move's new term)
            await replicas.replicated(stored[1])
        await self.fence.confirm()

    def describe(self) -> str:
        return f", WAL at offset {self.wal.committed_offset}"

    def attach_uploader(self, uploader: Uploader) -> None:
        self.uploader = uploader

    def detach_uploader(self) -> Uploader | None:
        uploader, self.uploader = self.uploader, None
        return uploader

    async def publish(self, msg: pb.StreamMessage) -> None:
        if self.publish_rate.per_second:
            await self.publish_rate.acquire()
        fence, replicas = self.fence, self.replicas
        if replicas is not None:
            await replicas.admit()
        await fence.admit(1)
        try:
            last = (await self.wal.append(messages.encode(msg)))[1]
        finally:
            fence.done()
        if replicas is not None:
            await replicas.replicated(last)
        await fence.confirm()
        self._count(1, len(msg.payload))
        for sub in self.subscriptions.values():
            sub.dispatcher.notify()

    async def publish_batch(self, data: bytes | memoryview, records: int,
                            stored: Callable[[int, int], None] | None = None) -> tuple[int, int]:
        """Appended to the WAL as they are (offsets stamped there), answered with their offsets once
        durable and the fence confirms this broker still owns the topic."""
        if self.publish_rate.per_second:
            await self.publish_rate.acquire(records)
        fence, replicas = self.fence, self.replicas
        if replicas is not None:
            await replicas.admit()
        await fence.admit(records)
        try:
            first, last = await self.wal.submit(data)
        finally:
            fence.done()
        if stored is not None:
            stored(first, last)
        if replicas is not None:
            await replicas.replicated(last)
        await fence.confirm()
        self._count(records, len(data))
        for sub in self.subscriptions.values():
            sub.dispatcher.notify()
        return first, last


class NonReliableTopic(Topic):
    delivery = DeliveryMode.NON_RELIABLE

    def __init__(self, name: TopicName, policy: Policy, fence: Fence) -> None:
        super().__init__(name, policy, fence)
        self._live: dict[str, LiveDispatcher] = {}  # the subscriptions' dispatchers, by subscription

    @property
    def start_offset(self) -> int:
        return 0  # nothing is stored: a subscription sees what is published from now on

    def dispatcher_for(self, sub: Subscription, start: int, parts: DispatchParts,
                       delayed: Delayed | None = None) -> Dispatcher:
        live = LiveDispatcher(sub, parts.config.buffer, parts.config.window_bytes, parts.budget)
        self._live[sub.name] = live
        return live

    def require_stored(self, why: str) -> ReliableTopic:
        raise precondition(f"topic {self.full} is NonReliable: it keeps no records ({why})")

    def remove_subscription(self, name: str) -> None:
        super().remove_subscription(name)
        self._live.pop(name, None)

    def clear_subscriptions(self) -> None:
        super().clear_subscriptions()
        self._live.clear()

    async def publish(self, msg: pb.StreamMessage) -> None:
        if self.publish_rate.per_second:
            await self.publish_rate.acquire()
        await self.fence.confirm()
        self._count(1, len(msg.payload))
        for live in self._live.values():
            live.publish(msg)

    async def publish_batch(self, data: bytes | memoryview, records: int,
                            stored: Callable[[int, int], None] | None = None) -> tuple[int, int]:
        """Decoded and handed to the live dispatchers (offsets 0 .. records - 1); nothing is stored."""
        if self.publish_rate.per_second:
            await self.publish_rate.acquire(records)
        self._count(records, len(data))
        if self._live:
            for msg in messages.decode(data, self.full, 0):
                for live in self._live.values():
                    live.publish(msg)
        return 0, records - 1


def _nothing(first: int, last: int) -> None:
    pass


async def check_served(topic: Topic, store: MetadataStore, written: Sequence[str]) -> None:
    """After a store write made for `topic` (a subscription's or a producer's record): UNAVAILABLE
    (retriable) if the registry let the topic go meanwhile, the `written` keys deleted first when it was
    deleted (not left under a topic that no longer exists)."""
    if topic.gone is None:
        return
    if topic.gone == "deleted":
        await store.transaction([], [Delete(key) for key in written], [])
    raise unavailable(f"topic {topic.full} was {topic.gone} here meanwhile: look it up again")


def stored(topic: Topic) -> ReliableTopic | None:
    """`topic` if it keeps its records (a Reliable topic), else None: for the code that exists only for
    stored records (the object tier, tables, retention, moves), so that it is the one place that asks."""
    return topic if isinstance(topic, ReliableTopic) else None  # the one place a topic's type is asked


def new_topic(name: TopicName, delivery: DeliveryMode, policy: Policy, fence: Fence, wal: Wal | None,
              log: TopicLog | None = None) -> Topic:
    """The topic type for `delivery` (a Reliable one needs its WAL)."""
    if delivery == DeliveryMode.RELIABLE:
        assert wal is not None
        return ReliableTopic(name, policy, fence, wal, log)
    return NonReliableTopic(name, policy, fence)

"""A topic served by this broker: its producers and subscriptions; a ReliableTopic also its WAL.

The two delivery modes are two types. Publishing on a ReliableTopic appends to the WAL and answers once the
WAL says it is durable (per the topic's sync policy); the subscriptions' dispatchers then read it from the
WAL, or through the object tier (`log`). A NonReliableTopic hands each message straight to every
subscription's live dispatcher and stores nothing.

Ownership: the fields are written here only. Topics (topics.py) builds a topic and fills its producer and
subscription maps through the methods below; the object tier attaches and detaches the uploader, and the
schema layer sets the topic's schema configuration, each through a method.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from danube_fast.broker import messages
from danube_fast.broker.dispatch.live import LiveDispatcher
from danube_fast.broker.ownership import Fence
from danube_fast.broker.ratelimit import RateLimiter
from danube_fast.broker.sequences import ProducerSequences
from danube_fast.broker.subscription import Subscription
from danube_fast.meta.resources import DeliveryMode, Policy, TopicSchemaConfig
from danube_fast.names import TopicName
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.storage.wal import Wal

if TYPE_CHECKING:
    from danube_fast.schema.topic_schema import SchemaGate
    from danube_fast.storage.tiered import ReadableLog
    from danube_fast.storage.uploader import Uploader


@dataclass
class ProducerEntry:
    producer_id: int
    name: str
    topic: Topic


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

    async def publish(self, msg: pb.StreamMessage) -> None:
        raise NotImplementedError

    async def publish_batch(self, data: bytes | memoryview, records: int,
                            stored: Callable[[int, int], None] | None = None) -> tuple[int, int]:
        """The fast API's publish: whole record batches, already checked by the caller. `stored(first, last)`
        is called once they are in the log, before the acknowledgement's checks (which may still fail)."""
        raise NotImplementedError

    def _count(self, records: int, size: int) -> None:
        self.messages_in += records
        self.bytes_in += size


class ReliableTopic(Topic):
    delivery = DeliveryMode.RELIABLE

    def __init__(self, name: TopicName, policy: Policy, fence: Fence, wal: Wal,
                 log: ReadableLog | None = None) -> None:
        """`log`: what dispatchers read (with an object tier: objects -> WAL -> live tail); the WAL alone by
        default."""
        super().__init__(name, policy, fence)
        self.wal = wal
        self.log: ReadableLog = log if log is not None else wal
        self.uploader: Uploader | None = None  # with an object tier, while the topic is served
        self.sequences = ProducerSequences()  # what idempotent producers stored (sequences.py)
        fence.next = wal.committed_offset

    def attach_uploader(self, uploader: Uploader) -> None:
        self.uploader = uploader

    def detach_uploader(self) -> Uploader | None:
        uploader, self.uploader = self.uploader, None
        return uploader

    async def publish(self, msg: pb.StreamMessage) -> None:
        if self.publish_rate.per_second:
            await self.publish_rate.acquire()
        fence = self.fence
        await fence.admit(1)
        try:
            await self.wal.append(messages.encode(msg))
        finally:
            fence.done()
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
        fence = self.fence
        await fence.admit(records)
        try:
            first, last = await self.wal.submit(data)
        finally:
            fence.done()
        if stored is not None:
            stored(first, last)
        await fence.confirm()
        self._count(records, len(data))
        for sub in self.subscriptions.values():
            sub.dispatcher.notify()
        return first, last


class NonReliableTopic(Topic):
    delivery = DeliveryMode.NON_RELIABLE

    async def publish(self, msg: pb.StreamMessage) -> None:
        if self.publish_rate.per_second:
            await self.publish_rate.acquire()
        await self.fence.confirm()
        self._count(1, len(msg.payload))
        for sub in self.subscriptions.values():
            live = sub.dispatcher
            assert isinstance(live, LiveDispatcher)  # a NonReliable topic has only live dispatchers
            live.publish(msg)

    async def publish_batch(self, data: bytes | memoryview, records: int,
                            stored: Callable[[int, int], None] | None = None) -> tuple[int, int]:
        """Decoded and handed to the live dispatchers (offsets 0 .. records - 1); nothing is stored."""
        if self.publish_rate.per_second:
            await self.publish_rate.acquire(records)
        self._count(records, len(data))
        if self.subscriptions:
            for msg in messages.decode(data, self.full, 0):
                for sub in self.subscriptions.values():
                    live = sub.dispatcher
                    assert isinstance(live, LiveDispatcher)
                    live.publish(msg)
        return 0, records - 1


def new_topic(name: TopicName, delivery: DeliveryMode, policy: Policy, fence: Fence, wal: Wal | None,
              log: ReadableLog | None = None) -> Topic:
    """The topic type for `delivery` (a Reliable one needs its WAL)."""
    if delivery == DeliveryMode.RELIABLE:
        assert wal is not None
        return ReliableTopic(name, policy, fence, wal, log)
    return NonReliableTopic(name, policy, fence)

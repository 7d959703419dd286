"""A topic served by this broker: its producers, subscriptions and (Reliable) its WAL.

Publishing on a Reliable topic appends a one-record batch to the WAL and answers once the WAL says it is
durable (per the topic's sync policy); the subscriptions' dispatchers then read it from the WAL. A
NonReliable publish is handed straight to every subscription's dispatcher.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from danube_fast.broker import messages
from danube_fast.broker.dispatch.live import LiveDispatcher
from danube_fast.broker.names import TopicName
from danube_fast.broker.ownership import Fence
from danube_fast.broker.ratelimit import RateLimiter
from danube_fast.broker.subscription import Subscription
from danube_fast.meta.resources import DeliveryMode, Policy, TopicSchemaConfig
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
    def __init__(self, name: TopicName, delivery: DeliveryMode, policy: Policy, wal: Wal | None,
                 fence: Fence) -> None:
        self.name = name
        self.full = name.full
        self.delivery = delivery
        self.policy = policy
        self.wal = wal
        # What dispatchers read: the WAL, or (with an object tier) objects -> WAL -> live tail.
        self.log: ReadableLog | None = wal
        self.uploader: Uploader | None = None
        self.producers: dict[str, ProducerEntry] = {}  # by producer name
        self.subscriptions: dict[str, Subscription] = {}
        self.messages_in = 0
        self.bytes_in = 0
        self.publish_rate = RateLimiter(policy.max_publish_rate)
        # Owned by danube_fast.schema.topic_schema.TopicSchemas: the stored schema configuration (None: the
        # defaults, nothing stored) and the publish check it implies (None: nothing can be refused).
        self.schema_config: TopicSchemaConfig | None = None
        self.schema_gate: SchemaGate | None = None
        # What every append, acknowledgement and metadata write passes (broker/ownership.py): a no-op
        # standalone, the assignment's fence in cluster mode.
        self.fence = fence

    @property
    def reliable(self) -> bool:
        return self.delivery == DeliveryMode.RELIABLE

    async def publish(self, msg: pb.StreamMessage) -> None:
        if self.publish_rate.per_second:
            await self.publish_rate.acquire()
        fence = self.fence
        if self.wal is not None:
            await fence.admit(1)
            try:
                await self.wal.append(messages.encode(msg))
            finally:
                fence.done()
            await fence.confirm()
            self.messages_in += 1
            self.bytes_in += len(msg.payload)
            for sub in self.subscriptions.values():
                sub.dispatcher.notify()
            return
        await fence.confirm()
        self.messages_in += 1
        self.bytes_in += len(msg.payload)
        for sub in self.subscriptions.values():
            live = sub.dispatcher
            assert isinstance(live, LiveDispatcher)  # a NonReliable topic has only live dispatchers
            live.publish(msg)

    async def publish_batch(self, data: bytes, records: int) -> tuple[int, int]:
        """The fast API's publish: whole record batches, already checked by the caller. Reliable: appended to
        the WAL as they are (offsets stamped there), answered with their offsets once durable. NonReliable:
        decoded and handed to the live dispatchers (offsets 0 .. records - 1)."""
        if self.publish_rate.per_second:
            await self.publish_rate.acquire(records)
        if self.wal is not None:
            fence = self.fence
            await fence.admit(records)
            try:
                first, last = await self.wal.submit(data)
            finally:
                fence.done()
            await fence.confirm()
            self.messages_in += records
            self.bytes_in += len(data)
            for sub in self.subscriptions.values():
                sub.dispatcher.notify()
            return first, last
        self.messages_in += records
        self.bytes_in += len(data)
        if self.subscriptions:
            for msg in messages.decode(data, self.full, 0):
                for sub in self.subscriptions.values():
                    live = sub.dispatcher
                    assert isinstance(live, LiveDispatcher)
                    live.publish(msg)
        return 0, records - 1

    def consumer_count(self) -> int:
        return sum(len(s.consumers) for s in self.subscriptions.values())

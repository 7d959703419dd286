"""NonReliable dispatch: in-memory fan-out as messages are published, nothing stored, nothing redelivered.

Each consumer has a bounded buffer; a message for a consumer whose buffer is full is dropped for that
consumer and counted (`dropped`), so a slow consumer never stalls the producer or other
subscriptions (v0.7.3 instead awaits queue space and back-pressures SendMessage). A subscription with no
active consumer drops the message (wire/CONTRACT.md C.9).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from danube_fast.broker import messages
from danube_fast.broker.consumer import Consumer
from danube_fast.broker.dispatch.select import Selector
from danube_fast.meta.resources import SubscriptionType
from danube_fast.proto import DanubeApi_pb2 as pb

if TYPE_CHECKING:
    from danube_fast.broker.subscription import Subscription


class LiveDispatcher:
    def __init__(self, subscription: Subscription, buffer: int) -> None:
        self._sub = subscription
        self._buffer = buffer
        self._selector = Selector(subscription.kind)
        self._keyed = subscription.kind == SubscriptionType.KEY_SHARED
        self.dropped = 0  # messages no consumer of this subscription took (no room, or its stream went)

    def _usable(self, c: Consumer) -> bool:
        return c.active and c.queued < self._buffer

    def publish(self, msg: pb.StreamMessage) -> None:
        key = messages.routing_key(msg) if self._keyed else ""
        c, _ = self._selector.pick(self._sub.consumers, key, self._usable)
        if c is None:
            self.dropped += 1
            return
        c.push(msg)

    # Acks and nacks mean nothing without storage (C.9, C.10).
    def ack(self, offset: int) -> bool:
        return True

    def nack(self, offset: int, delay_ms: int | None) -> bool:
        return True

    def notify(self) -> None:
        pass

    def consumer_changed(self) -> None:
        pass

    def consumer_lost(self, consumer: Consumer) -> None:
        self.dropped += len(consumer.drain_queue())  # buffered for a stream that is gone

    @property
    def backlog(self) -> int:
        return sum(c.queued for c in self._sub.consumers)

    async def close(self, *, save: bool = True) -> None:
        pass

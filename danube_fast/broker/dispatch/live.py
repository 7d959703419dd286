"""NonReliable dispatch: in-memory fan-out as messages are published, nothing stored, nothing redelivered.

Each consumer has a bounded buffer: `buffer` messages and `window_bytes` of payload (one message bigger than
that still goes when the buffer is empty), within the broker's ByteBudget (budget.py). A message for a
consumer without room is dropped for that consumer and counted (`dropped`), so a slow consumer never stalls
the producer or other subscriptions (v0.7.3 instead awaits queue space and back-pressures SendMessage). A
subscription with no active consumer drops the message (docs/WIRE.md C.9).
"""

from __future__ import annotations

from danube_fast.broker import messages
from danube_fast.broker.config import DispatchConfig
from danube_fast.broker.consumer import Consumer
from danube_fast.broker.dispatch.budget import ByteBudget
from danube_fast.broker.dispatch.members import Members
from danube_fast.broker.dispatch.select import Selector
from danube_fast.meta.resources import SubscriptionType
from danube_fast.proto import DanubeApi_pb2 as pb


class LiveDispatcher:
    kind = "live"

    def __init__(self, subscription: Members, buffer: int,
                 window_bytes: int = DispatchConfig.window_bytes, budget: ByteBudget | None = None) -> None:
        """`budget`: the broker's, shared by all its dispatchers; without one, a budget of its own."""
        self._sub = subscription
        self._buffer = buffer
        self._window_bytes = window_bytes
        self._budget = budget if budget is not None else ByteBudget(DispatchConfig.broker_bytes)
        self._size = 0  # bytes of the message being routed (what `_usable` checks)
        self._held = 0  # bytes queued for this subscription's consumers
        self._selector = Selector(subscription.kind)
        self._keyed = subscription.kind == SubscriptionType.KEY_SHARED
        self.dropped = 0  # messages no consumer of this subscription took (no room, or its stream went)

    def _usable(self, c: Consumer) -> bool:
        """Room for the message being routed: an empty buffer takes any one message; otherwise the
        consumer's buffer and the broker's budget must both hold it."""
        if not c.active or c.queued >= self._buffer:
            return False
        queued, size = c.queued_bytes, self._size
        return not queued or (queued + size <= self._window_bytes and self._budget.room_for(size))

    def publish(self, msg: pb.StreamMessage) -> None:
        key = messages.routing_key(msg) if self._keyed else ""
        size = self._size = len(msg.payload)
        c, _ = self._selector.pick(self._sub.consumers, key, self._usable)
        if c is None:
            self.dropped += 1
            return
        self._held += size
        self._budget.take(size)
        c.push(msg, size)

    def taken(self, size: int) -> None:
        """A stream took `size` bytes of queued messages."""
        self._held -= size
        self._budget.give(size)

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
        size = consumer.queued_bytes
        self.dropped += len(consumer.drain_queue())  # buffered for a stream that is gone
        self.taken(size)

    def stream_replaced(self, consumer: Consumer) -> None:
        pass  # what the old stream had queued moves on with the consumer

    def stop_streams(self) -> None:
        pass  # live streams end with their consumers (Clients)

    def counters(self) -> dict[str, int]:
        return {"dropped": self.dropped}

    @property
    def backlog(self) -> int:
        return sum(c.queued for c in self._sub.consumers)

    @property
    def held_bytes(self) -> int:
        """Bytes queued for this subscription's consumers."""
        return self._held

    async def close(self, *, save: bool = True) -> None:
        """Give back what is still queued (a subscription's consumers are normally removed first)."""
        for c in self._sub.consumers:
            self.consumer_lost(c)

"""A subscription: its consumers (in attach order) and the dispatcher that feeds them.

The subscription type is fixed by the first consumer (docs/WIRE.md C.7); later consumers asking for another
type join it as it is. An Exclusive subscription admits one consumer name at a time, counting only consumers
whose stream is active: a consumer that went away no longer blocks a new one (v0.7.3 keeps counting it, D.16).
"""

from __future__ import annotations

import asyncio
import time

from danube_fast.broker.consumer import Consumer
from danube_fast.broker.dispatch.cursor import Cursor
from danube_fast.broker.dispatch.dispatcher import Dispatcher
from danube_fast.errors import denied
from danube_fast.meta.resources import SubscriptionType


class Subscription:
    def __init__(self, topic_name: str, name: str, kind: SubscriptionType) -> None:
        self.topic_name = topic_name
        self.name = name
        self.kind = kind
        self.consumers: list[Consumer] = []
        self.dispatcher: Dispatcher  # set by the topic right after construction
        # Reliable: the position every dispatcher of this subscription moves (dispatch/cursor.py).
        self.cursor: Cursor | None = None
        self.idle_since: float | None = time.monotonic()
        # What went to its consumers' streams over the subscription's life, whichever API and dispatcher
        # served them (the dispatchers come and go with seeks and API switches; these stay): messages, and
        # their bytes as the dispatcher held them (stored bytes for a Reliable topic, payloads otherwise).
        self.delivered = 0
        self.delivered_bytes = 0
        self.expired = 0  # records message expiry acknowledged for it, since the topic was loaded here
        # Held while the dispatcher is replaced or closed (subscriptions.py): a seek, a switch between the
        # two APIs, a delete and a topic's close each see the others' result, never a half-made one.
        self.swapping = asyncio.Lock()
        self.closed = False  # deleted, or its topic closed here: nothing may give it a dispatcher again

    def by_name(self, consumer_name: str) -> Consumer | None:
        for c in self.consumers:
            if c.name == consumer_name:
                return c
        return None

    def check_admits(self, consumer_name: str, max_consumers: int) -> list[Consumer]:
        """The consumers a new one named `consumer_name` replaces (inactive Exclusive holders), or raise."""
        if self.kind == SubscriptionType.EXCLUSIVE:
            holders = [c for c in self.consumers if c.active]
            if holders:
                raise denied(f"Not able to subscribe to the topic {self.topic_name} due to: subscription "
                             f"{self.name!r} is Exclusive and consumer {holders[0].name!r} holds it")
            return list(self.consumers)
        if max_consumers and len(self.consumers) >= max_consumers:
            raise denied(f"Not able to subscribe to the topic {self.topic_name} due to: subscription "
                         f"{self.name!r} has reached max_consumers_per_subscription ({max_consumers})")
        return []

    def add(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.idle_since = None
        self.dispatcher.consumer_changed()

    def remove(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        consumer.end_streams()
        self.dispatcher.consumer_lost(consumer)
        if not self.consumers:
            self.idle_since = time.monotonic()

    def taken(self, messages: int, size: int) -> None:
        """A Danube API stream took `messages` (`size` bytes) queued for its consumer."""
        self.sent(messages, size)
        self.dispatcher.taken(size)

    def sent(self, messages: int, size: int) -> None:
        """`messages` (`size` bytes) went to a consumer stream: the Danube API's through `taken`, a fast-API
        stream's from its BatchDispatcher (dispatch/batches.py)."""
        self.delivered += messages
        self.delivered_bytes += size

    def stream_started(self, consumer: Consumer) -> None:
        self.idle_since = None
        self.dispatcher.consumer_changed()

    def stream_replaced(self, consumer: Consumer) -> None:
        """A new stream of `consumer` took over (C.8): Reliable messages the old stream had taken may never
        have reached the client, so what the consumer holds is delivered again (at least once)."""
        self.dispatcher.stream_replaced(consumer)

    def stream_ended(self, consumer: Consumer) -> None:
        self.dispatcher.consumer_lost(consumer)
        if not any(c.active for c in self.consumers):
            self.idle_since = time.monotonic()

    def takeover(self, consumer: Consumer) -> None:
        """Subscribe again under the same name: the old stream ends, what it held is delivered again."""
        consumer.resubscribed()
        self.dispatcher.consumer_lost(consumer)
        self.idle_since = None

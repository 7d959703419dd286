"""The producers and consumers on this broker's topics, by id, and what clients are told of those that went.

Danube clients hold on to ids: a producer sends with its id, a consumer streams and health-checks with its
id (docs/WIRE.md C.5, C.8). This registry answers those lookups, and remembers for a while:
- consumers that were removed (their topic deleted, an Exclusive holder replaced): their stream waits until a
  health check has told the client CLOSE, then ends with OK (services/consumer.py), for TOMBSTONE_SECONDS;
- topics that moved to another broker (cluster mode) and their producers: clients get UNAVAILABLE ("look it
  up again") and acks for them are dropped, for MOVED_SECONDS.

Ownership: the registry (topic_registry.py) and Subscriptions (subscriptions.py) add and remove; services
read through the methods. Everything runs on the event loop.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from danube_fast.errors import not_found, unavailable

if TYPE_CHECKING:
    from danube_fast.broker.consumer import Consumer
    from danube_fast.broker.topic import ProducerEntry, Topic

TOMBSTONE_SECONDS = 60.0
MOVED_SECONDS = 600.0  # how long clients of a topic that moved away get UNAVAILABLE ("look it up") here


def new_id(taken: Iterable[int] = ()) -> int:
    """A random non-zero u64, as Danube's ids are (clients treat them as opaque, docs/WIRE.md C.1)."""
    used = set(taken)
    while True:
        value = secrets.randbits(64)
        if value and value not in used:
            return value


class Clients:
    def __init__(self) -> None:
        self._producers: dict[int, ProducerEntry] = {}
        self._consumers: dict[int, Consumer] = {}
        self._gone: dict[int, tuple[float, asyncio.Event]] = {}  # removed consumer -> (when, told CLOSE)
        self._moved_topics: dict[str, float] = {}
        self._moved_producers: dict[int, float] = {}

    # -- producers -----------------------------------------------------------------------------------

    def new_producer_id(self) -> int:
        return new_id(self._producers)

    def add_producer(self, entry: ProducerEntry) -> None:
        self._producers[entry.producer_id] = entry
        self._moved_producers.pop(entry.producer_id, None)

    def has_producer(self, producer_id: int) -> bool:
        return producer_id in self._producers

    def producer(self, producer_id: int) -> ProducerEntry:
        """The producer; UNAVAILABLE if its topic moved away, NOT_FOUND if it is unknown."""
        entry = self._producers.get(producer_id)
        if entry is None and producer_id in self._moved_producers:
            raise unavailable(f"the topic of producer {producer_id} moved to another broker: redo the lookup")
        if entry is None:
            raise not_found(f"The producer with id {producer_id} does not exist")
        return entry

    def forget_producers(self, topic: Topic) -> None:
        """The topic was deleted (or failed to load): its producers are unknown from now on."""
        for entry in topic.producers.values():
            self._producers.pop(entry.producer_id, None)

    # -- consumers -----------------------------------------------------------------------------------

    def new_consumer_id(self) -> int:
        return new_id(self._consumers)

    def add_consumer(self, consumer: Consumer) -> None:
        self._consumers[consumer.id] = consumer

    def find_consumer(self, consumer_id: int) -> Consumer | None:
        return self._consumers.get(consumer_id)

    def consumer(self, consumer_id: int) -> Consumer:
        c = self._consumers.get(consumer_id)
        if c is None:
            raise not_found(f"The consumer with the id {consumer_id} does not exist")
        return c

    def consumers(self) -> Iterator[Consumer]:
        return iter(list(self._consumers.values()))

    def remove_consumer(self, consumer: Consumer) -> None:
        """Out of the registry and its subscription; its id is remembered for TOMBSTONE_SECONDS."""
        self._consumers.pop(consumer.id, None)
        consumer.subscription.remove(consumer)
        now = time.monotonic()
        self._gone[consumer.id] = (now, asyncio.Event())
        for cid in [cid for cid, (when, _) in self._gone.items() if now - when > TOMBSTONE_SECONDS]:
            del self._gone[cid]

    def gone(self, consumer_id: int) -> asyncio.Event | None:
        """For a consumer removed lately: set once a health check told its client CLOSE."""
        entry = self._gone.get(consumer_id)
        return entry[1] if entry is not None else None

    def told_close(self, consumer_id: int) -> None:
        """A health check answered CLOSE for `consumer_id`."""
        entry = self._gone.get(consumer_id)
        if entry is not None:
            entry[1].set()

    # -- topics that moved away (cluster mode) --------------------------------------------------------

    def moved_away(self, topic: Topic) -> None:
        """`topic` left this broker: its producers are remembered as moved, for MOVED_SECONDS."""
        now = time.monotonic()
        self._moved_topics = {k: t for k, t in self._moved_topics.items() if now - t < MOVED_SECONDS}
        self._moved_producers = {k: t for k, t in self._moved_producers.items() if now - t < MOVED_SECONDS}
        self._moved_topics[topic.full] = now
        for entry in topic.producers.values():
            self._producers.pop(entry.producer_id, None)
            self._moved_producers[entry.producer_id] = now

    def moved(self, full_name: str) -> bool:
        return full_name in self._moved_topics

    def came_back(self, full_name: str) -> None:
        """The topic is served here again."""
        self._moved_topics.pop(full_name, None)

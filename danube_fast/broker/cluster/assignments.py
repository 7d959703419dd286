"""Cluster mode's `Placement` (broker/ownership.py): where topics live, read from the LocalCache of
`/cluster/`, and how a new topic gets a home (an `unassigned` entry the leader's load manager places).

Owner: the broker's event loop. The reconciler (reconciler.py) calls `changed()` after each load or unload,
which wakes creators waiting for their topic here; other brokers' assignments are polled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from danube_fast.broker.cluster.view import ClusterView
from danube_fast.broker.config import BrokerConfig
from danube_fast.errors import ApiError, unavailable
from danube_fast.meta import keys
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import BrokerRegistration, Unassigned
from danube_fast.meta.store import Op, Put
from danube_fast.names import TopicName

POLL = 0.01  # seconds between looks at the cache while a new topic waits for its assignment

T = TypeVar("T")


class ClusterPlacement:
    clustered = True

    def __init__(self, config: BrokerConfig, cache: LocalCache, broker_id: int) -> None:
        self._config = config
        self.view = ClusterView(cache)
        self.me = broker_id
        self._changed = asyncio.Event()

    @property
    def assign_wait(self) -> float:
        return self._config.cluster.assign_wait_ms / 1000

    def owner(self, name: TopicName) -> int | None:
        """The registered broker the topic is assigned to (a dead broker's assignment does not count)."""
        owner = self.view.owner(name.namespace, name.topic)
        return owner if owner is not None and self.view.registration(owner) is not None else None

    def registration(self, broker: int) -> BrokerRegistration | None:
        return self.view.registration(broker)

    def place_new(self, name: TopicName) -> Op:
        return Put(keys.unassigned(name.namespace, name.topic), Unassigned().to_json())

    def taken(self, name: TopicName) -> ApiError:
        return unavailable(f"The topic {name} exists but is served by another broker (or is being placed), "
                           "redo the Lookup request")

    def changed(self) -> None:
        """A topic was loaded or unloaded here."""
        self._changed.set()

    async def created(self, name: TopicName, open_here: Callable[[], Awaitable[T]],
                      find: Callable[[str], T | None]) -> T:
        topic = await self.wait_loaded(name, find)
        if topic is None:
            raise unavailable("The topic metadata was created, need to redo the lookup to find the correct "
                              "broker")
        return topic

    async def loading_here(self, name: TopicName, find: Callable[[str], T | None]) -> T | None:
        if self.owner(name) != self.me:
            return None
        return await self.wait_loaded(name, find)

    async def wait_loaded(self, name: TopicName, find: Callable[[str], T | None]) -> T | None:
        """The topic once this broker serves it; None if it went to another broker or nothing happened
        within `assign_wait_ms` (the client then looks it up again)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.assign_wait):
                while True:
                    topic = find(name.full)
                    if topic is not None:
                        return topic
                    owner = self.owner(name)
                    if owner is not None and owner != self.me:
                        return None
                    self._changed.clear()  # set by this broker's loads; others' assignments are polled
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), POLL)
        return None

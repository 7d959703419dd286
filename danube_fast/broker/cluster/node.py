"""One broker's cluster machinery, started and stopped in order: the `/cluster/` cache, membership (lease,
registration, leadership, load reports), the reconciler (loads and unloads the topics assigned here) and
the load manager (acting while this broker leads). Standalone mode runs membership only: a cluster of one,
its own leader, so the admin API reads the same keys in both modes.

Stop: `drain()` first in cluster mode (SIGTERM): the broker marks itself draining and unloads its topics
through the sealed-state protocol, so the others continue them without a gap; then `close()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from danube_fast.broker.cluster.assignments import ClusterPlacement
from danube_fast.broker.cluster.load_manager import LoadManager
from danube_fast.broker.cluster.membership import SHUTDOWN, Membership
from danube_fast.broker.cluster.orphans import Orphans
from danube_fast.broker.cluster.reconciler import Reconciler
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.tiering import Tier
from danube_fast.broker.topic import Topic
from danube_fast.broker.topics import Topics
from danube_fast.meta import keys
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import BrokerMode, BrokerRegistration, BrokerState, Unassigned
from danube_fast.meta.store import Compare, Delete, MetadataError, MetadataStore, Put

log = logging.getLogger("danube_fast.cluster")

DRAIN_TIMEOUT = 15.0  # seconds a stopping broker waits for its topics to be sealed and taken over


class ClusterNode:
    def __init__(self, config: BrokerConfig, store: MetadataStore, topics: Topics, cache: LocalCache,
                 registration: BrokerRegistration, placement: ClusterPlacement | None) -> None:
        """`placement`: the one Topics was built with in cluster mode; None standalone."""
        self.config = config
        self.store = store
        self.topics = topics
        self.membership = Membership(store, topics.broker_id, config.cluster.name, registration,
                                     config.cluster.lease_ttl_s, config.cluster.load_report_ms / 1000,
                                     topics.names)
        self.cache = cache  # mirrors /cluster/ at least; owned by the broker
        self.on_loaded: Callable[[Topic], Awaitable[None]] | None = None
        self.placement = placement
        self.reconciler: Reconciler | None = None
        self.load_manager: LoadManager | None = None

    async def start(self) -> None:
        await self.membership.start()
        if self.placement is None:
            return
        reconciler = Reconciler(self.config, self.store, self.cache, self.topics, self.membership,
                                self.placement)
        tier = self.topics.tier
        if isinstance(tier, Tier):  # cluster mode has an object tier (server.py always opens one)
            reconciler.attach, reconciler.drain = tier.attach, tier.drain
            reconciler.recover = Orphans(self.config, self.store, tier, self.topics.broker_id).recover
        reconciler.on_loaded = self.on_loaded
        self.reconciler = reconciler
        self.load_manager = LoadManager(self.store, self.cache, self.membership.election, self.config.cluster)
        await reconciler.start()
        self.load_manager.start()

    async def drain(self, timeout: float = DRAIN_TIMEOUT) -> None:
        """Hand every topic this broker serves to the others (sealed), when there are others."""
        if self.reconciler is None or not self.topics.names():
            return
        me = self.topics.broker_id
        others = [kv for kv in self.cache.get_prefix(keys.register_prefix())
                  if kv.key != keys.broker_register(me)]
        if not others:
            return
        try:
            await self.store.put(keys.broker_state(me), BrokerState(BrokerMode.DRAINING, SHUTDOWN).to_json())
            for full in self.topics.names():
                ns, t = keys.split_topic_name(full)
                assignment = keys.broker_topic(me, ns, t)
                await self.store.transaction(
                    [Compare(assignment, "version", ">", 0)],
                    [Put(keys.unassigned(ns, t), Unassigned.unload(me).to_json()), Delete(assignment)], [])
        except MetadataError as e:
            log.warning("drain: %s; stopping without handing topics over", e)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self.topics.names():
                    await asyncio.sleep(0.05)
        log.info("drain: %d topics not handed over in time", len(self.topics.names()))

    async def close(self) -> None:
        if self.load_manager is not None:
            await self.load_manager.close()
        if self.reconciler is not None:
            await self.reconciler.close()
        await self.membership.close()


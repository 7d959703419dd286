"""One broker's cluster machinery, started and stopped in order: the `/cluster/` cache, membership (lease,
registration, leadership, load reports), the copies this broker keeps of others' replicated topics, the
reconciler (loads and unloads the topics assigned here), the replication of the topics it owns and the
load manager (acting while this broker leads). Standalone mode runs membership only: a cluster of one,
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
from danube_fast.broker.cluster.replication.follower import Copies
from danube_fast.broker.cluster.replication.manager import Replication
from danube_fast.broker.cluster.view import ClusterView
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.namespaces import Namespaces
from danube_fast.broker.services.forward import Forwarder
from danube_fast.broker.tiering import Tier
from danube_fast.broker.topic import Topic
from danube_fast.broker.topic_registry import TopicRegistry
from danube_fast.meta import keys
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import BrokerMode, BrokerRegistration, BrokerState, Unassigned
from danube_fast.meta.store import Compare, Delete, MetadataError, MetadataStore, Put
from danube_fast.storage.log_manager import LogManager

log = logging.getLogger("danube_fast.cluster")

DRAIN_TIMEOUT = 15.0  # seconds a stopping broker waits for its topics to be sealed and taken over


class ClusterNode:
    def __init__(self, config: BrokerConfig, store: MetadataStore, cache: LocalCache, topics: TopicRegistry,
                 logs: LogManager, registration: BrokerRegistration, placement: ClusterPlacement | None,
                 tier: Tier, on_loaded: Callable[[Topic], Awaitable[None]], namespaces: Namespaces,
                 forwarder: Forwarder) -> None:
        """`placement`: the registry's in cluster mode, None standalone (membership alone); `cache` mirrors
        /cluster/ at least (the broker's); `on_loaded`: what applies to a topic placed here before it serves
        anyone; `forwarder`: how this broker calls the others (a follower's fetches)."""
        self.config = config
        self.store = store
        self.topics = topics
        self.membership = Membership(store, topics.broker_id, config.cluster.name, registration,
                                     config.cluster.lease_ttl_s, config.cluster.load_report_ms / 1000,
                                     topics.names)
        self.cache = cache
        self.reconciler: Reconciler | None = None
        self.load_manager: LoadManager | None = None
        self.replication: Replication | None = None
        self.copies: Copies | None = None
        if placement is not None:
            orphans = Orphans(config, store, tier, topics.broker_id)
            view = ClusterView(cache)
            self.replication = Replication(config.cluster, topics, namespaces, view)
            self.copies = Copies(config, store, cache, view, forwarder, orphans)
            self.reconciler = Reconciler(config, store, cache, topics, logs, self.membership, placement, tier,
                                         orphans.recover, on_loaded, self.replication, self.copies)
            self.load_manager = LoadManager(store, cache, self.membership.election, config.cluster)

    async def start(self) -> None:
        await self.membership.start()
        if self.copies is not None:
            await self.copies.start()
        if self.reconciler is not None:
            await self.reconciler.start()
        if self.replication is not None:
            self.replication.start()
        if self.load_manager is not None:
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
        if self.replication is not None:
            await self.replication.close()
        if self.copies is not None:
            await self.copies.close()
        await self.membership.close()


"""Helpers of the cluster admin tests: brokers, topics and assignments written straight into a metadata store
through danube_fast.meta.keys and the typed resources, as the brokers and the load manager write them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from danube_fast.broker.cluster.view import CACHE_PREFIXES, ClusterView
from danube_fast.meta import keys
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import (
    NULL,
    BrokerRegistration,
    BrokerState,
    ClusterLeader,
    DeliveryMode,
    LoadReport,
    Policy,
    ResourceKind,
    SystemLoad,
    TopicDelivery,
    TopicRoot,
    Unassigned,
)
from danube_fast.meta.store import Compare, Delete, MetadataStore, Put

WAIT = 5.0


def registration(port: int) -> BrokerRegistration:
    """Broker `port`'s endpoints: admin on 127.0.0.1:port (http:// as Danube registers it)."""
    client = f"127.0.0.1:{port + 1}"
    return BrokerRegistration(admin_addr=f"http://127.0.0.1:{port}", advertised_addr=client,
                              broker_addr=f"http://{client}", prom_exporter=f"127.0.0.1:{port + 2}")


async def register(store: MetadataStore, broker_id: int, *, admin_port: int = 1, mode: str | None = "active",
                   reason: str = "boot") -> int:
    """A registered broker with a state (none if `mode` is None); returns the revision."""
    revision = await store.put(keys.broker_register(broker_id), registration(admin_port).to_json())
    if mode is not None:
        revision = await store.put(keys.broker_state(broker_id), BrokerState(mode, reason).to_json())
    return revision


async def lead(store: MetadataStore, broker_id: int) -> int:
    return await store.put(keys.leader(), ClusterLeader(broker_id).to_json())


async def namespace(store: MetadataStore, ns: str) -> int:
    return await store.put(keys.namespace_policy(ns), Policy().to_json())


async def topic(store: MetadataStore, ns: str, t: str, owner: int | None,
                delivery: DeliveryMode = DeliveryMode.NON_RELIABLE) -> int:
    """A topic as a broker creates it, assigned to `owner` (None: waiting in /cluster/unassigned/)."""
    ops = [Put(keys.topic_root(ns, t), TopicRoot(0).to_json()), Put(keys.namespace_topic(ns, t), NULL),
           Put(keys.topic_delivery(ns, t), TopicDelivery(delivery).to_json())]
    ops.append(Put(keys.broker_topic(owner, ns, t), NULL) if owner is not None
               else Put(keys.unassigned(ns, t), Unassigned().to_json()))
    return (await store.transaction([], ops, [])).revision


async def assign(store: MetadataStore, ns: str, t: str, broker_id: int) -> bool:
    """What the load manager does: assign an unassigned topic (marker deleted in the same transaction)."""
    marker = keys.unassigned(ns, t)
    txn = await store.transaction([Compare(marker, "version", ">", 0)],
                                  [Put(keys.broker_topic(broker_id, ns, t), NULL), Delete(marker)], [])
    return txn.succeeded


async def report(store: MetadataStore, broker_id: int, topics: list[str], cpu: int = 10) -> int:
    usage = (SystemLoad(ResourceKind.CPU, cpu), SystemLoad(ResourceKind.MEMORY, 5))
    value = LoadReport(usage, tuple(topics), len(topics))
    return await store.put(keys.load_report(broker_id), value.to_json())


@contextlib.asynccontextmanager
async def cluster_view(store: MetadataStore) -> AsyncIterator[ClusterView]:
    cache = await LocalCache.start(store, CACHE_PREFIXES)
    try:
        yield ClusterView(cache)
    finally:
        await cache.close()


async def synced(view: ClusterView, store: MetadataStore) -> None:
    """The view shows every write made to the store so far."""
    await view.cache.wait_for_revision(await store.current_revision(), WAIT)


async def until(condition: Callable[[], bool], timeout: float = WAIT, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.01)

"""The load manager's decisions (danube_fast/broker/cluster/load_manager.py) on both metadata stores: a real
LeaderElection and LocalCache, brokers and topics written straight through keys.py, one reconcile pass at a
time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest
from cluster_support import register, topic

from danube_fast.broker.cluster.load_manager import LoadManager
from danube_fast.broker.config import ClusterConfig
from danube_fast.meta import keys
from danube_fast.meta.election import LeaderElection
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import LoadBalanceDecision, SealedState, TopicReplicas, Unassigned
from danube_fast.meta.store import MetadataStore

pytestmark = [pytest.mark.timeout(60), pytest.mark.cluster]

LEADER = 1


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


@contextlib.asynccontextmanager
async def manager(s: MetadataStore, **config: int) -> AsyncIterator[LoadManager]:
    election = LeaderElection(s, LEADER, 5)
    await election.start()
    assert election.is_leader
    cache = await LocalCache.start(s, [keys.cluster_prefix()])
    try:
        yield LoadManager(s, cache, election, ClusterConfig(**config))
    finally:
        await cache.close()
        await election.close()


async def settle(lm: LoadManager, s: MetadataStore) -> None:
    """Let the cache see everything written so far."""
    await lm._cache.wait_for_revision(await s.current_revision(), 5.0)


async def owners(s: MetadataStore) -> dict[str, int]:
    found = {}
    for kv in await s.get_prefix(keys.brokers_prefix()):
        with contextlib.suppress(ValueError):
            b, ns, t = keys.parse_broker_topic(kv.key)
            found[keys.topic_name(ns, t)] = b
    return found


def test_new_topics_go_to_the_least_loaded_active_broker(store: Any) -> None:
    async def body() -> None:
        async with store() as s, manager(s) as lm:
            for b in (LEADER, 2, 3):
                await register(s, b)
            await register(s, 4, mode="draining")  # never chosen
            await topic(s, "ns", "busy1", 2)
            await topic(s, "ns", "busy2", 2)
            await topic(s, "ns", "busy3", 3)
            await topic(s, "ns", "new", None)
            await settle(lm, s)
            assert await lm.reconcile() is False
            assert (await owners(s))["/ns/new"] == LEADER  # 0 topics against 2 and 1
            assert await s.get(keys.unassigned("ns", "new")) is None
            decision = LoadBalanceDecision.from_json((await s.get(keys.load_balance())).value)  # type: ignore[union-attr]
            assert decision.assignments == {LEADER: ("/ns/new",)}
    run(body())


def test_a_dead_brokers_topics_move_to_live_ones(store: Any) -> None:
    async def body() -> None:
        async with store() as s, manager(s) as lm:
            await register(s, LEADER)
            await register(s, 2)
            await topic(s, "ns", "a", 9)  # broker 9 is not registered: its lease expired
            await topic(s, "ns", "b", 9)
            await settle(lm, s)
            await lm.reconcile()
            moved = await owners(s)
            assert moved["/ns/a"] in (LEADER, 2) and moved["/ns/b"] in (LEADER, 2)
            assert moved["/ns/a"] != moved["/ns/b"], "both went to one broker"
            assert not [kv for kv in await s.get_prefix(keys.broker_topics_prefix(9))
                        if kv.key != keys.broker_state(9)]
    run(body())


def test_an_unload_waits_for_the_old_owners_seal_then_goes_elsewhere(store: Any) -> None:
    async def body() -> None:
        async with store() as s, manager(s) as lm:
            await register(s, LEADER)
            await register(s, 2)
            await topic(s, "ns", "t", None)
            await s.put(keys.unassigned("ns", "t"), Unassigned.unload(2).to_json())
            reservation = SealedState(False, 10_000, 2, 1)  # broker 2 still holds it
            await s.put(keys.sealed_state("ns", "t"), reservation.to_json())
            await settle(lm, s)
            assert await lm.reconcile() is True, "the pass must say it waits"
            assert "/ns/t" not in await owners(s)
            await s.put(keys.sealed_state("ns", "t"), SealedState(True, 41, 2, 2).to_json())
            assert await lm.reconcile() is False
            assert (await owners(s))["/ns/t"] == LEADER, "an unloaded topic goes to another broker"
    run(body())


def test_a_handed_over_topic_goes_to_a_live_follower_it_was_handed_to(store: Any) -> None:
    """docs/REPLICATION.md, "A planned move": not to the idlest broker (LEADER holds nothing), to the one
    that holds the tail; with that one gone, to another broker (the tail a gap its copy fills)."""
    async def body() -> None:
        async with store() as s, manager(s) as lm:
            for b in (LEADER, 2, 3):
                await register(s, b)
            await topic(s, "ns", "x", 3)
            for name in ("t", "u"):
                await s.put(keys.unassigned("ns", name), Unassigned.unload(2).to_json())
            handed = SealedState(True, 41, 2, 2, extra={"handover": {"epoch": 5, "to": [3]}})
            await s.put(keys.sealed_state("ns", "t"), handed.to_json())
            gone = SealedState(True, 41, 2, 2, extra={"handover": {"epoch": 5, "to": [9]}})
            await s.put(keys.sealed_state("ns", "u"), gone.to_json())
            await settle(lm, s)
            assert await lm.reconcile() is False
            placed = await owners(s)
            assert placed["/ns/t"] == 3 and placed["/ns/u"] == LEADER
    run(body())


def test_a_rebalance_counts_a_replicated_topic_as_going_to_its_in_sync_follower(store: Any) -> None:
    async def body() -> None:
        async with store() as s, manager(s, rebalance_threshold=2) as lm:
            for b in (LEADER, 2, 3):
                await register(s, b)
            for i in range(4):
                await topic(s, "ns", f"t{i}", 2)
            await topic(s, "ns", "on3", 3)
            # t3, the one a rebalance would take first, is followed by broker 3 (one topic already)
            await s.put(keys.replicas("ns", "t3"), TopicReplicas(2, 1, (3,), (2, 3)).to_json())
            await settle(lm, s)
            planned = await lm.rebalance(dry_run=True, max_moves=None)
            assert [(m.topic, m.to_broker) for m in planned] == [("/ns/t3", 3), ("/ns/t2", LEADER)]
    run(body())


def test_an_unload_from_a_dead_broker_does_not_wait(store: Any) -> None:
    async def body() -> None:
        async with store() as s, manager(s) as lm:
            await register(s, LEADER)
            await topic(s, "ns", "t", None)
            await s.put(keys.unassigned("ns", "t"), Unassigned.unload(7).to_json())
            await s.put(keys.sealed_state("ns", "t"), SealedState(False, 99, 7, 1).to_json())
            await settle(lm, s)
            assert await lm.reconcile() is False
            assert (await owners(s))["/ns/t"] == LEADER
    run(body())


def test_rebalance_unloads_from_the_busiest_until_within_threshold(store: Any) -> None:
    async def body() -> None:
        async with store() as s, manager(s, rebalance_threshold=2) as lm:
            await register(s, LEADER)
            await register(s, 2)
            for i in range(5):
                await topic(s, "ns", f"t{i}", 2)
            await settle(lm, s)
            planned = await lm.rebalance(dry_run=True, max_moves=None)
            assert [(m.from_broker, m.to_broker) for m in planned] == [(2, LEADER), (2, LEADER)]
            assert len(await owners(s)) == 5, "a dry run changes nothing"
            assert len(await lm.rebalance(dry_run=False, max_moves=1)) == 1
            markers = await s.get_prefix(keys.unassigned_prefix())
            assert len(markers) == 1
            assert Unassigned.from_json(markers[0].value) == Unassigned.unload(2)
            assert len(await owners(s)) == 4  # the assignment went with the marker's creation
    run(body())


def test_a_deposed_leader_assigns_nothing(store: Any) -> None:
    async def body() -> None:
        async with store() as s, manager(s) as lm:
            await register(s, LEADER)
            await topic(s, "ns", "t", None)
            await settle(lm, s)
            await s.delete(keys.leader())  # another term begins elsewhere
            await s.put(keys.leader(), b"2")
            with contextlib.suppress(Exception):
                await lm.reconcile()
            assert "/ns/t" not in await owners(s)
    run(body())

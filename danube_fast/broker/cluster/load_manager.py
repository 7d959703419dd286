"""The load manager: the leader's reconcile loop over `/cluster/` (docs/TOPIC_MOVE.md#roles).

Each pass reads the LocalCache mirror of `/cluster/` and, while this broker leads:
1. moves the topics of brokers whose registration is gone (lease expired) to live brokers: a replicated
   topic to a live member of the in-sync set its dead owner wrote (`/cluster/replicas/`), which holds every
   record it acknowledged (docs/REPLICATION.md), the others to the least-loaded broker;
2. assigns `/cluster/unassigned/` topics to the least-loaded active broker. An unload marker
   (`{reason: "unload", from_broker: A}`) waits until A has sealed the topic (its reservation under `state`
   is gone, see handoff.py), A is dead, or A registered again since the marker (it restarted: it serves
   nothing it had), so the next owner never starts before the old one stopped;
   then it goes to a broker other than A when there is one;
3. when the busiest active broker has `rebalance_threshold` more topics than the idlest, unloads topics from
   it (at most one automatic round per cooldown); `rebalance()` does the same on demand (admin API).

Load is the number of assigned topics: it is exact and current, where load reports lag by seconds. Every
write is a transaction under the controller epoch (`LeaderElection.write_as_leader`) with compares on the keys
it read, so a deposed leader, or a pass racing an admin unload, changes nothing.

Owner: one task per broker (`run`); it acts only while `election.is_leader`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass

from danube_fast.broker.cluster.handoff import handover_of
from danube_fast.broker.cluster.moves import Move
from danube_fast.broker.cluster.view import ClusterView
from danube_fast.broker.config import ClusterConfig
from danube_fast.meta import keys
from danube_fast.meta.election import LeaderElection, NotLeader
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import (
    NULL,
    BrokerMode,
    LoadBalanceDecision,
    SealedState,
    TopicReplicas,
    Unassigned,
)
from danube_fast.meta.store import BadValue, Compare, Delete, MetadataError, MetadataStore, Put

log = logging.getLogger("danube_fast.cluster")

# Seconds between passes while something waits (an unload not yet sealed). The sealed state is not under
# /cluster/, so its write does not wake the loop; bench/RESULTS.md "Cluster" measured a 250 ms tick as half
# of a move's unavailability.
TICK = 0.05
SEAL_TIMEOUT = 30.0  # an old owner that has not sealed by then is treated as failed


@dataclass
class Snapshot:
    live: set[int]
    active: list[int]
    owners: dict[tuple[str, str], int]
    unassigned: dict[tuple[str, str], Unassigned]

    def counts(self) -> Counter[int]:
        c: Counter[int] = Counter({b: 0 for b in self.active})
        for owner in self.owners.values():
            if owner in self.live:
                c[owner] += 1
        return c


def snapshot(view: ClusterView) -> Snapshot:
    """Registered brokers (a broker without a state key counts as active), assignments and markers."""
    brokers = view.brokers()
    active = [b.broker_id for b in brokers if b.state is None or b.state.mode == BrokerMode.ACTIVE]
    return Snapshot({b.broker_id for b in brokers}, active, view.owners(),
                    {(u.namespace, u.topic): u.marker for u in view.unassigned()})


def least_loaded(counts: Counter[int], candidates: list[int]) -> int | None:
    if not candidates:
        return None
    low = min(counts[b] for b in candidates)
    return random.choice([b for b in candidates if counts[b] == low])


class LoadManager:
    def __init__(self, store: MetadataStore, cache: LocalCache, election: LeaderElection,
                 config: ClusterConfig) -> None:
        self._store = store
        self._cache = cache
        self._view = ClusterView(cache)
        self._election = election
        self._config = config
        self._waiting_since: dict[tuple[str, str], float] = {}
        self._last_rebalance = time.monotonic()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._pump: asyncio.Task[None] | None = None

    def start(self) -> None:
        sub = self._cache.subscribe(keys.cluster_prefix())

        async def pump() -> None:
            async for _ in sub:
                self._wake.set()

        self._pump = asyncio.create_task(pump(), name="load-manager-events")
        self._election.on_change(lambda _: self._wake.set())
        self._task = asyncio.create_task(self._run(), name="load-manager")

    async def close(self) -> None:
        for task in (self._task, self._pump):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._task, self._pump) if t is not None), return_exceptions=True)

    async def _run(self) -> None:
        while True:
            waiting = False
            if self._election.is_leader:
                try:
                    waiting = await self.reconcile()
                except NotLeader:
                    pass
                except MetadataError as e:
                    log.warning("load manager pass failed: %s", e)
                    waiting = True
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK if waiting else 2.0)

    async def reconcile(self) -> bool:
        """One pass; True while something waits for another pass (an unload not yet sealed)."""
        snap = snapshot(self._view)
        counts = snap.counts()
        changed: dict[int, list[str]] = {}
        for (ns, t), owner in sorted(snap.owners.items()):
            if owner in snap.live:
                continue
            in_sync, compare = self._in_sync(ns, t, owner, snap)
            target = least_loaded(counts, in_sync or snap.active)
            if target is None:
                break
            old = keys.broker_topic(owner, ns, t)
            done = await self._election.write_as_leader(
                [Delete(old), Put(keys.broker_topic(target, ns, t), NULL)],
                [Compare(old, "version", ">", 0), Compare(keys.broker_register(owner), "version", "==", 0),
                 compare])
            if done.succeeded:
                counts[target] += 1
                changed.setdefault(target, []).append(keys.topic_name(ns, t))
                log.info("moved %s from dead broker %d to broker %d", keys.topic_name(ns, t), owner, target)
        waiting = False
        for (ns, t), marker in sorted(snap.unassigned.items()):
            if (ns, t) in snap.owners:
                continue  # an admin or a racing pass assigned it; the marker is stale, left alone
            source = marker.from_broker
            handed: tuple[int, ...] = ()
            if source is not None:
                released, handed = await self._released_by(ns, t, source, snap)
                if not released:
                    waiting = True
                    continue
            self._waiting_since.pop((ns, t), None)
            others = [b for b in snap.active if b != source] or snap.active
            # Handed over: to a follower that holds the tail (docs/REPLICATION.md, "A planned move").
            target = least_loaded(counts, [b for b in handed if b in others] or others)
            if target is None:
                break
            marker_key = keys.unassigned(ns, t)
            done = await self._election.write_as_leader(
                [Delete(marker_key), Put(keys.broker_topic(target, ns, t), NULL)],
                [Compare(marker_key, "version", ">", 0)])
            if done.succeeded:
                counts[target] += 1
                changed.setdefault(target, []).append(keys.topic_name(ns, t))
                log.info("assigned %s to broker %d", keys.topic_name(ns, t), target)
        if changed:
            await self._store.put(keys.load_balance(),
                                  LoadBalanceDecision({b: tuple(ts) for b, ts in changed.items()}).to_json())
        cooldown = self._config.rebalance_cooldown_ms / 1000
        if not waiting and time.monotonic() - self._last_rebalance >= cooldown:
            self._last_rebalance = time.monotonic()
            await self.rebalance(dry_run=False, max_moves=None)
        return waiting

    def _in_sync(self, ns: str, t: str, owner: int, snap: Snapshot) -> tuple[list[int], Compare]:
        """The live, active brokers of the in-sync set `owner` wrote for the topic, else of its eligible
        followers (none if it is not replicated), and the compare that keeps the move to them as read."""
        key = keys.replicas(ns, t)
        kv = self._cache.get(key)
        if kv is None:
            return [], Compare(key, "version", "==", 0)
        compare = Compare(key, "mod_revision", "==", kv.mod_revision)
        try:
            replicas = TopicReplicas.from_json(kv.value, key=kv.key)
        except BadValue:
            return [], compare
        if replicas.owner != owner:
            return [], compare
        live = [b for b in replicas.successors if b in snap.live and b in snap.active]
        in_sync = [b for b in live if b in replicas.isr]
        return in_sync or live, compare

    def _registered_since(self, source: int, ns: str, t: str) -> bool:
        """The old owner registered again after the unload was asked for (it restarted, or its lease
        lapsed): it serves none of its earlier topics until they are assigned to it again, so no seal is
        coming, and its WAL is recovered as an orphan (cluster/orphans.py) like a dead owner's."""
        registration = self._cache.get(keys.broker_register(source))
        marker = self._cache.get(keys.unassigned(ns, t))
        return registration is not None and marker is not None and \
            registration.mod_revision > marker.create_revision

    async def _released_by(self, ns: str, t: str, source: int, snap: Snapshot
                           ) -> tuple[bool, tuple[int, ...]]:
        """(the old owner has let go, the followers it handed the topic to). It has let go once its
        reservation under `state` is gone (sealed, or deleted when nothing was committed), or it is dead,
        registered again since the unload, or has not sealed within SEAL_TIMEOUT."""
        kv = await self._store.get(keys.sealed_state(ns, t))
        state = None if kv is None else SealedState.from_json(kv.value, key=kv.key)
        handover = handover_of(state) if state is not None and state.broker_id == source else None
        handed = handover.to if handover is not None else ()
        if source not in snap.live or self._registered_since(source, ns, t):
            return True, handed
        since = self._waiting_since.setdefault((ns, t), time.monotonic())
        if state is None or state.sealed or state.broker_id != source:
            return True, handed
        if time.monotonic() - since > SEAL_TIMEOUT:
            log.warning("broker %d has not sealed %s in %.0f s; assigning it anyway", source,
                        keys.topic_name(ns, t), SEAL_TIMEOUT)
            return True, ()
        return False, ()

    async def rebalance(self, *, dry_run: bool, max_moves: int | None) -> list[Move]:
        """Unload topics from the busiest active brokers until no two differ by `rebalance_threshold` or
        more (the assign step then places each on the idlest broker)."""
        if not self._election.is_leader:
            raise NotLeader(f"broker {self._election.broker_id} is not the leader: rebalance there")
        snap = snapshot(self._view)
        counts = snap.counts()
        by_broker: dict[int, list[tuple[str, str]]] = {b: [] for b in snap.active}
        for topic, owner in sorted(snap.owners.items()):
            if owner in by_broker:
                by_broker[owner].append(topic)
        moves: list[Move] = []
        threshold = max(2, self._config.rebalance_threshold)
        while len(snap.active) > 1 and (max_moves is None or len(moves) < max_moves):
            busy = max(snap.active, key=lambda b: counts[b])
            idle = min(snap.active, key=lambda b: counts[b])
            if counts[busy] - counts[idle] < threshold or not by_broker[busy]:
                break
            # A replicated topic goes to its in-sync follower (docs/REPLICATION.md, "A planned move"):
            # only a topic whose next owner is idle enough for the move to even things out is unloaded.
            found = None
            for i in range(len(by_broker[busy]) - 1, -1, -1):
                ns, t = by_broker[busy][i]
                followers = [b for b in self._in_sync(ns, t, busy, snap)[0] if b != busy]
                target = min(followers, key=lambda b: counts[b]) if followers else idle
                if counts[target] + 1 < counts[busy]:
                    found = by_broker[busy].pop(i), target
                    break
            if found is None:
                break
            (ns, t), target = found
            moves.append(Move(keys.topic_name(ns, t), busy, target, float(counts[busy]),
                              "topic count imbalance"))
            counts[busy] -= 1
            counts[target] += 1
        if dry_run:
            return moves
        for move in moves:
            ns, t = keys.split_topic_name(move.topic)
            old = keys.broker_topic(move.from_broker, ns, t)
            await self._election.write_as_leader(
                [Put(keys.unassigned(ns, t), Unassigned.unload(move.from_broker).to_json()), Delete(old)],
                [Compare(old, "version", ">", 0)])
            log.info("rebalance: unloading %s from broker %d", move.topic, move.from_broker)
        return moves

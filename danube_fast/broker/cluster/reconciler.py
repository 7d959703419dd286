"""The broker side of topic placement: serve exactly the topics assigned to this broker.

The LocalCache mirrors `/cluster/`; every change under `/cluster/brokers/{me}/` reconciles that one topic
(serialised per topic, against the current state rather than the event, so a burst of events ends in the
right place):
- assigned and not served -> load it (handoff.load_point says where its offsets continue; a local WAL that
  is not this broker's continuing log is an orphan, recovered first), with a TopicGuard fenced on the
  assignment's create revision and an offset reservation written before the first append; a replicated
  topic whose dead owner this broker followed in sync continues from this broker's copy instead
  (`_takeover`, docs/REPLICATION.md), and a replicated topic's copies are set up before it serves;
- served but no longer assigned -> if the unload marker names this broker, the sealed-state unload of
  docs/TOPIC_MOVE.md (cursors flushed, uploader drained, `state` sealed, WAL deleted), fenced on that
  marker; otherwise the ownership is lost (the leader gave the topic away, e.g. after this broker's lease
  expired): stop at once, write nothing, and recover the WAL as an orphan.

Owner: the broker's event loop. `start()` after the membership is up, `close()` before the topics close.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable

from danube_fast.broker import crashpoints
from danube_fast.broker.cluster import handoff
from danube_fast.broker.cluster.assignments import ClusterPlacement
from danube_fast.broker.cluster.guard import TopicGuard
from danube_fast.broker.cluster.membership import Membership
from danube_fast.broker.cluster.replication.follower import Copies, TakenCopy
from danube_fast.broker.cluster.replication.manager import Replication
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.tiering import Tier
from danube_fast.broker.topic import Topic, stored
from danube_fast.broker.topic_registry import TopicRegistry
from danube_fast.errors import DanubeError
from danube_fast.meta import keys
from danube_fast.meta.fencing import Ownership
from danube_fast.meta.local_cache import EventFeed, LocalCache
from danube_fast.meta.resources import (
    UNLOAD,
    ReplacedLog,
    SealedState,
    TermSuccessors,
    TopicReplicas,
    Unassigned,
)
from danube_fast.meta.store import Delete, KeyValue, MetadataError, MetadataStore, Put
from danube_fast.names import TopicName
from danube_fast.storage.log_manager import LogManager
from danube_fast.storage.objects.catalog import load_descriptors

log = logging.getLogger("danube_fast.cluster")

RETRY_DELAY = 1.0  # seconds before a failed load or unload is tried again
ORPHAN_RETRY_MAX = 30.0  # seconds between tries to recover an orphan WAL, at most
# A load refused as retriable (the topic's guard: it moved on meanwhile) is placed again this many times,
# this long apart, before the topic counts as broken here.
MOVED_ON_RETRIES = 3
MOVED_ON_DELAY = 0.05
# Seconds a planned move of a replicated topic waits for an in-sync follower to hold all of its WAL, before
# it uploads the tail instead (a follower in sync is a fetch or two behind).
HANDOVER_TIMEOUT = 2.0

Recover = Callable[[TopicName, str], Awaitable[None]]  # an orphan WAL directory into the objects


class Reconciler:
    def __init__(self, config: BrokerConfig, store: MetadataStore, cache: LocalCache, topics: TopicRegistry,
                 logs: LogManager, membership: Membership, placement: ClusterPlacement, tier: Tier,
                 recover: Recover, on_loaded: Callable[[Topic], Awaitable[None]],
                 replication: Replication, copies: Copies) -> None:
        """`tier`: starts a loaded topic's uploads and drains them at a sealed unload; `recover`: an orphan
        WAL directory (cluster/orphans.py); `on_loaded`: what must apply to a topic before it serves anyone
        (its schema configuration); `replication`: the copies of the replicated topics loaded here;
        `copies`: this broker's copies of others' topics."""
        self._config = config
        self._store = store
        self._cache = cache
        self._topics = topics
        self._logs = logs
        self._membership = membership
        self._placement = placement
        self._tier = tier
        self._recover_orphan_wal = recover
        self._on_loaded = on_loaded
        self._replication = replication
        self._copies = copies
        self.me = membership.broker_id
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._follower: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        sub = self._cache.subscribe(keys.broker_topics_prefix(self.me))
        for kv in self._cache.get_prefix(keys.broker_topics_prefix(self.me)):
            self._event(kv.key)
        self._follower = asyncio.create_task(self._follow(sub), name="placement")
        await self._recover_orphans()

    async def close(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, *(t for t in [self._follower] if t), return_exceptions=True)

    async def _follow(self, sub: EventFeed) -> None:
        async for event in sub:
            self._event(event.key)

    def _event(self, key: str) -> None:
        try:
            _, ns, t = keys.parse_broker_topic(key)
        except ValueError:
            return  # the broker's state key
        task = asyncio.create_task(self._reconcile(ns, t))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reconcile(self, ns: str, t: str) -> None:
        lock = self._locks.setdefault((ns, t), asyncio.Lock())
        async with lock:
            moved_on = 0
            while True:
                try:
                    await self._reconcile_once(TopicName(ns, t))
                    break
                except MetadataError as e:
                    log.warning("placing %s: %s; retrying", keys.topic_name(ns, t), e)
                    await asyncio.sleep(RETRY_DELAY)
                except DanubeError as e:
                    moved_on += 1
                    if not e.retriable or moved_on > MOVED_ON_RETRIES:
                        await self._topics.mark_broken(TopicName(ns, t), e)
                        break
                    # Most likely the topic moved on while it loaded (its guard refused with UNAVAILABLE):
                    # nothing is broken; place it again from what the assignments say now.
                    log.info("placing %s: %s; placing it again", keys.topic_name(ns, t), e)
                    await asyncio.sleep(MOVED_ON_DELAY)
                except Exception as e:  # this topic's storage: the broker serves its others
                    await self._topics.mark_broken(TopicName(ns, t), e)
                    break
            self._placement.changed()

    async def _reconcile_once(self, name: TopicName) -> None:
        await self._topics.settled(name)  # a delete here ends first: it takes the topic apart itself
        kv = self._cache.get(keys.broker_topic(self.me, name.namespace, name.topic))
        topic = self._topics.find(name.full)
        if kv is None:
            self._topics.forget_broken(name)  # no longer this broker's to load
            if topic is None and os.path.isdir(self._logs.directory(name)):
                # A WAL left here (a crash) whose assignment the cache still showed when the broker started,
                # so the start's orphan pass passed it over: recover it now, or readers wait at its gap and
                # finally read past acknowledged records (the chaos campaign caught it).
                self._orphan(name)
        if kv is not None:
            guard = topic.fence if topic is not None else None
            if isinstance(guard, TopicGuard) and guard.ownership.revision == kv.create_revision \
                    and guard.ownership.key == kv.key:
                return
            if topic is not None:  # assigned anew while still served: the old term is over
                await self._lose(topic)
            await self._load(name, kv.create_revision)
        elif topic is not None:
            marker_kv = await self._store.get(keys.unassigned(name.namespace, name.topic))
            marker = None if marker_kv is None else Unassigned.from_json(marker_kv.value, key=marker_kv.key)
            if marker_kv is not None and marker is not None and marker.reason == UNLOAD \
                    and marker.from_broker == self.me:
                await self._seal(topic, marker_kv)
            else:
                await self._lose(topic)

    # -- load ----------------------------------------------------------------------------------------------

    def _ownership(self, key: str, revision: int) -> Ownership:
        return Ownership(self._store, key, revision, lambda: self._membership.lease_deadline)

    async def _load(self, name: TopicName, revision: int) -> None:
        ns, t = name.namespace, name.topic
        ownership = self._ownership(keys.broker_topic(self.me, ns, t), revision)
        await ownership.revalidate()  # the cache may lag: never load on a stale assignment
        copy = await self._copies.take(name)
        point = await handoff.load_point(self._store, ns, t, self.me)
        directory = self._logs.directory(name)
        if os.path.isdir(directory) and not point.keep_local:
            await self._recover(name, directory)
        if await self._store.get(keys.replaced_log(ns, t, self.me)) is not None:
            # From an earlier term of this broker's: this term's log, should it be orphaned, holds records
            # no follower has, and its recovery must upload them, not go by that key.
            await ownership.write_fenced([Delete(keys.replaced_log(ns, t, self.me))])
        taken = None
        if copy is not None:
            taken = await self._takeover(name, ownership, point, copy)
            if taken is not None:
                point = taken
        if taken is None:
            await self._note_successors(name, ownership)
        m = self._membership
        block = self._config.cluster.reserve_offsets
        guard = TopicGuard(name.full, ownership, lambda: (m.session, m.pauses), m.paused,
                           lambda write: handoff.Reservation(ns, t, self.me, write, block, point.gaps))
        # Its schema configuration applies before anyone finds it: a send before that would skip the
        # topic's ENFORCE check, and a producer's subject would be decided on the defaults.
        topic = await self._topics.load_topic(name, guard, initial_offset=point.start, gaps=point.gaps,
                                              sequences=point.sequences, prepare=self._on_loaded)
        if topic is None:
            return
        reliable = stored(topic)
        if reliable is not None:
            # First, before anything can be published (the topic is served from here): attach sets the
            # topic's copies before its first await, so no send is acknowledged with one copy meanwhile.
            await self._replication.attach(reliable, guard)
        if reliable is None:
            guard.stores_nothing()
        else:
            await guard.admit(0)  # the reservation is written before anything is acknowledged
            guard.done()
            if copy is not None and taken is None:  # it fills the gap the reservation records
                self._copies.retire_taken(name)
            crashpoints.reach(crashpoints.MID_LOAD)
            await self._tier.attach(reliable, None if point.keep_local else point.start - 1)

    async def _note_successors(self, name: TopicName, ownership: Ownership) -> None:
        """The topic comes here from a dead owner whose term was replicated, but without a copy here (no
        successor was alive): write which followers held every record it acknowledged, before this broker
        overwrites the copies' key, so that such a follower, coming back, fills the dead owner's gap from
        its copy and closes it (follower.py, orphans.py `recover_copy`)."""
        ns, t = name.namespace, name.topic
        state = await handoff.read_state(self._store, ns, t)
        if state is None or state.broker_id == self.me:
            return
        handover = handoff.handover_of(state)
        if handover is not None:  # handed over, but none of those it was handed to is alive
            epoch, successors = handover.epoch, handover.to
        else:
            kv = await self._store.get(keys.replicas(ns, t))
            if state.sealed or kv is None:
                return
            replicas = TopicReplicas.from_json(kv.value, key=kv.key)
            if replicas.owner != state.broker_id or not replicas.successors:
                return
            epoch, successors = replicas.epoch, replicas.successors
        record = TermSuccessors(epoch, successors).to_json()
        await ownership.write_fenced([Put(keys.term_successors(ns, t, state.broker_id), record)])
        log.info("%s: broker %d's term %d went on without its copies; %s hold all it acknowledged", name,
                 state.broker_id, epoch, list(successors))

    async def _takeover(self, name: TopicName, ownership: Ownership, point: handoff.LoadPoint,
                        copy: TakenCopy) -> handoff.LoadPoint | None:
        """The topic's owner died and this broker holds an in-sync copy of that owner's term: the copy holds
        every record it acknowledged, so it becomes this broker's WAL and the topic continues after it, with
        no gap for readers to wait at (docs/REPLICATION.md, "Failover"). None when the copy does not
        qualify (another term, not in the written in-sync set, behind the objects): today's load then."""
        ns, t = name.namespace, name.topic
        state = await handoff.read_state(self._store, ns, t)
        dead = copy.owner
        if not await self._continues(name, state, copy) or copy.end <= point.uploaded:
            log.info("%s: the copy of broker %d's term %d (to %d) is not taken over", name, dead, copy.epoch,
                     copy.end)
            return None
        directory = self._logs.directory(name)
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        os.rename(copy.log_dir, directory)
        if dead != self.me:  # (this broker's own log, handed over and now taken back, needs no mark)
            replaced = ReplacedLog(copy.end - 1, self.me).to_json()
            await ownership.write_fenced([Put(keys.replaced_log(ns, t, dead), replaced)])
            # The dead owner, back already, may have recovered its WAL first (orphans.py: its descriptors are
            # refused from that key on): if they reach this copy's end, the topic goes on past them instead.
            found = await load_descriptors(self._store, ns, t)
            if any(d.end_offset >= copy.end for d in found):
                log.info("%s: broker %d recovered its log before the takeover; not taken over", name, dead)
                await ownership.write_fenced([Delete(keys.replaced_log(ns, t, dead))])  # let it finish
                os.rename(directory, copy.log_dir)  # back where it was: discarded with the copy
                return None
        log.info("%s: taken over from dead broker %d with this broker's copy (offsets to %d)", name, dead,
                 copy.end - 1)
        await self._copies.discard(name)
        gaps = tuple(g for g in point.gaps if g[2] != dead)
        return handoff.LoadPoint(copy.end, True, point.uploaded, gaps, point.sequences)

    async def _continues(self, name: TopicName, state: SealedState | None, copy: TakenCopy) -> bool:
        """The copy holds every record its term acknowledged: the term's owner handed the topic over to
        this broker (or it is that owner's own log, kept as a copy), or it died with this broker among the
        in-sync (or eligible) followers it wrote."""
        if state is None or state.broker_id != copy.owner:
            return False
        handover = handoff.handover_of(state)
        if handover is not None:
            return handover.epoch == copy.epoch and copy.end > state.last_committed_offset and \
                (self.me in handover.to or self.me == copy.owner)
        if state.sealed:
            return False
        kv = await self._store.get(keys.replicas(name.namespace, name.topic))
        replicas = None if kv is None else TopicReplicas.from_json(kv.value, key=kv.key)
        return replicas is not None and (replicas.owner, replicas.epoch) == (copy.owner, copy.epoch) \
            and self.me in replicas.successors

    # -- unload --------------------------------------------------------------------------------------------

    async def _seal(self, topic: Topic, marker: KeyValue) -> None:
        """The unload (docs/TOPIC_MOVE.md), every write fenced on the unload marker that names this broker.
        A replicated topic whose in-sync followers hold all of its WAL is handed to them instead of
        drained (docs/REPLICATION.md, "A planned move"): its WAL stays here as a copy."""
        guard = topic.fence
        assert isinstance(guard, TopicGuard)
        guard.fence_on(self._ownership(marker.key, marker.create_revision))
        ns, t = topic.name.namespace, topic.name.topic

        async def seal(topic: Topic) -> bool:
            reliable = stored(topic)
            if reliable is None:
                return False  # nothing stored: nothing to hand over
            epoch, to = await self._replication.hand_over(reliable, HANDOVER_TIMEOUT)
            handover = handoff.Handover(epoch, tuple(to)) if to else None
            if handover is None:
                await self._tier.drain(reliable)
            else:  # the tail stays in the followers' copies, and in this WAL, kept as a copy
                await self._tier.detach(reliable)
                await self._logs.close(reliable.wal)
                await self._copies.keep_handed(topic.name, reliable.wal.directory, handover.epoch,
                                               handover.to)
            gaps = guard.reservation.gaps if guard.reservation is not None else []
            # The marker is written again, unchanged, with the sealed state: the leader's load manager, which
            # follows /cluster/ and not the state key, hears of the seal at once.
            await guard.write([*handoff.state_ops(ns, t, self.me, sealed=True,
                                                  last=reliable.wal.committed_offset - 1, gaps=gaps,
                                                  sequences=reliable.sequences.snapshot(), handover=handover),
                               Put(marker.key, marker.value)])
            crashpoints.reach(crashpoints.AFTER_SEAL)
            if handover is not None:
                log.info("%s: handed over to in-sync broker(s) %s at offset %d", topic.full, list(to),
                         reliable.wal.committed_offset)
            return handover is not None

        self._replication.sealing(topic.full)
        try:
            await self._topics.unload_topic(topic, seal)
        finally:
            reliable = stored(topic)
            if reliable is not None:
                self._replication.detach(reliable)

    async def _lose(self, topic: Topic) -> None:
        reliable = stored(topic)
        if reliable is not None:
            self._replication.detach(reliable)
        await self._topics.unload_topic(topic, None)
        if reliable is not None:
            await self._recover(topic.name, reliable.wal.directory)

    async def _recover(self, name: TopicName, directory: str) -> None:
        await self._recover_orphan_wal(name, directory)

    async def _recover_orphans(self) -> None:
        """WAL directories of topics not assigned here: left by a crash or a lost ownership."""
        root = self._config.wal_root
        if not os.path.isdir(root):
            return
        for ns in sorted(os.listdir(root)):
            for t in sorted(os.listdir(os.path.join(root, ns))):
                self._orphan(TopicName(ns, t))

    def _orphan(self, name: TopicName) -> None:
        task = asyncio.create_task(self._recover_orphan(name), name=f"orphan {name.full}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _recover_orphan(self, name: TopicName) -> None:
        """Recover the WAL directory of `name` if it is an orphan (not assigned here, not served), under the
        topic's lock (a reconcile of the topic may be at it too), trying again with backoff while it fails
        (the object store or etcd away): until then its records sit in a gap that readers wait at."""
        delay = RETRY_DELAY
        while True:
            async with self._locks.setdefault((name.namespace, name.topic), asyncio.Lock()):
                await self._topics.settled(name)  # a deleted topic's WAL is the delete's to remove
                directory = self._logs.directory(name)
                if self._cache.get(keys.broker_topic(self.me, name.namespace, name.topic)) is not None or \
                        self._topics.find(name.full) is not None or not os.path.isdir(directory):
                    return  # assigned here again (its load recovers it), or recovered already
                try:
                    await self._recover(name, directory)
                    return
                except Exception as e:
                    log.warning("recovering the orphan WAL of %s failed (retry in %.0f s): %s", name, delay,
                                e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, ORPHAN_RETRY_MAX)

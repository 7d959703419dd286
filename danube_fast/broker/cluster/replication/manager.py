"""Which of the topics this broker owns are replicated, and the pass that keeps their copies
(docs/REPLICATION.md).

`attach` runs when the reconciler loads a Reliable topic, before it serves anyone: a topic whose policy
says `replicationFactor` > 1 gets a ReplicaSet whose first write (this broker alone in sync) lands before
any acknowledgement. One task per broker (`run`) then, every eighth of `replica_lag_ms`, lets each
ReplicaSet drop lagging or dead followers from its in-sync set and replace dead ones; and every `[cluster]
replica_check_ms` reads each served topic's policy again, so a changed replicationFactor or
minInSyncReplicas applies without a move (topic policies are not cached: docs/RETENTION.md).

Owner: the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter

from danube_fast.broker.cluster.guard import TopicGuard
from danube_fast.broker.cluster.replication.owner import ReplicaSet
from danube_fast.broker.cluster.view import ClusterView
from danube_fast.broker.config import ClusterConfig
from danube_fast.broker.namespaces import Namespaces
from danube_fast.broker.topic import ReliableTopic
from danube_fast.broker.topic_registry import TopicRegistry
from danube_fast.codec.replication_wire import FetchParts
from danube_fast.errors import precondition
from danube_fast.meta import keys
from danube_fast.meta.resources import BrokerMode, Policy, TopicReplicas
from danube_fast.meta.store import BadValue, Delete, InvalidKey, MetadataError
from danube_fast.proto import Replication_pb2 as pb

log = logging.getLogger("danube_fast.replication")

# Seconds between passes over the replicated topics: an eighth of replica_lag_ms, within these bounds (a
# pass costs a few microseconds per topic; at 10,000 topics, 10 passes a second would take half a core).
MIN_TICK, MAX_TICK = 0.1, 1.0


class Replication:
    def __init__(self, config: ClusterConfig, topics: TopicRegistry, namespaces: Namespaces,
                 view: ClusterView) -> None:
        self._config = config
        self._topics = topics
        self._namespaces = namespaces
        self._view = view
        self.me = topics.broker_id
        self._sets: dict[str, ReplicaSet] = {}  # by stored topic
        self._handing: set[str] = set()  # topics being unloaded, maybe handed over (sealing, hand_over)
        self._task: asyncio.Task[None] | None = None
        self._policies_read = time.monotonic()

    def find(self, topic: str) -> ReplicaSet | None:
        return self._sets.get(topic)

    async def fetch(self, request: pb.FetchRequest, transport: str) -> FetchParts:
        """A follower's fetch, over `transport`: "grpc" (service.py) or "native" (services/native.py). One
        for a topic this broker does not own as a replicated topic, under another term (epoch), or from a
        broker that is not one of its followers is FAILED_PRECONDITION: the follower reads the metadata
        again and asks whoever owns it now."""
        rs = self._sets.get(request.topic)
        if rs is None:
            raise precondition(f"broker {self.me} does not own {request.topic} as a replicated topic")
        if request.epoch != rs.epoch:
            raise precondition(f"broker {self.me} owns {request.topic} in term {rs.epoch}, "
                               f"not {request.epoch}")
        if request.follower_id not in rs.followers:
            raise precondition(f"broker {request.follower_id} is not a follower of {request.topic} "
                               f"(they are {sorted(rs.followers)})")
        return await rs.fetch(request, transport)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="replication")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for rs in self._sets.values():
            rs.close()
        self._sets.clear()

    # -- topics coming and going -----------------------------------------------------------------------

    async def attach(self, topic: ReliableTopic, guard: TopicGuard) -> None:
        """At load, before the topic serves: replicate it if its policy says so."""
        if topic.policy.copies > 1:
            await self._replicate(topic, guard, topic.policy)
        elif self._view.cache.get(keys.replicas(topic.name.namespace, topic.name.topic)) is not None:
            # An earlier term's copies, of a topic no longer replicated: their followers drop them.
            await guard.write([Delete(keys.replicas(topic.name.namespace, topic.name.topic))])

    async def hand_over(self, topic: ReliableTopic, timeout: float) -> tuple[int, list[int]]:
        """A planned move of a topic that stopped appending: (its term, the in-sync followers holding all
        of it); no followers when it is not replicated or none caught up within `timeout`. The topic's
        copies stop being kept here either way."""
        rs = self._sets.get(topic.full)
        if rs is None:
            return 0, []
        try:
            return rs.epoch, await rs.hand_over(timeout)
        finally:
            self._handing.discard(topic.full)
            self.detach(topic, release=True)  # what no follower holds is drained, when none took it all

    def sealing(self, topic: str) -> None:
        """The topic is being unloaded: the pass leaves its copies alone (the registry drops the topic
        before the seal hands it over) until `hand_over` or `detach`."""
        if topic in self._sets:
            self._handing.add(topic)

    def detach(self, topic: ReliableTopic, release: bool = False) -> None:
        """The topic stops being replicated here; `release`: its readers see all its WAL holds (ReplicaSet
        `close`)."""
        self._handing.discard(topic.full)
        rs = self._sets.pop(topic.full, None)
        if rs is not None:
            rs.close(release)

    async def _replicate(self, topic: ReliableTopic, guard: TopicGuard, policy: Policy) -> None:
        rs = ReplicaSet(topic, self.me, guard.ownership.revision, guard.write, policy.copies,
                        policy.insync_needed, self._config.replica_lag_ms / 1000)
        self._sets[topic.full] = rs
        try:
            await rs.start(self._first_followers(topic, policy.copies - 1))
        except BaseException:
            self._sets.pop(topic.full, None)
            rs.close()
            raise
        log.info("%s: replicated, %d copies (%d in sync needed), followers %s", topic.full, policy.copies,
                 policy.insync_needed, sorted(rs.followers))

    def _first_followers(self, topic: ReliableTopic, wanted: int) -> list[int]:
        """The followers the copies' key names now (an earlier term's), live and not this broker, topped up
        with the least busy other brokers."""
        kept: list[int] = []
        kv = self._view.cache.get(keys.replicas(topic.name.namespace, topic.name.topic))
        if kv is not None:
            with contextlib.suppress(BadValue):
                earlier = TopicReplicas.from_json(kv.value, key=kv.key)
                live = self._live()
                kept = [b for b in (earlier.owner, *earlier.followers) if b != self.me and b in live]
        kept = kept[:wanted]
        return kept + self._pick(wanted - len(kept), {self.me, *kept})

    # -- the pass --------------------------------------------------------------------------------------

    def _live(self) -> set[int]:
        """Registered brokers that take new work (not draining)."""
        return {b.broker_id for b in self._view.brokers()
                if b.state is None or b.state.mode == BrokerMode.ACTIVE}

    def _pick(self, n: int, taken: set[int]) -> list[int]:
        """`n` live brokers not in `taken`, those following the fewest topics first."""
        if n <= 0:
            return []
        load: Counter[int] = Counter()
        for kv in self._view.cache.get_prefix(keys.replicas_prefix()):
            with contextlib.suppress(BadValue, InvalidKey):
                load.update(TopicReplicas.from_json(kv.value, key=kv.key).followers)
        candidates = sorted(self._live() - taken, key=lambda b: (load[b], random.random()))
        return candidates[:n]

    async def _run(self) -> None:
        tick = min(MAX_TICK, max(MIN_TICK, self._config.replica_lag_ms / 8000))
        while True:
            await asyncio.sleep(tick)
            try:
                await self._pass()
            except MetadataError as e:
                log.warning("replication pass: %s", e)
            except Exception:
                log.exception("replication pass failed")

    async def _pass(self) -> None:
        if time.monotonic() - self._policies_read >= self._config.replica_check_ms / 1000:
            self._policies_read = time.monotonic()
            await self._read_policies()
        if not self._sets:
            return
        live = {b.broker_id for b in self._view.brokers()}
        for full, rs in list(self._sets.items()):
            if full in self._handing:
                continue
            if self._topics.find(full) is not rs.topic:
                self._sets.pop(full, None)
                rs.close()
                continue
            try:
                await rs.maintain(live, self._pick)
            except Exception as e:  # one topic's fence or store trouble: the others go on
                log.warning("%s: keeping its copies: %s", full, e)

    async def _read_policies(self) -> None:
        for topic in self._topics.stored():
            guard = topic.fence
            if not isinstance(guard, TopicGuard):  # not loaded by the reconciler: nothing to replicate
                continue
            policy = await self._namespaces.read_topic_policy(topic.name)
            if topic.gone is not None or self._topics.find(topic.full) is not topic:
                continue  # unloaded or deleted during the read: no copies for a topic not served
            rs = self._sets.get(topic.full)
            if rs is None:
                if policy.copies > 1:
                    await self._replicate(topic, guard, policy)
            elif policy.copies <= 1:
                self._sets.pop(topic.full, None)
                await rs.forget()
                log.info("%s: no longer replicated", topic.full)
            else:
                rs.copies, rs.needed = policy.copies, policy.insync_needed

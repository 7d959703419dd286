"""Retention, applied by each topic's owner (docs/RETENTION.md): every `retention_check_ms` one pass over the
Reliable topics this broker serves, each with the policy the metadata gives it now, so a policy change applies
at the next pass without a restart.

Per topic: the policy is the topic's own (`/topics/{ns}/{topic}/policy`, read for all topics of the pass in a
few transactions: the LocalCache does not mirror /topics/) or its namespace's (from the cache). The objects
the limits let go are removed, descriptors first (storage/objects/expiry.py), through the topic's fence, so a
broker that lost the topic deletes nothing; then the reader's descriptors and the local WAL segments below the
new floor go, and a dead owner's gap below it is no longer waited for. The first pass after a topic is loaded
here, and the pass after one that failed, first finish what an interrupted pass left (`expiry.finish`).

The same pass applies message expiry first (broker/message_ttl.py): it moves subscriptions, deletes nothing.

Owner: the broker's event loop; one Retention per broker, whose task runs one pass at a time. `state` (what
the last pass saw of each topic: metrics) is written only by the pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from danube_fast.broker.message_ttl import MessageTtl
from danube_fast.broker.namespaces import Namespaces
from danube_fast.broker.topic import ReliableTopic, Topic
from danube_fast.broker.topic_registry import TopicRegistry
from danube_fast.errors import DanubeError, WalWriteError
from danube_fast.meta import keys
from danube_fast.meta.resources import Policy
from danube_fast.meta.resources_storage import ObjectDescriptor
from danube_fast.meta.store import Get, KeyValue, MetadataStore
from danube_fast.storage.objects import expiry
from danube_fast.storage.objects.store import ObjectStore
from danube_fast.storage.tiered import is_empty

log = logging.getLogger("danube_fast.retention")

POLICY_READS = 64  # topic policy keys read per transaction


@dataclass
class TopicRetention:
    """What the last pass saw of one topic (metrics), whether the next must finish an interrupted one, and the
    publish times of its objects read so far."""

    times: expiry.ObjectTimes
    retained_bytes: int = 0
    retained_records: int = 0
    oldest_ms: int | None = None  # the oldest retained record's publish time
    deleted_objects: int = 0  # since the topic was loaded here
    unfinished: bool = True  # the topic's retention state may list objects still to delete

    async def saw(self, descriptors: Sequence[ObjectDescriptor]) -> None:
        kept = [d for d in descriptors if not is_empty(d)]
        self.retained_bytes = sum(d.size for d in kept)
        self.retained_records = sum(d.end_offset - d.start_offset + 1 for d in kept)
        self.times.keep_only(kept)
        oldest = await self.times.of(kept[0]) if kept else None
        self.oldest_ms = oldest[0] if oldest is not None else None


async def own_policies(store: MetadataStore, topics: Sequence[Topic]) -> dict[str, KeyValue]:
    """The topics' own policy keys, where they have one (the LocalCache does not mirror /topics/), read a
    few transactions at a time."""
    found: dict[str, KeyValue] = {}
    for i in range(0, len(topics), POLICY_READS):
        chunk = topics[i:i + POLICY_READS]
        result = await store.transaction(
            [], [Get(keys.topic_policy(t.name.namespace, t.name.topic)) for t in chunk], [])
        for topic, response in zip(chunk, result.responses, strict=True):
            if isinstance(response, list) and response:
                found[topic.full] = response[0]
    return found


class Retention:
    def __init__(self, topics: TopicRegistry, namespaces: Namespaces, objects: ObjectStore,
                 store: MetadataStore, interval: float, clock: Callable[[], float] = time.time,
                 ttl: MessageTtl | None = None) -> None:
        """`ttl`: message expiry, applied by the same pass before retention (None: not applied)."""
        self._topics = topics
        self._ttl = ttl
        self._namespaces = namespaces
        self._objects = objects
        self._store = store
        self._interval = interval
        self._clock = clock
        self.state: dict[str, TopicRetention] = {}
        self.passes = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="retention")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.run_pass()
            except DanubeError as e:  # the metadata store away: the next pass tries again
                log.warning("retention pass failed: %s", e)
            except Exception:  # a bug must not end retention for the broker's life
                log.exception("retention pass failed")

    async def run_pass(self) -> int:
        """One pass over the served topics (message expiry first, then retention); the objects deleted."""
        stored = self._topics.stored()
        served = [t for t in stored if t.uploader is not None and t.log.cloud is not None]
        self.state = {t.full: self.state.get(t.full) or TopicRetention(
            expiry.ObjectTimes(self._objects, t.name.namespace, t.name.topic)) for t in served}
        own = await own_policies(self._store, stored)
        now_ms = int(self._clock() * 1000)
        deleted = 0
        for topic in stored:
            try:  # a namespace policy that is not valid stops retention for its topics only
                policy = self._namespaces.topic_policy(topic.name, own.get(topic.full))
                if self._ttl is not None:
                    await self._ttl.apply(topic, policy.message_ttl_seconds, now_ms)
                if topic.full in self.state:
                    deleted += await self._apply(topic, policy, now_ms)
            except (expiry.RetentionFenced, DanubeError) as e:
                if topic.full in self.state:
                    self.state[topic.full].unfinished = True
                log.warning("%s: retention stopped for this pass: %s", topic.full, e)
        self.passes += 1
        return deleted

    async def _apply(self, topic: ReliableTopic, policy: Policy, now_ms: int) -> int:
        state = self.state[topic.full]
        cloud = topic.log.cloud
        assert cloud is not None  # run_pass takes the topics with objects only
        ns, name = topic.name.namespace, topic.name.topic
        deleted = 0
        if state.unfinished:
            await cloud.refresh()  # all the metadata holds: a dead owner's recovered objects too
            deleted += await expiry.finish(self._objects, self._store, topic.fence.write, ns, name)
            state.unfinished = False
        limits = expiry.Limits.of(policy.retention_time_minutes, policy.retention_size_mb)
        doomed = await expiry.expired(cloud.descriptors, limits, now_ms, state.times) if limits else []
        if doomed:
            state.unfinished = True  # until every step below is done
            deleted += await expiry.remove(self._objects, topic.fence.write, ns, name, doomed)
            floor = doomed[-1].end_offset + 1
            cloud.forget(floor - 1)
            topic.log.drop_below(floor)
            try:
                await topic.wal.delete_before(floor)  # uploaded segments kept locally (retain_bytes)
            except WalWriteError as e:
                log.warning("%s: retention could not delete WAL segments below %d: %s", topic.full, floor, e)
            state.unfinished = False
            log.info("%s: retention deleted offsets %d..%d (%d objects)", topic.full, doomed[0].start_offset,
                     floor - 1, len(doomed))
        state.deleted_objects += deleted
        await state.saw(cloud.descriptors)
        return deleted

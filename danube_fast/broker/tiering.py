"""The object tier as the broker uses it (DESIGN.md section 8): one ObjectStore (S3 or a folder) for the
process, and per Reliable topic a TopicLog (what the dispatchers read: objects -> WAL -> live tail) and an
Uploader (sealed segments and, every `upload_interval_ms`, the committed tail become objects; uploaded
segments are deleted locally).

Orphan recovery: a WAL directory whose topic this broker no longer owns (it crashed, or lost its lease, and
the topic went elsewhere) still holds records it may have acknowledged. They lie in this broker's offset
reservation (cluster/handoff.py), which no later owner reuses, so `recover` uploads the records the object
tier lacks, declares the rest of the reservation empty (a zero-size descriptor), and deletes the directory.
Its descriptor writes only create keys: they never overwrite what another owner wrote.

Gaps: until the dead owner has recovered its range, a reader that reaches it waits (RecoveryPending, which
the dispatchers retry) rather than skipping records it would never see again; after `gap_wait_ms` the range
is read past like any hole, with a warning.

Owner: the broker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import replace

from danube_fast.broker.cluster import handoff
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.names import TopicName
from danube_fast.broker.topic import Topic
from danube_fast.errors import DanubeError, StorageError
from danube_fast.meta import keys
from danube_fast.meta.resources import ObjectDescriptor, SealedState
from danube_fast.meta.store import Compare, MetadataStore, Op, Put, TxnResult
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.storage.objects.connect import open_object_store
from danube_fast.storage.objects.store import ObjectStore, topic_objects_prefix
from danube_fast.storage.tiered import READ_BYTES, CloudReader, TopicLog
from danube_fast.storage.uploader import Uploader, UploaderConfig, WriteMeta
from danube_fast.storage.wal import Buffer, Wal

log = logging.getLogger("danube_fast.tier")


class RecoveryPending(StorageError):
    """The offsets asked for are in a dead owner's WAL, not yet recovered into the object tier."""

    retriable = True
    grpc_code = "UNAVAILABLE"


class GapAwareLog(TopicLog):
    """A TopicLog that waits at an open gap (see the module docstring) instead of skipping it."""

    def __init__(self, wal: Wal, cloud: CloudReader, wait: float) -> None:
        super().__init__(wal, cloud)
        self.gaps: list[handoff.Gap] = []
        self._wait = wait
        self._since = time.monotonic()

    def set_gaps(self, gaps: Sequence[handoff.Gap]) -> None:
        self.gaps = list(gaps)
        self._since = time.monotonic()

    @property
    def start_offset(self) -> int:
        """A subscription resuming before a gap starts there, not past it."""
        return min([super().start_offset, *(g[0] for g in self.gaps)])

    async def read(self, offset: int, max_bytes: int = READ_BYTES) -> tuple[Buffer, int] | None:
        gap = next((g for g in self.gaps if g[0] <= offset <= g[1]), None)
        if gap is not None and offset < self.wal.start_offset and self.cloud is not None:
            await self.cloud.refresh()
            still = handoff.open_gaps([(offset, gap[1], gap[2])], self.cloud.descriptors)
            if still and still[0][0] == offset:
                if time.monotonic() - self._since < self._wait:
                    raise RecoveryPending(f"offsets {offset}..{gap[1]} of {self.cloud.namespace}/"
                                          f"{self.cloud.topic} wait for broker {gap[2]} to recover them")
                log.warning("%s/%s: broker %d did not recover offsets %d..%d in time; reading past them",
                            self.cloud.namespace, self.cloud.topic, gap[2], offset, gap[1])
                self.gaps.remove(gap)
        return await super().read(offset, max_bytes)

DRAIN_TIMEOUT = 30.0  # seconds a sealing unload waits for the object store


class Tier:
    def __init__(self, config: BrokerConfig, store: MetadataStore, objects: ObjectStore,
                 broker_id: int) -> None:
        self._config = config
        self.broker_id = broker_id
        self._store = store
        self.objects = objects
        self._uploader_config = UploaderConfig(interval=config.cluster.upload_interval_ms / 1000,
                                               poll=min(1.0, config.cluster.upload_interval_ms / 1000),
                                               retain_bytes=config.wal.retain_bytes)

    @classmethod
    async def open(cls, config: BrokerConfig, store: MetadataStore, broker_id: int) -> Tier:
        c = config.cluster
        options: dict[str, str | float] = {}
        if config.object_store.startswith("s3://"):
            given = (("endpoint_url", c.s3_endpoint), ("region", c.s3_region),
                     ("access_key", c.s3_access_key), ("secret_key", c.s3_secret_key))
            options = {k: v for k, v in given if v}
            # Short timeouts: the uploader and the readers retry with their own backoff, and a connection
            # left half-open by an S3 endpoint that went away must not hold a reader for botocore's 60 s.
            options.update(connect_timeout=3.0, read_timeout=10.0)
        return cls(config, store, await open_object_store(config.object_store, **options), broker_id)

    async def close(self) -> None:
        await self.objects.close()

    async def log_for(self, name: TopicName, wal: Wal, gaps: Sequence[handoff.Gap] = ()) -> GapAwareLog:
        cloud = CloudReader(self.objects, self._store, name.namespace, name.topic)
        await cloud.refresh()
        log = GapAwareLog(wal, cloud, self._config.cluster.gap_wait_ms / 1000)
        log.set_gaps(gaps)
        return log

    async def attach(self, topic: Topic, checkpoint: int | None, write_meta: WriteMeta | None = None) -> None:
        """Start the topic's uploader; `checkpoint` is the last offset already in the object tier (None: from
        the descriptors)."""
        assert topic.wal is not None
        if write_meta is None and topic.guard is not None:
            write_meta = topic.guard.write
        cloud = topic.log.cloud if isinstance(topic.log, TopicLog) else None
        uploader = Uploader(topic.wal, self.objects, self._store, topic.name.namespace, topic.name.topic,
                            checkpoint=checkpoint, write_meta=write_meta, config=self._uploader_config,
                            on_uploaded=cloud.add if cloud is not None else None)
        await uploader.start()
        topic.uploader = uploader

    async def drain(self, topic: Topic) -> None:
        """Everything committed into the object tier (the sealed unload)."""
        if topic.uploader is not None:
            await topic.uploader.drain(DRAIN_TIMEOUT)
            await self.detach(topic)

    async def detach(self, topic: Topic) -> None:
        uploader, topic.uploader = topic.uploader, None
        if uploader is not None:
            await uploader.close()

    async def forget(self, name: TopicName) -> None:
        """Delete the objects of a topic that was deleted (its descriptors went with it, in the same
        transaction as the topic). Objects a descriptor names are kept: they belong to a topic of the same
        name created since. Best effort: what cannot be deleted now (the store is down) is unreachable
        anyway, and is logged."""
        ns, t = name.namespace, name.topic
        try:
            found = await self.objects.list(topic_objects_prefix(ns, t))
            named = {d.object_id for d in await load_descriptors(self._store, ns, t)}
            for key in found:
                if key.rpartition("/")[2] not in named:
                    await self.objects.delete(key)
        except DanubeError as e:
            log.warning("%s was deleted, but some of its objects were left in the object store: %s",
                        name.full, e)

    # -- orphans -------------------------------------------------------------------------------------------

    async def recover(self, name: TopicName, directory: str) -> None:
        ns, t = name.namespace, name.topic
        me = self.broker_id
        wal = await Wal.open(directory, self._config.wal)
        try:
            state = await handoff.read_state(self._store, ns, t)
            found = await load_descriptors(self._store, ns, t)
            bound = self._bound(state, me)
            uncovered = handoff.open_gaps([(wal.start_offset, wal.committed_offset - 1, me)], found)
            first = uncovered[0][0] if uncovered else None
            if first is None:
                last = wal.committed_offset - 1  # every record is in the object tier already
            elif bound is None or first > bound:
                log.warning("%s: orphan WAL holds offsets from %d that no reservation of broker %d covers; "
                            "kept in %s for an operator", name, first, me, directory)
                return
            else:
                last = await self._upload_from(wal, ns, t, first)
            if bound is not None and last < bound:
                empty = ObjectDescriptor("", last + 1, bound, 0, True, int(time.time()))
                await self._create_only([Put(keys.object_descriptor(ns, t, last + 1), empty.to_json())])
            log.info("%s: orphan WAL recovered: records through %d in the object tier%s", name, last,
                     f", {last + 1}..{bound} declared empty" if bound is not None and last < bound else "")
        finally:
            await wal.close()
        await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, directory)

    @staticmethod
    def _bound(state: SealedState | None, me: int) -> int | None:
        """The last offset this broker could have committed: its own reservation, or the gap a later owner
        recorded for it."""
        if state is None:
            return None
        if not state.sealed and state.broker_id == me:
            return state.last_committed_offset
        for _, last, broker in handoff.state_gaps(state):
            if broker == me:
                return last
        return None

    async def _upload_from(self, wal: Wal, ns: str, t: str, first: int) -> int:
        if wal.committed_offset <= first:
            return first - 1
        uploader = Uploader(wal, self.objects, self._store, ns, t, checkpoint=first - 1,
                            write_meta=self._create_only,
                            config=replace(self._uploader_config, delete_local=False))
        await uploader.start()
        try:
            return await uploader.drain(DRAIN_TIMEOUT)
        finally:
            await uploader.close()

    async def _create_only(self, ops: Sequence[Op]) -> TxnResult:
        """Descriptor puts that only create keys; objects/cur stays the current owner's."""
        puts = [op for op in ops if isinstance(op, Put) and not op.key.endswith("/objects/cur")]
        return await self._store.transaction([Compare(p.key, "version", "==", 0) for p in puts], puts, [])


"""The object tier as the broker uses it (docs/ARCHITECTURE.md#object-tier): one ObjectStore (S3 or a folder)
for the process, and per Reliable topic a TopicLog (what the dispatchers read: objects -> WAL -> live tail,
waiting at gaps: storage/gaps.py) and an Uploader (sealed segments and, every `upload_interval_ms`, the
committed tail become objects; uploaded segments are deleted locally). Cluster mode's orphan recovery builds
on it (cluster/orphans.py).

Owner: the broker's event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.topic import ReliableTopic
from danube_fast.errors import DanubeError
from danube_fast.meta.store import MetadataStore
from danube_fast.names import TopicName
from danube_fast.storage.gaps import Gap, GapAwareLog
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.storage.objects.connect import open_object_store
from danube_fast.storage.objects.store import ObjectStore, topic_objects_prefix
from danube_fast.storage.tiered import CloudReader, TopicLog
from danube_fast.storage.uploader import Uploader, UploaderConfig
from danube_fast.storage.wal import Wal

log = logging.getLogger("danube_fast.tier")


DRAIN_TIMEOUT = 30.0  # seconds a sealing unload waits for the object store


class Tier:
    def __init__(self, config: BrokerConfig, store: MetadataStore, objects: ObjectStore,
                 broker_id: int) -> None:
        self._config = config
        self.broker_id = broker_id
        self._store = store
        self.objects = objects
        self.uploader_config = UploaderConfig(interval=config.cluster.upload_interval_ms / 1000,
                                               poll=min(1.0, config.cluster.upload_interval_ms / 1000),
                                               retain_bytes=config.wal.retain_bytes)

    @classmethod
    async def open(cls, config: BrokerConfig, store: MetadataStore, broker_id: int) -> Tier:
        c = config.cluster
        options: dict[str, str | float | bool]
        if not config.object_store.startswith("s3://"):
            options = {"direct": config.wal.direct_io}  # a folder: O_DIRECT objects as the WAL appends
        else:
            given = (("endpoint_url", c.s3_endpoint), ("region", c.s3_region),
                     ("access_key", c.s3_access_key), ("secret_key", c.s3_secret_key))
            options = {k: v for k, v in given if v}
            # Short timeouts: the uploader and the readers retry with their own backoff, and a connection
            # left half-open by an S3 endpoint that went away must not hold a reader for botocore's 60 s.
            options.update(connect_timeout=3.0, read_timeout=10.0)
        return cls(config, store, await open_object_store(config.object_store, **options), broker_id)

    async def close(self) -> None:
        await self.objects.close()

    async def log_for(self, name: TopicName, wal: Wal, gaps: Sequence[Gap] = ()) -> GapAwareLog:
        cloud = CloudReader(self.objects, self._store, name.namespace, name.topic)
        await cloud.refresh()
        log = GapAwareLog(wal, cloud, self._config.cluster.gap_wait_ms / 1000)
        log.set_gaps(gaps)
        return log

    async def attach(self, topic: ReliableTopic, checkpoint: int | None) -> None:
        """Start the topic's uploader; `checkpoint` is the last offset already in the object tier (None: from
        the descriptors)."""
        cloud = topic.log.cloud
        uploader = Uploader(topic.wal, self.objects, self._store, topic.name.namespace, topic.name.topic,
                            checkpoint=checkpoint, write_meta=topic.fence.write, config=self.uploader_config,
                            on_uploaded=cloud.add if cloud is not None else None)
        # Attached before it starts: a delete or unload meanwhile finds it to close (a start then starts
        # nothing) instead of leaving it to upload from a closed WAL.
        topic.attach_uploader(uploader)
        try:
            await uploader.start()
        except BaseException:
            if topic.uploader is uploader:
                topic.detach_uploader()
            raise

    async def drain(self, topic: ReliableTopic) -> None:
        """Everything committed into the object tier (the sealed unload)."""
        if topic.uploader is not None:
            await topic.uploader.drain(DRAIN_TIMEOUT)
            await self.detach(topic)

    async def detach(self, topic: ReliableTopic) -> None:
        uploader = topic.detach_uploader()
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


class WalOnly:
    """No object tier (a broker assembled without one: tests and tools): Reliable topics are read from their
    WAL alone and nothing is uploaded. The same methods as Tier, so the registry never asks which it has."""

    async def log_for(self, name: TopicName, wal: Wal, gaps: Sequence[Gap] = ()) -> TopicLog:
        return TopicLog(wal)

    async def attach(self, topic: ReliableTopic, checkpoint: int | None) -> None:
        pass

    async def drain(self, topic: ReliableTopic) -> None:
        pass

    async def detach(self, topic: ReliableTopic) -> None:
        pass

    async def forget(self, name: TopicName) -> None:
        pass

    async def close(self) -> None:
        pass

"""The uploader: one Reliable topic's WAL, copied into the object tier as `.dnb1` objects
(docs/ARCHITECTURE.md#object-tier).

Owner: one Uploader per topic, on the event loop of the topic's owner. Its background task and `drain()` take
turns under one lock, so objects are built, stored and published one at a time, in offset order. The
checkpoint (the last offset already in the object tier) is the Uploader's alone.

Per object, in this order, each step only after the previous one succeeded:
1. a sealed segment that starts right after the checkpoint is an object already (docs/FORMAT.md, "Sealed
   segments"): its file is the object, whatever its size. Otherwise read committed batches past the
   checkpoint from the WAL (at most `max_object_bytes`, whole batches) and build the object;
2. store it at `{ns}/{topic}/data-{start}-{end}.dnb1` (durable when it returns): `put_file` of the segment
   (a folder on the WAL's file system links it, no byte copied) or `put_parts` of the built object;
3. write its descriptor and `objects/cur` in ONE transaction through `write_meta` (the broker passes a fenced
   writer conditioned on its topic assignment; docs/METADATA.md#storage-keys);
4. advance the checkpoint;
5. delete the local WAL segments that lie entirely at or below the checkpoint (never the active segment).
A failure at any step leaves the local copy in place and the step is retried with capped exponential
backoff; an object that was stored but not yet published is published without being stored again. A
`write_meta` refusal that is not a retriable DanubeError (OwnershipLost: the topic moved) stops the uploader
for good: the next owner uploads from the object tier's state, and nothing local is deleted.

Triggers: committed records past the checkpoint and either a sealed segment holding some (uploaded up to the
active segment's base), or `interval` seconds since the last upload (uploaded up to the committed offset).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from danube_fast import latency
from danube_fast.errors import DanubeError, ObjectStoreUnavailable, StorageError, WalClosed, WalWriteError
from danube_fast.meta.resources_storage import ObjectDescriptor
from danube_fast.meta.store import MetadataStore, Op, TxnResult
from danube_fast.storage._wal_common import LOG_SUFFIX, segment_name
from danube_fast.storage.objects.catalog import descriptor_ops, last_uploaded_offset, load_descriptors
from danube_fast.storage.objects.format import (
    DEFAULT_INDEX_INTERVAL,
    Buffer,
    Footer,
    build_object,
    clip_batches,
)
from danube_fast.storage.objects.store import ObjectStore, object_id, object_key
from danube_fast.storage.wal import Wal

log = logging.getLogger("danube_fast.uploader")

WriteMeta = Callable[[Sequence[Op]], Awaitable[TxnResult]]
READ_BYTES = 8 * 1024 * 1024  # one WAL read while building an object
MAX_DESCRIPTOR_INDEX = 1024  # index entries in a descriptor (the footer keeps them all): bounds its JSON


class UploadFenced(StorageError):
    """The descriptor write was refused (its transaction's compare failed): this broker may no longer
    publish objects for the topic."""

    grpc_code = "FAILED_PRECONDITION"


@dataclass(frozen=True)
class UploaderConfig:
    interval: float = 30.0  # seconds: upload the active segment's committed records at least this often
    max_object_bytes: int = 64 * 1024 * 1024
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL
    poll: float = 1.0  # seconds between checks for a sealed segment while records arrive (at most `interval`)
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    delete_local: bool = True  # delete WAL segments once they are in the object tier
    # ...but keep the newest uploaded segments up to this many bytes: catch-up reads of recent offsets stay
    # local reads (bench/RESULTS.md "Fast API": reading them back from objects cut catch-up consume to a
    # third). 0 = delete as soon as uploaded.
    retain_bytes: int = 0
    # Store a sealed segment that is a whole object as its file (see the module's docstring); False: every
    # object is built from WAL reads, at most max_object_bytes.
    whole_segments: bool = True


@dataclass
class UploaderStats:
    """Counters for metrics: what happened since the uploader started."""

    objects: int = 0
    bytes: int = 0
    failures: int = 0
    last_error: BaseException | None = None


@dataclass
class _Pending:
    """An object built and maybe stored, not yet published: retried without being rebuilt or re-put. Either
    `file`, a sealed segment that is the object, or `parts`, the object as built: the body's parts are the
    WAL reads themselves (immutable bytes, or views of them), nothing is joined on the way to the store."""

    start: int
    footer: Footer
    key: str
    file: str | None = None
    parts: tuple[Buffer, ...] = ()
    stored: bool = False
    etag: str | None = None


class Uploader:
    """Create, then `await start()`; `await close()` when the topic is unloaded (after `drain()` if the
    object tier must hold everything). `checkpoint=None` derives it from the descriptors (the largest
    end_offset, -1 without any); a new owner passes its sealed state's `last_committed_offset`."""

    def __init__(self, wal: Wal, store: ObjectStore, meta: MetadataStore, namespace: str, topic: str, *,
                 checkpoint: int | None = None, write_meta: WriteMeta | None = None,
                 config: UploaderConfig | None = None,
                 on_uploaded: Callable[[ObjectDescriptor], None] | None = None) -> None:
        self._wal = wal
        self._store = store
        self._meta = meta
        self.namespace = namespace
        self.topic = topic
        self._checkpoint = checkpoint
        self._write_meta = write_meta or (lambda ops: meta.transaction([], ops))
        self.config = config or UploaderConfig()
        self._on_uploaded = on_uploaded
        self.stats = UploaderStats()
        self._lock = asyncio.Lock()
        self._pending: _Pending | None = None
        self._stopped: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def checkpoint(self) -> int:
        """The last offset in the object tier (-1: none)."""
        if self._checkpoint is None:
            raise RuntimeError("the uploader is not started")
        return self._checkpoint

    @property
    def known_checkpoint(self) -> int | None:
        """`checkpoint`, or None until `start` has read it (a topic still loading)."""
        return self._checkpoint

    @property
    def stopped(self) -> BaseException | None:
        """Why the uploader stopped for good (a refused descriptor write), or None while it runs."""
        return self._stopped

    async def start(self) -> None:
        if self._checkpoint is None:
            self._checkpoint = last_uploaded_offset(await load_descriptors(self._meta, self.namespace,
                                                                           self.topic))
        if self._wal.committed_offset <= self._checkpoint:
            log.warning("%s/%s: the WAL ends at %d but the object tier holds offsets up to %d",
                        self.namespace, self.topic, self._wal.committed_offset - 1, self._checkpoint)
        if self._closed:  # closed while it read the descriptors: its WAL may be closing too
            return
        await self._delete_local()  # a crash after publishing an object may have kept its segments
        if not self._closed:
            self._task = asyncio.create_task(self._run(), name=f"uploader:{self.namespace}/{self.topic}")

    async def close(self) -> None:
        """Stop the background task (an upload in progress is abandoned; its local data stays); a start
        still under way then starts nothing."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def drain(self, timeout: float = 60.0, until: int | None = None) -> int:
        """Upload everything committed now (below `until`, when given); return the last uploaded offset.
        Retries a retriable failure with backoff until `timeout` seconds have passed, then raises it
        (ObjectStoreUnavailable when the store is down); raises a non-retriable one at once, and the stop
        reason if the uploader stopped."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        target = self._wal.committed_offset if until is None else min(until, self._wal.committed_offset)
        backoff = self.config.backoff_initial
        while True:
            if self._stopped is not None:
                raise self._stopped
            try:
                async with self._lock:
                    await self._upload_until(target)
                return self.checkpoint
            except DanubeError as e:
                if self._stopped is not None or not e.retriable or isinstance(e, WalClosed):
                    raise
                self._failed(e)
                if loop.time() + backoff > deadline:
                    if isinstance(e, ObjectStoreUnavailable):
                        raise ObjectStoreUnavailable(
                            f"draining {self.namespace}/{self.topic}: the object store is still unavailable "
                            f"after {timeout} s: {e}") from e
                    raise
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.config.backoff_max)

    # -- the background task ---------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        last_upload = loop.time()
        backoff = cfg.backoff_initial
        while True:
            limit = self._due(loop.time() - last_upload >= cfg.interval)
            if limit is None:
                try:
                    await self._idle(last_upload + cfg.interval - loop.time())
                except WalClosed:
                    return
                continue
            before = self.checkpoint
            try:
                async with self._lock:
                    await self._upload_until(limit)
            except WalClosed:
                return
            except Exception as e:
                if self._stopped is not None:
                    log.error("%s/%s: uploader stopped, local data kept: %s", self.namespace, self.topic, e)
                    return
                self._failed(e)
                log.warning("%s/%s: upload failed (retry in %.1f s; the WAL keeps the data): %s",
                            self.namespace, self.topic, backoff, e, exc_info=not isinstance(e, DanubeError))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, cfg.backoff_max)
                continue
            backoff = cfg.backoff_initial
            last_upload = loop.time()
            if self.checkpoint == before:  # nothing was readable up to `limit` after all: do not spin
                await asyncio.sleep(min(cfg.poll, cfg.interval))

    async def _idle(self, until_due: float) -> None:
        """Nothing to upload yet: with nothing new since the checkpoint, sleep until a commit (an idle topic
        costs no wakeup, which matters at 10,000 topics: bench topics); with records waiting for the
        interval, until it ends or, sooner, for a segment roll, checked at most once per `poll`."""
        committed = self._wal.committed_offset
        if committed <= self._next_start():
            await self._wal.wait_committed(committed)
            return
        try:
            await asyncio.wait_for(self._wal.wait_committed(committed), max(0.0, until_due))
        except TimeoutError:
            return
        await asyncio.sleep(min(self.config.poll, max(0.0, until_due)))

    def _due(self, interval_passed: bool) -> int | None:
        """The offset to upload up to (exclusive), or None if no trigger fired."""
        committed, start = self._wal.committed_offset, self._next_start()
        if committed <= start:
            return None
        bases = self._wal.segment_bases  # empty once the WAL is closed
        if bases and bases[-1] > start:
            return min(bases[-1], committed)  # a replicated topic's readers may be held inside a segment
        return committed if interval_passed else None

    def _next_start(self) -> int:
        """The first offset to upload: the one after the checkpoint, or the WAL's first if that is later
        (offsets lost before they were uploaded are skipped, not waited for)."""
        return max(self.checkpoint + 1, self._wal.start_offset)

    def _failed(self, e: BaseException) -> None:
        self.stats.failures += 1
        self.stats.last_error = e

    # -- one object at a time --------------------------------------------------------------------------

    async def _upload_until(self, limit: int) -> None:
        """Upload objects until the checkpoint reaches limit - 1 (or nothing more is committed)."""
        while self._next_start() < limit:
            pending = self._pending
            if pending is None or pending.start != self.checkpoint + 1:
                pending = await self._build(limit)
                if pending is None:
                    return
                self._pending = pending
            if not pending.stored:
                started = time.perf_counter()
                if pending.file is not None:
                    pending.etag = await self._store.put_file(pending.key, pending.file)
                else:
                    pending.etag = await self._store.put_parts(pending.key, pending.parts)
                latency.UPLOAD_SECONDS.observe(time.perf_counter() - started)
                pending.stored = True
            descriptor = self._descriptor(pending)
            await self._publish(descriptor)
            self._pending = None
            self._checkpoint = descriptor.end_offset
            self.stats.objects += 1
            self.stats.bytes += descriptor.size
            if self._on_uploaded is not None:
                self._on_uploaded(descriptor)
            await self._delete_local()

    async def _build(self, limit: int) -> _Pending | None:
        start = self._next_start()
        if start > self.checkpoint + 1:
            log.warning("%s/%s: offsets %d..%d are neither in the object tier nor in the WAL", self.namespace,
                        self.topic, self.checkpoint + 1, start - 1)
        whole = self._wal.sealed_object(start) if self.config.whole_segments else None
        if whole is not None and whole[1].max_offset < limit:
            path, footer = whole
            name = object_id(footer.min_offset, footer.max_offset)
            key = object_key(self.namespace, self.topic, name)
            return _Pending(self.checkpoint + 1, footer, key, file=path)
        chunks: list[Buffer] = []
        size, position = 0, start
        room = self.config.max_object_bytes
        while position < limit and size < room:
            got = await self._wal.read(position, min(room - size, READ_BYTES))
            if got is None:
                break
            chunk, position = clip_batches(got[0], position, limit, room - size, whole=not chunks)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if not chunks:
            return None
        interval = self.config.index_interval_bytes
        # Framing and contiguous offsets are checked, CRCs not: the WAL verified every batch when it was
        # appended (and recovery verifies the segment a crash left open again), and a reader of an object
        # verifies the CRC of every batch it reads (scan_body; docs/FORMAT.md), so a corrupt batch is still
        # caught. Verifying 64 MB here took CPU from the hot path beside it (bench/RESULTS.md "Fast API";
        # bench/micro/test_micro.py test_build_object_*).
        built = await asyncio.get_running_loop().run_in_executor(  # one header per batch: many for small ones
            None, lambda: build_object(chunks, interval, verify=False))
        first = max(built.footer.min_offset, self.checkpoint + 1)
        name = object_id(first, built.footer.max_offset)
        return _Pending(self.checkpoint + 1, built.footer, object_key(self.namespace, self.topic, name),
                        parts=built.parts)

    def _descriptor(self, pending: _Pending) -> ObjectDescriptor:
        footer = pending.footer
        index = footer.index
        if len(index) > MAX_DESCRIPTOR_INDEX:
            index = index[:: -(-len(index) // MAX_DESCRIPTOR_INDEX)]
        first = max(footer.min_offset, pending.start)
        return ObjectDescriptor(object_id=pending.key.rpartition("/")[2], start_offset=first,
                                end_offset=footer.max_offset, size=footer.object_size, completed=True,
                                created_at=int(time.time()), etag=pending.etag, offset_index=index)

    async def _publish(self, descriptor: ObjectDescriptor) -> None:
        try:
            result = await self._write_meta(descriptor_ops(self.namespace, self.topic, descriptor))
        except Exception as e:
            if not (isinstance(e, DanubeError) and e.retriable):
                self._stopped = e
            raise
        if not result.succeeded:
            self._stopped = UploadFenced(f"{self.namespace}/{self.topic}: the descriptor of "
                                         f"{descriptor.object_id} was refused by its transaction's compare")
            raise self._stopped

    def _retained_from(self) -> int:
        """The base offset of the oldest segment local retention keeps: the newest segments, up to
        `retain_bytes` together (the active one always)."""
        bases = self._wal.segment_bases
        keep, total = bases[-1], 0
        for base in reversed(bases):
            try:
                total += os.path.getsize(os.path.join(self._wal.directory, segment_name(base, LOG_SUFFIX)))
            except OSError:
                continue  # deleted meanwhile
            if total > self.config.retain_bytes:
                break
            keep = base
        return keep

    async def _delete_local(self) -> None:
        if not self.config.delete_local or self.checkpoint < self._wal.start_offset:
            return
        limit = self.checkpoint + 1
        if self.config.retain_bytes:
            limit = min(limit, self._retained_from())
        try:
            await self._wal.delete_before(limit)
        except WalWriteError as e:  # retention is retried after the next object
            log.warning("%s/%s: deleting uploaded WAL segments failed: %s", self.namespace, self.topic, e)


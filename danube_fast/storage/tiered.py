"""Tiered reads: one topic's records as one ordered stream, object tier -> WAL -> live tail
(docs/TOPIC_MOVE.md).

`CloudReader` reads whole batches by offset from the `.dnb1` objects, found through the topic's object
descriptors; `TopicLog` wraps the topic's `Wal` and an optional CloudReader and answers reads with the same
contract as `Wal.read`, so the broker's dispatchers use it in place of the Wal (see `ReadableLog`).

Owner: both belong to the event loop of the topic's owner; a TopicLog may be shared by all the topic's
dispatchers. The CloudReader caches the descriptors (refreshed when asked for an offset past the last one it
knows, or when an object has vanished) and the last few byte ranges it fetched (so several subscriptions
catching up through the same object fetch it once).

Where a read goes: an offset at or above the WAL's start is the WAL's (it also answers None at the committed
tail); below it, the object tier's. A cloud read returns batches of one object only, ending at most at that
object's end, so the next read continues in the next object or in the WAL. A **hole** - an offset that no
descriptor covers and that lies below the WAL's start (its records were deleted by retention or lost before
they were uploaded) - is skipped: the read answers from the next offset that some tier holds (the next
descriptor's start or the WAL's start, whichever is lower), as the dispatchers already do for a WAL's
OffsetOutOfRange. A cloud read that fails raises the retriable ObjectStoreUnavailable.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from danube_fast.codec import frames
from danube_fast.errors import ObjectCorrupt, ObjectNotFound, OffsetOutOfRange
from danube_fast.meta.resources_storage import ObjectDescriptor
from danube_fast.meta.store import MetadataStore
from danube_fast.storage.file_span import FileSpan
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.storage.objects.folder import FolderStore
from danube_fast.storage.objects.format import HEADER_SIZE, parse_footer, scan_body, select_batches
from danube_fast.storage.objects.store import ObjectStore, object_key
from danube_fast.storage.wal import Buffer, Wal

log = logging.getLogger("danube_fast.tiered")

READ_BYTES = 1024 * 1024
RANGE_CACHE_BYTES = 16 * 1024 * 1024


class ReadableLog(Protocol):
    """What a dispatcher reads a topic through: a `Wal`, or a `TopicLog` that adds the object tier."""

    @property
    def committed_offset(self) -> int: ...

    @property
    def start_offset(self) -> int: ...

    async def read(self, offset: int, max_bytes: int = READ_BYTES) -> tuple[Buffer, int] | None: ...

    async def read_span(self, offset: int, max_bytes: int = READ_BYTES
                        ) -> tuple[Buffer | FileSpan, int] | None:
        """`read`, with the WAL's batches possibly as a FileSpan (Wal.read_span)."""

    def cached(self, offset: int, max_bytes: int) -> tuple[memoryview, int] | None: ...

    def empty_between(self, low: int, high: int) -> int:
        """How many offsets of [low, high) hold no record (declared empty by the object tier)."""
        ...


@dataclass(frozen=True)
class _Range:
    """Whole, verified batches fetched from one object; headers' positions are relative to `body`."""

    object_id: str
    body: memoryview
    headers: list[frames.BatchHeader]

    def holds(self, object_id: str, offset: int) -> bool:
        first, last = self.headers[0], self.headers[-1]
        return object_id == self.object_id and first.base_offset <= offset <= last.last_offset


def is_empty(d: ObjectDescriptor) -> bool:
    """A zero-size descriptor with no object: offsets an owner reserved and never used, declared empty by
    the broker that recovered its orphan WAL (danube_fast.broker.tiering)."""
    return d.size == 0 and not d.object_id


class CloudReader:
    """Batches of one topic from the object tier. Create, then `await refresh()` (TopicLog.open does)."""

    def __init__(self, store: ObjectStore, meta: MetadataStore, namespace: str, topic: str, *,
                 cache_bytes: int = RANGE_CACHE_BYTES) -> None:
        self._store = store
        self._meta = meta
        self.namespace = namespace
        self.topic = topic
        self._descriptors: list[ObjectDescriptor] = []
        self._starts: list[int] = []
        self._ranges: OrderedDict[tuple[str, int], _Range] = OrderedDict()  # least recently used first
        self._range_bytes = 0
        self._cache_bytes = cache_bytes
        self._refresh_lock = asyncio.Lock()

    @property
    def descriptors(self) -> list[ObjectDescriptor]:
        return list(self._descriptors)

    @property
    def start_offset(self) -> int | None:
        """The first offset in the object tier as far as the cached descriptors know; None without any."""
        return self._starts[0] if self._starts else None

    def empty_between(self, low: int, high: int) -> int:
        """How many offsets of [low, high) the descriptors declare empty (a dead owner's unused reservation,
        docs/TOPIC_MOVE.md): what a count of offsets must leave out to count records."""
        i = max(bisect.bisect_right(self._starts, low) - 1, 0)
        empty = 0
        for d in self._descriptors[i:]:
            if d.start_offset >= high:
                break
            if is_empty(d):
                empty += max(0, min(d.end_offset + 1, high) - max(d.start_offset, low))
        return empty

    async def refresh(self) -> None:
        """Reload the descriptors from the metadata store."""
        async with self._refresh_lock:
            self._set(await load_descriptors(self._meta, self.namespace, self.topic))

    def add(self, descriptor: ObjectDescriptor) -> None:
        """Learn of a descriptor just published (the local uploader's `on_uploaded`), without a reload."""
        self._set([d for d in self._descriptors if d.start_offset != descriptor.start_offset] + [descriptor])

    def forget(self, through: int) -> None:
        """Drop the descriptors that end at or below `through` (retention deleted them)."""
        self._set([d for d in self._descriptors if d.end_offset > through])

    def _set(self, descriptors: list[ObjectDescriptor]) -> None:
        self._descriptors = sorted(descriptors, key=lambda d: d.start_offset)
        self._starts = [d.start_offset for d in self._descriptors]

    def _covering(self, offset: int) -> ObjectDescriptor | None:
        i = bisect.bisect_right(self._starts, offset) - 1
        if i >= 0 and offset <= self._descriptors[i].end_offset:
            return self._descriptors[i]
        return None

    def next_start(self, offset: int) -> int | None:
        """The start of the first known object above `offset` (past the empty range holding it, if one
        does), None if there is none."""
        d = self._covering(offset)
        if d is not None and is_empty(d):
            offset = d.end_offset
        i = bisect.bisect_right(self._starts, offset)
        return self._starts[i] if i < len(self._starts) else None

    async def read(self, offset: int, max_bytes: int = READ_BYTES, *, span: bool = False
                   ) -> tuple[memoryview | FileSpan, int] | None:
        """Whole batches of the object holding `offset`, from the batch holding it, about max_bytes (at least
        one batch), with the offset after the last record returned. None when no object holds `offset`.
        With `span`, large batches of the folder store's objects come as a FileSpan of the object's file
        (those from S3 cross the network: read). Raises ObjectStoreUnavailable (retriable), ObjectCorrupt,
        or ObjectNotFound when a descriptor names an object the store does not have."""
        descriptor = self._covering(offset)
        if descriptor is None and (not self._descriptors or offset > self._descriptors[-1].end_offset):
            await self.refresh()
            descriptor = self._covering(offset)
        if descriptor is None or is_empty(descriptor):
            return None  # an empty descriptor declares a range that holds no records: read on past it
        try:
            if span and isinstance(self._store, FolderStore) and not self._cached(descriptor, offset):
                spanned = await self._span(self._store, descriptor, offset, max_bytes)
                if spanned is not None:
                    return spanned
            return await self._read_object(descriptor, offset, max_bytes)
        except ObjectNotFound:
            await self.refresh()  # retention may have removed the object and its descriptor
            if self._covering(offset) == descriptor:
                raise
            return None

    def _cached(self, d: ObjectDescriptor, offset: int) -> bool:
        return any(r.holds(d.object_id, offset) for r in self._ranges.values())

    async def _span(self, store: FolderStore, d: ObjectDescriptor, offset: int, max_bytes: int
                    ) -> tuple[FileSpan, int] | None:
        """The batches from the indexed one at or before `offset`, named in the object's file. Their CRCs
        are not checked (no byte is read), as a WAL span's are not (docs/TRANSPORT.md, "Catch-up with
        sendfile")."""
        index = d.offset_index or ((d.start_offset, HEADER_SIZE),)
        position = index[max(bisect.bisect_right(index, offset, key=lambda e: e[0]) - 1, 0)][1]
        return await store.span(object_key(self.namespace, self.topic, d.object_id), position, offset,
                                max_bytes, d.end_offset + 1)

    async def _read_object(self, d: ObjectDescriptor, offset: int,
                           max_bytes: int) -> tuple[memoryview, int]:
        key = next((k for k, r in self._ranges.items() if r.holds(d.object_id, offset)), None)
        if key is None:
            rng = await self._fetch(d, offset, max_bytes)
        else:
            self._ranges.move_to_end(key)
            rng = self._ranges[key]
        got = select_batches(rng.body, rng.headers, offset, max_bytes)
        if got is None:
            raise ObjectCorrupt(f"object {d.object_id} does not hold offset {offset} where its index says")
        return got

    async def _fetch(self, d: ObjectDescriptor, offset: int, max_bytes: int) -> _Range:
        """One ranged GET: from the indexed batch at or before `offset` to the first index position at least
        max_bytes further, or to the object's end (then the footer in the tail says where the body ends)."""
        index = d.offset_index or ((d.start_offset, HEADER_SIZE),)
        i = max(bisect.bisect_right(index, offset, key=lambda e: e[0]) - 1, 0)
        low = index[i][1]
        high = next((pos for _, pos in index[i + 1 :] if pos >= low + max_bytes), d.size)
        data = await self._store.get(object_key(self.namespace, self.topic, d.object_id), low, high)
        if len(data) != high - low:
            raise ObjectCorrupt(f"object {d.object_id}: asked for bytes {low}..{high}, got {len(data)}")
        body_end = high
        if high == d.size:
            body_end = parse_footer(data).body_end
            if not low < body_end <= high:
                raise ObjectCorrupt(f"object {d.object_id}: footer puts the body's end at {body_end}")
        body = memoryview(data)[: body_end - low]
        # Off the event loop: verifying every batch's CRC took a tenth of the loop thread's time in a
        # catch-up read of 64 KiB records from the tier.
        headers = await asyncio.get_running_loop().run_in_executor(None, scan_body, body)
        if not headers or headers[0].base_offset != index[i][0]:
            raise ObjectCorrupt(f"object {d.object_id}: no batch of offset {index[i][0]} at byte {low}")
        rng = _Range(d.object_id, body, headers)
        self._remember((d.object_id, low), rng)
        return rng

    def _remember(self, key: tuple[str, int], rng: _Range) -> None:
        old = self._ranges.pop(key, None)
        if old is not None:
            self._range_bytes -= len(old.body)
        self._ranges[key] = rng
        self._range_bytes += len(rng.body)
        while self._range_bytes > self._cache_bytes and len(self._ranges) > 1:
            _, dropped = self._ranges.popitem(last=False)
            self._range_bytes -= len(dropped.body)


class TopicLog:
    """A topic's WAL with the object tier below it; a drop-in for `Wal` where dispatchers read (ReadableLog).
    Without a CloudReader it is exactly the WAL. Create with `await TopicLog.open(wal, cloud)`."""

    def __init__(self, wal: Wal, cloud: CloudReader | None = None) -> None:
        self.wal = wal
        self.cloud = cloud
        # Offset ranges (first, last, broker) a dead broker has still to recover; only a GapAwareLog
        # (storage/gaps.py) has any.
        self.gaps: list[tuple[int, int, int]] = []
        self.behind_retention = 0  # offsets readers skipped because retention had deleted them
        self._told_floor = -1  # the first retained offset the last "behind retention" warning named

    @classmethod
    async def open(cls, wal: Wal, cloud: CloudReader | None = None) -> TopicLog:
        if cloud is not None:
            await cloud.refresh()
        return cls(wal, cloud)

    @property
    def committed_offset(self) -> int:
        return self.wal.committed_offset

    @property
    def start_offset(self) -> int:
        """The earliest offset readable anywhere: the first object's start if any, else the WAL's."""
        first = self.cloud.start_offset if self.cloud is not None else None
        return self.wal.start_offset if first is None else min(first, self.wal.start_offset)

    def cached(self, offset: int, max_bytes: int) -> tuple[memoryview, int] | None:
        return self.wal.cached(offset, max_bytes)

    def empty_between(self, low: int, high: int) -> int:
        return self.cloud.empty_between(low, high) if self.cloud is not None else 0

    def drop_below(self, floor: int) -> None:
        """Retention deleted every offset below `floor` (a GapAwareLog forgets its gaps there)."""

    async def wait_committed(self, offset: int) -> None:
        await self.wal.wait_committed(offset)

    async def read(self, offset: int, max_bytes: int = READ_BYTES) -> tuple[Buffer, int] | None:
        """`Wal.read`'s contract over both tiers: whole batches from the one holding `offset` (it may start
        before `offset`), about max_bytes, all committed, with the offset after the last record returned;
        None when `offset` is not committed yet. A hole is skipped (module docstring): the batches returned
        then start after `offset`. Without a CloudReader, raises OffsetOutOfRange below the WAL's start."""
        return cast("tuple[Buffer, int] | None", await self._read(offset, max_bytes, False))

    async def read_span(self, offset: int, max_bytes: int = READ_BYTES
                        ) -> tuple[Buffer | FileSpan, int] | None:
        """`read`, with large batches possibly as a FileSpan of a WAL segment (Wal.read_span) or of a folder
        store's object (CloudReader.read)."""
        return await self._read(offset, max_bytes, True)

    async def _read(self, offset: int, max_bytes: int, span: bool) -> tuple[Buffer | FileSpan, int] | None:
        cloud = self.cloud
        wal_read = self.wal.read_span if span else self.wal.read
        if cloud is None:
            return await wal_read(offset, max_bytes)
        while True:
            if offset >= self.wal.start_offset:
                try:
                    return await wal_read(offset, max_bytes)
                except OffsetOutOfRange:
                    pass  # the uploader deleted that segment meanwhile: it is in the object tier now
            got = await cloud.read(offset, max_bytes, span=span)
            if got is not None:
                return got
            wal_start = self.wal.start_offset
            if offset >= wal_start:
                continue
            following = cloud.next_start(offset)
            target = wal_start if following is None else min(following, wal_start)
            covering = cloud._covering(offset)
            if target == self.start_offset:  # below everything kept: retention deleted it
                self.behind_retention += target - offset
                if target != self._told_floor:  # once per floor, not once per reader and read
                    self._told_floor = target
                    log.warning("%s/%s: a reader at offset %d is behind retention: it goes on from the first "
                                "offset kept, %d", cloud.namespace, cloud.topic, offset, target)
            elif covering is None or not is_empty(covering):
                log.warning("%s/%s: offsets %d..%d are in no tier (deleted or lost): reading on from %d",
                            cloud.namespace, cloud.topic, offset, target - 1, target)
            offset = target


def records_between(log: ReadableLog, low: int, high: int) -> int:
    """About how many records [low, high) of `log` holds: its offsets, less those its object tier declares
    empty. Offsets are not dense: a topic taken over after a crash goes on a reservation (10 million offsets)
    higher, and a lag counted in offsets then reads 10 million for a subscription a few records behind."""
    count = max(0, high - low)
    return count - log.empty_between(low, high) if count else 0


if TYPE_CHECKING:
    def _drop_ins(wal: Wal, topic_log: TopicLog) -> list[ReadableLog]:
        return [wal, topic_log]  # mypy checks both against ReadableLog


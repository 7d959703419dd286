"""Tiered reads: object -> object -> WAL as one ordered stream, ranged GETs through the index, holes, a
topic move (docs/TOPIC_MOVE.md), and a store outage surfacing as a retriable error."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from danube_fast.codec import frames
from danube_fast.errors import ObjectStoreUnavailable, OffsetOutOfRange
from danube_fast.meta import keys
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.resources_storage import ObjectDescriptor
from danube_fast.storage import Wal
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.storage.objects.format import Buffer
from danube_fast.storage.objects.store import ObjectStore, object_key
from danube_fast.storage.tiered import CloudReader, TopicLog, records_between
from danube_fast.storage.uploader import Uploader, UploaderConfig
from tests.tier.conftest import Backend
from tests.tier.helpers import check_sequence, close_all, fill, open_topic, read_all, wal_config

pytestmark = pytest.mark.timeout(60)
Run = Callable[..., Any]
NS, TOPIC = "default", "tiered"
CONFIG = UploaderConfig(interval=3600, poll=0.01, max_object_bytes=1500, index_interval_bytes=300,
                        whole_segments=False)  # objects of a few batches, not whole segments


@dataclass
class CountingStore:
    """A real store, recording the ranges read from it (to check the index is used)."""

    inner: ObjectStore
    gets: list[tuple[str, int | None, int | None]] = field(default_factory=list)

    async def put(self, key: str, data: bytes) -> str | None:
        return await self.inner.put(key, data)

    async def put_parts(self, key: str, parts: Sequence[Buffer]) -> str | None:
        return await self.inner.put_parts(key, parts)

    async def put_file(self, key: str, path: str) -> str | None:
        return await self.inner.put_file(key, path)

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        self.gets.append((key, start, end))
        return await self.inner.get(key, start, end)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def list(self, prefix: str = "") -> list[str]:
        return await self.inner.list(prefix)

    async def close(self) -> None:
        await self.inner.close()


async def uploaded_topic(backend: Backend, tmp_path: Path, batches: int,
                         tail_batches: int) -> tuple[CountingStore, EmbeddedStore, Wal]:
    """A topic whose first `batches` batches (4 records each) are in objects of at most 1500 bytes, local
    segments deleted, and `tail_batches` more only in the WAL."""
    store, meta, wal = await open_topic(CountingStore(await backend.open()), tmp_path)
    await fill(wal, 0, batches)
    up = Uploader(wal, store, meta, NS, TOPIC, config=CONFIG)
    await up.start()
    assert await up.drain() == 4 * batches - 1
    await up.close()
    await fill(wal, 4 * batches, tail_batches)
    return store, meta, wal


def test_reads_cross_objects_into_the_wal_once_each_in_order(backend: Backend, tmp_path: Path,
                                                             run: Run) -> None:
    async def main() -> None:
        store, meta, wal = await uploaded_topic(backend, tmp_path, batches=40, tail_batches=10)
        log = await TopicLog.open(wal, CloudReader(store, meta, NS, TOPIC))
        descriptors = await load_descriptors(meta, NS, TOPIC)
        assert len(descriptors) >= 4 and wal.start_offset > descriptors[1].end_offset
        assert log.start_offset == 0 and log.committed_offset == 200
        middle = descriptors[1].start_offset + 6  # mid-object, mid-batch
        for max_bytes in (1, 500, 1 << 20):
            check_sequence(await read_all(log, middle, max_bytes), range(middle, 200))
        check_sequence(await read_all(log, 0), range(200))
        assert await log.read(200) is None  # the committed tail: None, as Wal.read says
        await close_all(store, meta, wal)

    run(main())


def test_a_cloud_read_is_a_ranged_get_from_the_indexed_batch(backend: Backend, tmp_path: Path,
                                                             run: Run) -> None:
    async def main() -> None:
        store, meta, wal = await uploaded_topic(backend, tmp_path, batches=20, tail_batches=0)
        reader = CloudReader(store, meta, NS, TOPIC, cache_bytes=0)
        await reader.refresh()
        d = reader.descriptors[0]
        assert len(d.offset_index) >= 3
        offset, position = d.offset_index[2]
        store.gets.clear()
        got = await reader.read(offset + 2, max_bytes=1)
        assert got is not None
        data, nxt = got
        assert frames.span(data) == (offset, offset + 4) and nxt == offset + 4  # the batch holding it
        key = object_key(NS, TOPIC, d.object_id)
        [(got_key, start, end)] = store.gets
        assert (got_key, start) == (key, position) and end == d.offset_index[3][1]  # one index interval
        # Read to the object's end: the range reaches its tail and the footer there says where batches end.
        store.gets.clear()
        data, nxt = await reader.read(d.offset_index[-1][0], max_bytes=1 << 20) or (b"", 0)
        assert nxt == d.end_offset + 1 and store.gets == [(key, d.offset_index[-1][1], d.size)]
        assert frames.span(data)[1] == d.end_offset + 1
        assert await reader.read(d.end_offset + 10**6) is None
        await close_all(store, meta, wal)

    run(main())


def test_holes_are_skipped_to_the_next_available_offset(backend: Backend, tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        store, meta, wal = await uploaded_topic(backend, tmp_path, batches=40, tail_batches=5)
        log = await TopicLog.open(wal, CloudReader(store, meta, NS, TOPIC))
        first, second, third = (await load_descriptors(meta, NS, TOPIC))[:3]
        # Retention removed the first two objects and their descriptors after the reader cached them.
        for d in (first, second):
            await store.delete(object_key(NS, TOPIC, d.object_id))
            await meta.delete(keys.object_descriptor(NS, TOPIC, d.start_offset))
        records = await read_all(log, first.start_offset + 3)
        check_sequence(records, range(third.start_offset, 180))
        assert log.start_offset == third.start_offset
        # A gap between the objects and the WAL: the descriptors from the one holding the offset before the
        # WAL's first are gone, so the read goes on at the WAL's first offset.
        later = [d for d in await load_descriptors(meta, NS, TOPIC) if d.end_offset >= wal.start_offset - 1]
        assert later[0].start_offset + 1 < wal.start_offset
        for d in later:
            await meta.delete(keys.object_descriptor(NS, TOPIC, d.start_offset))
        assert log.cloud is not None
        await log.cloud.refresh()
        check_sequence(await read_all(log, later[0].start_offset + 1), range(wal.start_offset, 180))
        check_sequence(await read_all(log, 0), [*range(third.start_offset, later[0].start_offset),
                                                *range(wal.start_offset, 180)])
        await close_all(store, meta, wal)

    run(main())


async def first_owner(backend: Backend, tmp_path: Path) -> tuple[ObjectStore, EmbeddedStore]:
    """Broker A wrote 0..21 (11 batches of 2), uploaded all of it, and went."""
    store = await backend.open()
    meta = await EmbeddedStore.open(tmp_path / "meta.db")
    old = await Wal.open(tmp_path / "a", wal_config())
    await fill(old, 0, 11, count=2)
    a = Uploader(old, store, meta, NS, TOPIC, config=CONFIG)
    await a.start()
    assert await a.drain() == 21
    await a.close()
    await old.close()
    return store, meta


def test_a_topic_move_reads_the_old_owner_from_objects_then_the_new_wal(backend: Backend, tmp_path: Path,
                                                                        run: Run) -> None:
    """docs/TOPIC_MOVE.md: A wrote 0..21 and drained; broker B starts its WAL at 22 with checkpoint 21; a
    consumer at cursor 13 reads 14..27 with no gap and no duplicate."""

    async def main() -> None:
        store, meta = await first_owner(backend, tmp_path)

        new = await Wal.open(tmp_path / "b", wal_config(), initial_offset=22)
        b = Uploader(new, store, meta, NS, TOPIC, checkpoint=21, config=CONFIG)
        await b.start()
        log = await TopicLog.open(new, CloudReader(store, meta, NS, TOPIC))
        await fill(new, 22, 3, count=2)
        check_sequence(await read_all(log, 14), range(14, 28))
        assert await b.drain() == 27
        check_sequence(await read_all(log, 14), range(14, 28))
        await b.close()
        await close_all(store, meta, new)

    run(main())


def test_a_dead_owner_s_empty_reservation_is_not_counted_as_records(backend: Backend, tmp_path: Path,
                                                                     run: Run) -> None:
    """A crashed owner A stored 0..21; its reservation ran to 10,000,021, which its recovery declared empty;
    B goes on at 10,000,022. A subscription at 14 is 8 + 6 records behind, not ten million (the lag metric,
    danube_subscription_lag, counts this)."""

    async def main() -> None:
        store, meta = await first_owner(backend, tmp_path)
        bound = 21 + 10_000_000
        empty = ObjectDescriptor("", 22, bound, 0, True, 0)
        await meta.put(keys.object_descriptor(NS, TOPIC, 22), empty.to_json())
        new = await Wal.open(tmp_path / "b", wal_config(), initial_offset=bound + 1)
        log = await TopicLog.open(new, CloudReader(store, meta, NS, TOPIC))
        await fill(new, bound + 1, 3, count=2)
        assert records_between(log, 14, new.committed_offset) == 8 + 6
        assert records_between(log, 30, 40) == 0  # inside the empty range
        assert records_between(log, bound - 1, bound + 3) == 2
        assert records_between(new, 14, 20) == 6  # a WAL alone: its offsets
        check_sequence(await read_all(log, 14), [*range(14, 22), *range(bound + 1, bound + 7)])
        await close_all(store, meta, new)

    run(main())


def test_a_cloud_outage_is_retriable_and_reads_resume(faulty_backend: Backend, tmp_path: Path,
                                                      run: Run) -> None:
    async def main() -> None:
        store, meta, wal = await uploaded_topic(faulty_backend, tmp_path, batches=20, tail_batches=2)
        log = await TopicLog.open(wal, CloudReader(store, meta, NS, TOPIC, cache_bytes=0))
        faulty_backend.down()
        with pytest.raises(ObjectStoreUnavailable) as info:
            await log.read(5)
        assert info.value.retriable
        check_sequence(await read_all(log, wal.start_offset), range(wal.start_offset, 88))  # the WAL serves
        faulty_backend.up()
        check_sequence(await read_all(log, 5), range(5, 88))
        await close_all(store, meta, wal)

    run(main())


def test_without_a_cloud_reader_the_topic_log_is_the_wal(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal = await Wal.open(tmp_path / "wal", wal_config(1024))
        await fill(wal, 0, 20)
        await wal.delete_before(30)
        log = TopicLog(wal)
        assert (log.start_offset, log.committed_offset) == (wal.start_offset, 80) and wal.start_offset > 0
        with pytest.raises(OffsetOutOfRange):
            await log.read(0)
        check_sequence(await read_all(log, wal.start_offset + 1), range(wal.start_offset + 1, 80))
        cached = log.cached(79, 100)
        assert cached is not None and cached[1] == 80
        await wal.close()

    run(main())

"""broker/positions.py over a real tiered log (objects on both backends, then the WAL): a time lookup is a
binary search of a few reads, not a scan, across objects, the WAL and holes; skip counts records, not
offsets; peek leaves out what was acknowledged one by one; reading backwards widens its window over a hole."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from danube_fast.broker import positions
from danube_fast.meta import keys
from danube_fast.meta.resources_storage import ObjectDescriptor
from danube_fast.storage import Wal
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.storage.objects.store import object_key
from danube_fast.storage.tiered import CloudReader, TopicLog
from tests.tier.conftest import Backend
from tests.tier.helpers import close_all, fill, wal_config
from tests.tier.test_tiered import NS, TOPIC, first_owner, uploaded_topic

pytestmark = pytest.mark.timeout(60)
Run = Callable[..., Any]
BASE_MS = 1_700_000_000_000  # helpers.batch: a batch's records are published at BASE_MS + its first offset


class CountingLog(TopicLog):
    reads = 0

    async def read(self, offset: int, max_bytes: int = 1 << 20) -> Any:
        self.reads += 1
        return await super().read(offset, max_bytes)


def test_time_lookup_is_a_binary_search_over_objects_and_the_wal(backend: Backend, tmp_path: Path,
                                                                 run: Run) -> None:
    async def main() -> None:
        store, meta, wal = await uploaded_topic(backend, tmp_path, batches=100, tail_batches=50)
        log = CountingLog(wal, CloudReader(store, meta, NS, TOPIC))
        await log.cloud.refresh()  # type: ignore[union-attr]
        assert (log.start_offset, log.committed_offset) == (0, 600)
        # (time asked, the first offset published at or after it): batches of 4 share a time
        for asked, expected in ((0, 0), (BASE_MS, 0), (BASE_MS + 1, 4), (BASE_MS + 5, 8),
                                (BASE_MS + 396, 396), (BASE_MS + 397, 400), (BASE_MS + 599, 600),
                                (BASE_MS + 596, 596), (BASE_MS + 10**6, 600)):
            log.reads = 0
            assert await positions.offset_at_time(log, asked) == expected, asked
            assert log.reads <= math.ceil(math.log2(600)) + 2, (asked, log.reads)  # not a scan
        await close_all(store, meta, wal)

    run(main())


def test_time_lookup_skip_and_peek_across_a_hole(backend: Backend, tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        store, meta, wal = await uploaded_topic(backend, tmp_path, batches=40, tail_batches=5)
        log = await TopicLog.open(wal, CloudReader(store, meta, NS, TOPIC))
        first, second, third = (await load_descriptors(meta, NS, TOPIC))[:3]
        # Retention removed the second object: its offsets are a hole between the first and the third.
        await store.delete(object_key(NS, TOPIC, second.object_id))
        await meta.delete(keys.object_descriptor(NS, TOPIC, second.start_offset))
        assert log.cloud is not None
        await log.cloud.refresh()
        inside = second.start_offset + 1
        assert await positions.offset_at_time(log, BASE_MS + inside) == third.start_offset
        before = first.end_offset - 1
        # Two records of the first object, then the third object's: the hole holds no records to count.
        assert await positions.after_records(log, before, 2) == first.end_offset + 1
        assert await positions.after_records(log, before, 3) == third.start_offset + 1
        assert await positions.after_records(log, before, 10**6) == 180
        peeked = await positions.peek(log, before, 3, acked={first.end_offset})
        assert [p.record.offset for p in peeked] == [before, third.start_offset, third.start_offset + 1]
        assert await positions.peek(log, 180, 5) == []
        # Backwards from just after the hole: the window before it is widened until it reaches records.
        after = third.start_offset
        got = await positions.before(log, after + 2, 5)
        assert [p.record.offset for p in got] == [*range(first.end_offset - 2, first.end_offset + 1), after,
                                                  after + 1]
        assert [p.record.offset for p in await positions.before(log, after, 1)] == [first.end_offset]
        everything = await positions.before(log, 180, 10**6)
        kept = [*range(0, first.end_offset + 1), *range(after, 180)]
        assert [p.record.offset for p in everything] == kept
        assert await positions.before(log, 0, 3) == []
        assert [p.record.offset for p in await positions.peek(log, 0, 4, end=3)] == [0, 1, 2]
        await close_all(store, meta, wal)

    run(main())


def test_reading_backwards_over_a_declared_empty_reservation_needs_no_widening(backend: Backend,
                                                                               tmp_path: Path,
                                                                               run: Run) -> None:
    """A dead owner's reservation of ten million offsets, declared empty, lies between its records and the
    next owner's: the window before a position is sized in records, so a page back across it is a few
    reads, not twenty-four doublings."""

    async def main() -> None:
        store, meta = await first_owner(backend, tmp_path)  # 0..21, batches of 2
        bound = 21 + 10_000_000
        empty = ObjectDescriptor("", 22, bound, 0, True, 0)
        await meta.put(keys.object_descriptor(NS, TOPIC, 22), empty.to_json())
        new = await Wal.open(tmp_path / "b", wal_config(), initial_offset=bound + 1)
        log = CountingLog(new, CloudReader(store, meta, NS, TOPIC))
        await log.cloud.refresh()  # type: ignore[union-attr]
        await fill(new, bound + 1, 3, count=2)
        got = await positions.before(log, bound + 3, 5)
        assert [p.record.offset for p in got] == [19, 20, 21, bound + 1, bound + 2]
        assert log.reads <= 4, log.reads  # the batches of 18..21 and the new owner's first
        log.reads = 0
        assert [p.record.offset for p in await positions.before(log, log.committed_offset, 100)] == [
            *range(22), *range(bound + 1, bound + 7)]
        assert log.reads == 11 + 3, log.reads  # one window: each batch read once
        await close_all(store, meta, new)

    run(main())

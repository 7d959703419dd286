"""GapAwareLog (danube_fast/storage/gaps.py): a reader waits at a dead owner's open gap instead of skipping
it, whether it reaches the gap's first offset or a hole before it (the chaos campaign, docs/CHAOS.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from danube_fast import frames
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.storage import Wal
from danube_fast.storage.gaps import GapAwareLog, RecoveryPending
from danube_fast.storage.tiered import CloudReader
from danube_fast.storage.uploader import Uploader, UploaderConfig
from tests.tier.conftest import Backend
from tests.tier.helpers import check_sequence, fill, read_all, wal_config

pytestmark = pytest.mark.timeout(60)
Run = Callable[..., Any]
NS, TOPIC = "default", "gaps"
CONFIG = UploaderConfig(interval=3600, poll=0.01, max_object_bytes=1500, index_interval_bytes=300)
DEAD = 7  # the broker whose WAL holds the gap


async def owner(store: Any, meta: EmbeddedStore, path: Path, first: int, batches: int, checkpoint: int
                ) -> Wal:
    """An owner's WAL from `first`, filled with `batches` batches of 2 records and drained to the store."""
    wal = await Wal.open(path, wal_config(), initial_offset=first)
    await fill(wal, first, batches, count=2)
    up = Uploader(wal, store, meta, NS, TOPIC, checkpoint=checkpoint, config=CONFIG)
    await up.start()
    await up.drain()
    await up.close()
    return wal


def test_a_reader_in_a_hole_before_an_open_gap_waits_at_the_gap(backend: Backend, tmp_path: Path,
                                                                run: Run) -> None:
    """Objects 0..9; 10..19 a hole (declared empty); 20..29 a dead owner's gap, open; the new owner's WAL from
    30. A reader at 10 must not leap from the hole over the gap to 30: it waits, and once the dead owner's
    records 20..23 are in the object tier it reads them, then the new WAL."""

    async def main() -> None:
        store = await backend.open()
        meta = await EmbeddedStore.open(tmp_path / "meta.db")
        first = await owner(store, meta, tmp_path / "a", 0, 5, -1)  # offsets 0..9
        await first.close()
        new = await Wal.open(tmp_path / "c", wal_config(), initial_offset=30)
        await fill(new, 30, 2, count=2)  # 30..33
        log = GapAwareLog(new, CloudReader(store, meta, NS, TOPIC), wait=600)
        assert log.cloud is not None
        await log.cloud.refresh()
        log.set_gaps([(20, 29, DEAD)])
        with pytest.raises(RecoveryPending):
            await log.read(10)
        with pytest.raises(RecoveryPending):
            await log.read(20)  # at the gap itself, as before
        dead = await owner(store, meta, tmp_path / "b", 20, 2, 19)  # the dead owner recovers 20..23
        await dead.close()
        got = await log.read(10)
        assert got is not None
        assert [r.offset for r in frames.decode_records(got[0])] == [20, 21, 22, 23] and got[1] == 24
        with pytest.raises(RecoveryPending):
            await log.read(24)  # 24..29 may still come
        log.set_gaps([])  # its recovery declared 24..29 empty (the state key's gaps, handoff.py)
        check_sequence(await read_all(log, 10), [20, 21, 22, 23, 30, 31, 32, 33])
        await new.close()
        await meta.close()
        await store.close()

    run(main())

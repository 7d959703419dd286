"""GapAwareLog (danube_fast/storage/gaps.py): a reader waits at a dead owner's open gap instead of skipping
it, whether it reaches the gap's first offset or a hole before it (the chaos campaign, docs/CHAOS.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from danube_fast.codec import frames
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


def sequenced(name: str, session: int, sequence: int) -> bytes:
    return frames.encode_payloads([b"%s-%d" % (name.encode(), sequence)] * 2, producer_name=name,
                                  session=session, sequence=sequence)


async def stored_by(wal: Wal, batches: list[bytes]) -> dict[tuple[str, int], tuple[int, int]]:
    """Append `batches`; their (producer, sequence) -> (first, last) offsets."""
    out = {}
    for data in batches:
        header = frames.parse_header(data)
        out[header.producer_name, header.sequence] = await wal.append(data)
    return out


def test_idempotent_producers_wait_for_the_dead_owners_gap_and_learn_it(backend: Backend, tmp_path: Path,
                                                                        run: Run) -> None:
    """A move after a crash (broker/sequences.py): the dead owner stored sequenced batches at 20..27 (its
    reservation, the gap) and died
    before they reached the object tier. The new owner's table waits for their recovery before it is ready,
    then answers their retries with the first copies' offsets. A session found in the gap does not replace
    a later one the new owner's WAL holds or a move carried. Without recovery, ready returns once its wait
    is over. An owner that loads the topic after the gap was recovered (no gap left to wait for: the topic
    went through another owner meanwhile) finds those batches in the tier's tail all the same."""
    from danube_fast.broker.sequences import ProducerSequences

    async def main() -> None:
        store = await backend.open()
        meta = await EmbeddedStore.open(tmp_path / "meta.db")
        new = await Wal.open(tmp_path / "c", wal_config(), initial_offset=30)
        later = await stored_by(new, [sequenced("p", 2, 1)])  # p's next session, at 30..31
        log = GapAwareLog(new, CloudReader(store, meta, NS, TOPIC), wait=600)
        assert log.cloud is not None
        await log.cloud.refresh()
        log.set_gaps([(20, 27, DEAD)])
        table = ProducerSequences()
        table.restore({"r": [4, [[1, 40, 41, 2]]]})  # a session of r later than the gap's, carried by a move
        table.with_tier(log, gap_wait=30)
        ready = asyncio.ensure_future(table.ready(new))
        await asyncio.sleep(1.0)
        assert not ready.done(), "the table was ready before the gap was recovered"
        dead = await Wal.open(tmp_path / "b", wal_config(), initial_offset=20)
        first = await stored_by(dead, [sequenced("p", 1, 7), sequenced("q", 3, 1), sequenced("q", 3, 2),
                                         sequenced("r", 3, 1)])
        up = Uploader(dead, store, meta, NS, TOPIC, checkpoint=19, config=CONFIG)
        await up.start()
        await up.drain()
        await up.close()
        await dead.close()
        await asyncio.wait_for(ready, 10)
        appended: list[int] = []

        async def append(stored: Callable[[int, int], None]) -> tuple[int, int, int]:
            appended.append(1)
            return 100, 101, 2

        async def confirm(stored: tuple[int, int, int]) -> None:
            return None

        for name, session, seq in (("q", 3, 1), ("q", 3, 2)):
            assert await table.publish(name, session, seq, append, confirm) == (*first[name, seq], 2)
        assert await table.publish("p", 2, 1, append, confirm) == (*later["p", 1], 2)
        assert await table.publish("r", 4, 1, append, confirm) == (40, 41, 2)
        assert not appended
        assert table.duplicates == 4
        later_owner = ProducerSequences()
        log.set_gaps([])  # recovered before this owner loaded the topic: no gap, the batches are objects
        later_owner.with_tier(log, gap_wait=30)
        await asyncio.wait_for(later_owner.ready(new), 5)
        assert await later_owner.publish("q", 3, 2, append, confirm) == (*first["q", 2], 2)
        assert not appended
        unrecovered = ProducerSequences()
        log.set_gaps([(40, 49, DEAD)])  # never recovered: ready goes on after its wait
        unrecovered.with_tier(log, gap_wait=0.5)
        started = time.monotonic()
        await asyncio.wait_for(unrecovered.ready(new), 10)
        assert 0.5 <= time.monotonic() - started < 5
        await new.close()
        await meta.close()
        await store.close()

    run(main())

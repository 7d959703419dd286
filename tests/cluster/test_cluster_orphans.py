"""Orphan WAL recovery in the Reconciler (cluster/reconciler.py), for the case the chaos campaign caught: a
broker restarted while its cache still showed an assignment its lease had lost, so the start's orphan pass
passed the topic's WAL over; the assignment then went, and nothing recovered the WAL: readers waited at its
gap and would have read past acknowledged records. Now the reconcile that sees the assignment gone recovers
it, and a failed recovery is tried again.

The race (an assignment deleted between the cache's load and the first reconcile) cannot be produced on
demand with real brokers, so the Reconciler runs here over stand-ins for the cache, the topics and the
membership; the recovery itself (cluster/orphans.py) is covered with real parts by test_cluster_moves.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from danube_fast.broker.cluster import reconciler as reconciler_module
from danube_fast.broker.cluster.orphans import Orphans
from danube_fast.broker.cluster.reconciler import Reconciler
from danube_fast.codec import frames
from danube_fast.meta import keys
from danube_fast.meta.resources import ObjectDescriptor, ReplacedLog, SealedState
from danube_fast.meta.store import Put
from danube_fast.names import TopicName
from danube_fast.storage import WalConfig
from danube_fast.storage.log_manager import LogManager
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.storage.wal import Wal

Run = Callable[..., Any]
ME = 7


class Cache:
    def __init__(self) -> None:
        self.assigned: set[str] = set()

    def get(self, key: str) -> object | None:
        return object() if key in self.assigned else None


def reconciler(tmp_path: Path, cache: Cache, recovered: list[str], failures: int = 0) -> Reconciler:
    wal_root = tmp_path / "wal"
    async def settled(name: TopicName) -> None:  # no delete runs
        pass

    topics = SimpleNamespace(find=lambda full: None, forget_broken=lambda name: None, settled=settled)
    logs = LogManager(str(wal_root), WalConfig())
    left = [failures]

    async def recover(name: TopicName, directory: str) -> None:
        if left[0]:
            left[0] -= 1
            raise OSError("the object store is away")
        recovered.append(name.full)
        Path(directory).rmdir()

    async def loaded(topic: object) -> None:
        pass

    return Reconciler(SimpleNamespace(wal_root=str(wal_root)), None, cache, topics,  # type: ignore[arg-type]
                      logs, SimpleNamespace(broker_id=ME), SimpleNamespace(changed=lambda: None),  # type: ignore[arg-type]
                      None, recover, loaded, None, None)  # type: ignore[arg-type]


def test_an_assignment_gone_after_the_start_recovers_the_wal_left_behind(
        tmp_path: Path, run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconciler_module, "RETRY_DELAY", 0.01)

    async def main() -> None:
        cache, recovered = Cache(), []
        name = TopicName("default", "t")
        (tmp_path / "wal" / "default" / "t").mkdir(parents=True)
        cache.assigned.add(keys.broker_topic(ME, "default", "t"))  # what the cache showed at the start
        r = reconciler(tmp_path, cache, recovered, failures=2)
        await r._recover_orphans()
        await asyncio.sleep(0.05)
        assert recovered == []  # assigned here, as far as the cache knows: not an orphan
        cache.assigned.clear()  # the assignment goes (the leader moved the topic away)
        await r._reconcile("default", "t")
        for _ in range(100):
            if recovered:
                break
            await asyncio.sleep(0.01)
        assert recovered == [name.full]  # after two failed tries
        assert not (tmp_path / "wal" / "default" / "t").exists()
        await r._reconcile("default", "t")  # nothing left to recover
        await asyncio.sleep(0.05)
        assert recovered == [name.full]
        await r.close()

    run(main())


def test_a_recovery_writes_no_descriptor_once_a_successor_took_the_topic_over(store: Any, run: Run) -> None:
    """A dead owner back before its in-sync follower took its topic over recovers its WAL; the takeover
    continues the topic below the dead owner's reservation, so from its `replaced/{owner}` key on the
    recovery's descriptors (an empty one declaring the reservation's rest among them) are refused, and the
    takeover checks the descriptors again after it wrote that key (reconciler.py `_takeover`). The chaos
    campaign caught the two overlapping: a takeover at offset 48 with 48..9999999 declared empty."""
    async def body() -> None:
        async with store() as s:
            orphans = Orphans(SimpleNamespace(), s, None, ME)  # type: ignore[arg-type]
            empty = Put(keys.object_descriptor("ns", "t", 48),
                        ObjectDescriptor("", 48, 9_999_999, 0, True, 1).to_json())
            await s.put(keys.replaced_log("ns", "t", ME), ReplacedLog(47).to_json())
            assert not (await orphans._create_only("ns", "t", ME, [empty])).succeeded
            assert await s.get(empty.key) is None
            await s.delete(keys.replaced_log("ns", "t", ME))  # a takeover that gave up: the recovery goes on
            assert (await orphans._create_only("ns", "t", ME, [empty])).succeeded
            assert not (await orphans._create_only("ns", "t", ME, [empty])).succeeded  # create-only

    run(body())


def test_a_copy_fills_only_a_gap_a_later_owner_recorded_and_declares_only_uncovered_runs_empty(
        store: Any, run: Run, tmp_path: Path) -> None:
    """A follower's copy of broker OF's term, retired (follower.py): while the state key is still OF's own
    reservation (its term goes on, or the next owner has not begun), the copy goes without writing
    anything: its records may lie above what every in-sync copy holds, and uploading them would show
    readers offsets a failover reuses (the chaos campaign caught a follower restarting with such a copy).
    Once a later owner recorded OF's gap, a copy of a successor fills it and declares the rest empty, but
    only where no object is: OF may have uploaded records past the copy's end before it died."""
    of = 9

    async def copy_of(directory: Path) -> None:
        wal = await Wal.open(str(directory))
        await wal.append(frames.encode_payloads([b"r%d" % i for i in range(10)]))  # 0..9
        await wal.close()

    async def body() -> None:
        async with store() as s:
            orphans = Orphans(SimpleNamespace(wal=WalConfig()), s, None, ME)  # type: ignore[arg-type]
            for start, end in ((0, 9), (12, 20)):
                await s.put(keys.object_descriptor("ns", "t", start),
                            ObjectDescriptor(f"data-{start}", start, end, 10, True, 1).to_json())
            name = TopicName("ns", "t")
            await s.put(keys.sealed_state("ns", "t"), SealedState(False, 10_000_019, of, 1).to_json())
            await copy_of(tmp_path / "a")
            await orphans.recover_copy(name, str(tmp_path / "a"), of, complete=True)
            assert not (tmp_path / "a").exists()
            assert [d.start_offset for d in await load_descriptors(s, "ns", "t")] == [0, 12]  # none written

            gaps = {"gaps": [[10, 10_000_019, of]]}  # the next owner's reservation records OF's gap
            later = SealedState(False, 20_000_019, ME, 1, extra=gaps)
            await s.put(keys.sealed_state("ns", "t"), later.to_json())
            await copy_of(tmp_path / "b")
            await orphans.recover_copy(name, str(tmp_path / "b"), of, complete=True)
            found = await load_descriptors(s, "ns", "t")
            assert [(d.start_offset, d.end_offset, d.size) for d in found] == \
                [(0, 9, 10), (10, 11, 0), (12, 20, 10), (21, 10_000_019, 0)]

    run(body())


def test_a_successor_lost_before_its_reservation_fills_the_gap_of_the_broker_it_replaced(
        store: Any, run: Run, tmp_path: Path) -> None:
    """ME took the topic over from dead broker OF with its copy (`replaced/{OF}` = through 9, by ME) and died
    before it wrote a reservation: the next owner recorded OF's range as OF's gap. OF's recovery leaves it
    to ME (the replaced key), so ME's own orphan recovery, whose WAL holds every record OF acknowledged,
    fills it and declares the rest empty (the chaos campaign caught readers waiting there for good)."""
    of = 9

    async def body() -> None:
        async with store() as s:
            orphans = Orphans(SimpleNamespace(wal=WalConfig()), s, None, ME)  # type: ignore[arg-type]
            await s.put(keys.object_descriptor("ns", "t", 0),
                        ObjectDescriptor("data-0", 0, 9, 10, True, 1).to_json())
            await s.put(keys.replaced_log("ns", "t", of), ReplacedLog(9, ME).to_json())
            gaps = {"gaps": [[10, 10_000_019, of]]}
            await s.put(keys.sealed_state("ns", "t"),
                        SealedState(False, 20_000_019, 5, 1, extra=gaps).to_json())
            wal = await Wal.open(str(tmp_path / "w"))
            await wal.append(frames.encode_payloads([b"r%d" % i for i in range(10)]))  # 0..9, as taken over
            await wal.close()
            await orphans.recover(TopicName("ns", "t"), str(tmp_path / "w"))
            found = await load_descriptors(s, "ns", "t")
            assert [(d.start_offset, d.end_offset) for d in found] == [(0, 9), (10, 10_000_019)]
            assert not (tmp_path / "w").exists()

    run(body())

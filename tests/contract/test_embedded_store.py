"""What only the embedded store has to prove: durability across close and reopen, and history retention."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.store import Compacted, KeyValue, LeaseNotFound, MetadataUnavailable, Put, WatchEvent

TEST_SECONDS = 10


def test_reopen_keeps_keys_revisions_and_history(run: Callable[..., Any], tmp_path: Path) -> None:
    path = tmp_path / "meta.db"

    async def check() -> None:
        s = await EmbeddedStore.open(path)
        r1 = await s.put("/a", b"1")
        r2 = (await s.transaction([], [Put("/a", b"2"), Put("/b", b"b")])).revision
        await s.delete("/b")
        r3 = await s.current_revision()
        await s.close()

        s = await EmbeddedStore.open(path)
        try:
            assert await s.current_revision() == r3
            assert await s.get("/a") == KeyValue("/a", b"2", r1, r2, 2)
            assert await s.get("/b") is None
            assert await s.put("/b", b"again") == r3 + 1
            assert await s.get("/b") == KeyValue("/b", b"again", r3 + 1, r3 + 1, 1)
            watch = s.watch_prefix("/", start_revision=r1)
            events = [await asyncio.wait_for(anext(watch), 5) for _ in range(5)]
            assert [(e.type, e.key, e.revision) for e in events] == [
                ("put", "/a", r1), ("put", "/a", r2), ("put", "/b", r2), ("delete", "/b", r3),
                ("put", "/b", r3 + 1)]
            await watch.aclose()  # type: ignore[attr-defined]
        finally:
            await s.close()

    run(check(), timeout=TEST_SECONDS)


def test_leases_that_ran_out_while_closed_expire_on_open(run: Callable[..., Any], tmp_path: Path) -> None:
    path = tmp_path / "meta.db"

    async def check() -> None:
        s = await EmbeddedStore.open(path)
        short, long = await s.grant_lease(5), await s.grant_lease(60)
        await s.put("/short/a", b"a", lease=short)
        await s.put("/short/b", b"b", lease=short)
        await s.put("/long", b"l", lease=long)
        closed_at = await s.current_revision()
        await s.close()

        # reopen as if 10 s had passed: past the short lease, within the long one
        s = await EmbeddedStore.open(path, wall_clock=lambda: time.time() + 10)
        try:
            assert await s.get_prefix("/short/") == []
            assert await s.current_revision() == closed_at + 1, "both keys went in one revisioned delete"
            with pytest.raises(LeaseNotFound):
                await s.keep_alive(short)
            assert await s.get("/long") is not None
            assert 0 < await s.keep_alive(long) <= 60
            watch = s.watch_prefix("/short/", start_revision=closed_at + 1)
            assert [await asyncio.wait_for(anext(watch), 5) for _ in range(2)] == [
                WatchEvent("delete", "/short/a", b"", closed_at + 1, b"a"),
                WatchEvent("delete", "/short/b", b"", closed_at + 1, b"b")]
            await watch.aclose()  # type: ignore[attr-defined]
        finally:
            await s.close()

    run(check(), timeout=TEST_SECONDS)


def test_history_retention_compacts_old_revisions(run: Callable[..., Any], tmp_path: Path) -> None:
    async def check() -> None:
        s = await EmbeddedStore.open(tmp_path / "meta.db", history_retention=10)
        try:
            revisions = [await s.put("/k", b"%d" % i) for i in range(40)]
            with pytest.raises(Compacted) as caught:
                await anext(s.watch_prefix("/", start_revision=revisions[0]))
            assert revisions[-12] < caught.value.compact_revision <= revisions[-10]
            watch = s.watch_prefix("/", start_revision=revisions[-10])
            assert [(await anext(watch)).revision for _ in range(10)] == revisions[-10:]
            await watch.aclose()  # type: ignore[attr-defined]
        finally:
            await s.close()

    run(check(), timeout=TEST_SECONDS)


def test_watchers_end_when_the_store_closes(run: Callable[..., Any], tmp_path: Path) -> None:
    async def check() -> None:
        s = await EmbeddedStore.open(tmp_path / "meta.db")
        watch = s.watch_prefix("/")
        waiting = asyncio.ensure_future(anext(watch))
        await s.put("/a", b"")
        assert (await waiting).key == "/a"
        waiting = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0)
        await s.close()
        with pytest.raises(MetadataUnavailable):
            await asyncio.wait_for(waiting, 5)
        with pytest.raises(MetadataUnavailable):
            await s.get("/a")

    run(check(), timeout=TEST_SECONDS)


@pytest.mark.timeout(TEST_SECONDS)
def test_group_commit_rolls_back_a_failing_transaction_alone(run: Callable[..., Any], tmp_path: Path) -> None:
    """Concurrent writes share one SQLite commit; each still gets its own revision, and one that fails
    inside the group (a put under a revoked lease) leaves its neighbours written."""

    async def check() -> None:
        s = await EmbeddedStore.open(tmp_path / "meta.db")
        try:
            lease = await s.grant_lease(60)
            await s.revoke_lease(lease)
            # The middle transaction writes one key, then fails: its savepoint must take that key back.
            failing = s.transaction([], [Put("/g/bad1", b"x"), Put("/g/bad2", b"x", lease=lease)])
            results = await asyncio.gather(s.put("/g/a", b"1"), failing, s.put("/g/b", b"2"),
                                           return_exceptions=True)
            assert isinstance(results[1], LeaseNotFound)
            assert isinstance(results[0], int) and results[2] == results[0] + 1
            assert await s.get("/g/bad1") is None
            assert [(kv.key, kv.mod_revision) for kv in await s.get_prefix("/g/")] == [
                ("/g/a", results[0]), ("/g/b", results[2])]
            revisions = await asyncio.gather(*[s.put(f"/h/{i}", b"v") for i in range(200)])
            assert revisions == list(range(revisions[0], revisions[0] + 200))
        finally:
            await s.close()
        s = await EmbeddedStore.open(tmp_path / "meta.db")  # and all of it was committed
        try:
            assert len(await s.get_prefix("/h/")) == 200
        finally:
            await s.close()

    run(check())

"""LocalCache over every MetadataStore: the initial load, live changes in order, prefix boundaries, reads from
memory while a real etcd is down or partitioned, and the resync after the history it needed was compacted.

Each test runs on asyncio and uvloop (the `run` fixture); those that need no etcd-only fault run on both
stores (the `store` fixture). Waits are bounded by deadlines; none asserts a duration except fail-fast.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.etcd import EtcdStore
from danube_fast.meta.local_cache import EventFeed, LocalCache, NotCached
from danube_fast.meta.store import (
    Compacted,
    Compare,
    Delete,
    KeyValue,
    MetadataStore,
    MetadataUnavailable,
    Put,
    WatchEvent,
)
from danube_fast.testing.etcd import EtcdServer, until_reachable
from danube_fast.testing.plugin import StoreFactory
from danube_fast.testing.proxy import Proxy

TEST_SECONDS = 14
FAIL_FAST_SECONDS = 5
CONVERGE_SECONDS = 8


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not true within {timeout} s"
        await asyncio.sleep(0.02)


async def converged(cache: LocalCache, s: MetadataStore, prefix: str,
                    timeout: float = CONVERGE_SECONDS) -> None:
    """Until the cache holds exactly the store's content under prefix and says it follows the store."""
    deadline = time.monotonic() + timeout
    while True:
        expected = (await s.get_prefix(prefix))
        if cache.get_prefix(prefix) == expected and cache.is_synced:
            return
        assert time.monotonic() < deadline, (
            f"the cache did not converge within {timeout} s: {cache.get_prefix(prefix)} != {expected}, "
            f"stale_since={cache.stale_since}")
        await asyncio.sleep(0.02)




async def take(sub: EventFeed, n: int, timeout: float = 5.0) -> list[tuple[str, str, int]]:
    events: list[WatchEvent] = [await asyncio.wait_for(anext(sub), timeout) for _ in range(n)]
    return [(e.type, e.key, e.revision) for e in events]



# load and live changes -----------------------------------------------------------------------------------


def test_load_then_follow_changes_in_order(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check() -> None:
        async with store() as s:
            await s.put("/a/1", b"one")
            await s.put("/b/1", b"b-one")
            await s.put("/z/1", b"outside")
            cache = await LocalCache.start(s, ["/a/", "/b/"])
            try:
                assert cache.revision == await s.current_revision()
                assert cache.is_synced and cache.stale_since is None
                assert cache.get("/a/1") == await s.get("/a/1")
                assert cache.get("/a/missing") is None
                for read in (lambda: cache.get("/z/1"), lambda: cache.get_prefix("/"),
                             lambda: cache.subscribe("/z/")):
                    with pytest.raises(NotCached, match="outside the prefixes"):
                        read()

                sub = cache.subscribe("/a/")
                r1 = await s.put("/a/2", b"two")
                r2 = await s.put("/a/1", b"one again")
                await cache.wait_for_revision(r2, 5, key="/a/1")
                assert cache.get("/a/1") == await s.get("/a/1")  # version 2, the first create_revision
                txn = await s.transaction([Compare("/a/1", "version", "==", 2)],
                                          [Put("/a/3", b"three"), Delete("/a/2")])
                assert txn.succeeded
                await s.put("/z/2", b"ignored")
                assert await s.delete_prefix("/a/") == 2
                r4 = await s.current_revision()
                await cache.wait_for_revision(r4, 5, key="/a/")
                assert cache.get_prefix("/a/") == []
                assert await take(sub, 6) == [
                    ("put", "/a/2", r1), ("put", "/a/1", r2), ("put", "/a/3", txn.revision),
                    ("delete", "/a/2", txn.revision), ("delete", "/a/1", r4), ("delete", "/a/3", r4)]

                # without a key: /b/ saw none of those revisions, the cache confirms it against the store
                await cache.wait_for_revision(r4, 5)
                with pytest.raises(TimeoutError):
                    await cache.wait_for_revision(r4 + 100, 0.3, key="/a/")

                lease = await s.grant_lease(60)
                leased_at = await s.put("/b/leased", b"v", lease=lease)
                await cache.wait_for_revision(leased_at, 5, key="/b/")
                assert cache.get("/b/leased") == KeyValue("/b/leased", b"v", leased_at, leased_at, 1, lease)
                await s.revoke_lease(lease)  # deletes the key: a change the cache sees like any other
                await cache.wait_for_revision(await s.current_revision(), 5, key="/b/")
                assert cache.get("/b/leased") is None
                assert cache.get_prefix("/b/") == (await s.get_prefix("/b/"))
                assert cache.is_synced
            finally:
                await cache.close()
            assert [e async for e in sub] == []  # closing the cache ends its subscriptions

    run(check(), timeout=TEST_SECONDS)


def test_prefix_reads_stop_at_the_boundary(run: Callable[..., Any], store: StoreFactory) -> None:
    keys = ["/a/b", "/a/b/", "/a/b/x", "/a/b/y/z", "/a/bc", "/a/b0", "/a/b/\u00e9", "/a/b/\U0001f600", "/a/c",
            "/a/b/\uffff"]

    async def check() -> None:
        async with store() as s:
            for key in keys:
                await s.put(key, key.encode())
            wide = await LocalCache.start(s, ["/a/b/", "/a/", "/a/b/x/"])  # merged into "/a/"
            narrow = await LocalCache.start(s, ["/a/b/"])
            try:
                for prefix in ("/a/", "/a/b", "/a/b/", "/a/b/y/", "/a/b/x", "/a/c/", "/a/b/\uffff"):
                    assert wide.get_prefix(prefix) == (await s.get_prefix(prefix)), prefix
                assert "/a/bc" not in [kv.key for kv in wide.get_prefix("/a/b/")]
                assert narrow.get_prefix("/a/b/") == wide.get_prefix("/a/b/")
                for read in (lambda: narrow.get("/a/bc"), lambda: narrow.get("/a/b"),
                             lambda: narrow.get_prefix("/a/")):
                    with pytest.raises(NotCached):
                        read()

                await s.put("/a/b/w", b"w")
                await s.delete("/a/b/x")
                revision = await s.put("/a/bb", b"bb")
                await wide.wait_for_revision(revision, 5, key="/a/")
                await narrow.wait_for_revision(revision, 5)
                for prefix in ("/a/", "/a/b", "/a/b/"):
                    assert wide.get_prefix(prefix) == (await s.get_prefix(prefix)), prefix
                assert narrow.get_prefix("/a/b/") == (await s.get_prefix("/a/b/"))
            finally:
                await wide.close()
                await narrow.close()

    run(check(), timeout=TEST_SECONDS)


# etcd down or partitioned --------------------------------------------------------------------------------


@pytest.mark.parametrize("watch_retry_seconds", [30.0, 0.5], ids=["watch-retries-inside", "watch-raises"])
def test_serves_from_memory_while_etcd_is_down_then_converges(
        run: Callable[..., Any], etcd: EtcdServer, caplog: pytest.LogCaptureFixture,
        watch_retry_seconds: float) -> None:
    """watch-retries-inside: the store's watch hides the outage (it retries for 30 s), only the probe sees
    it. watch-raises: the watch gives up while etcd is down and the cache resumes it itself."""

    async def check() -> None:
        s = await EtcdStore.connect([etcd.endpoint], timeout=3, watch_retry_seconds=watch_retry_seconds)
        cache: LocalCache | None = None
        try:
            await s.delete_prefix("/down/")
            for i in range(3):
                await s.put(f"/down/k{i}", b"before")
            cache = await LocalCache.start(s, ["/down/"], probe_interval=0.1)
            before, revision = cache.get_prefix("/down/"), cache.revision

            await asyncio.to_thread(etcd.stop)
            await until(lambda: cache is not None and cache.stale_since is not None)
            if watch_retry_seconds < 1:
                await until(lambda: "the watch of '/down/' failed" in caplog.text)
            started = time.monotonic()
            with pytest.raises(MetadataUnavailable) as caught:
                await s.put("/down/k0", b"during")
            assert time.monotonic() - started < FAIL_FAST_SECONDS
            assert f"etcd is unreachable at {etcd.endpoint}" in str(caught.value)
            assert caught.value.retriable and caught.value.grpc_code == "UNAVAILABLE"
            assert cache.get_prefix("/down/") == before and cache.get("/down/k1") == before[1]
            assert cache.revision == revision and not cache.is_synced

            await asyncio.to_thread(etcd.start)
            await until_reachable(s)
            await until(lambda: cache is not None and cache.is_synced)  # confirmed with nothing changed
            assert cache.get_prefix("/down/") == before
            await s.put("/down/k0", b"after")
            assert await s.delete("/down/k1")
            await s.put("/down/new", b"new")
            await converged(cache, s, "/down/")
            assert cache.get("/down/k1") is None and cache.stale_since is None
        finally:
            if cache is not None:
                await cache.close()
            await s.close()

    run(check(), timeout=TEST_SECONDS)


def test_resyncs_after_a_partition_outlived_the_history(run: Callable[..., Any], etcd: EtcdServer,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A real partition between the cache's store and etcd; meanwhile another client changes the keys and
    compacts: back, the watch cannot resume (Compacted) and the cache reloads the prefix."""

    async def check() -> None:
        proxy = Proxy(etcd.endpoint)
        direct = await EtcdStore.connect([etcd.endpoint])
        cached: EtcdStore | None = None
        cache: LocalCache | None = None
        try:
            cached = await EtcdStore.connect([proxy.target], timeout=2)
            await direct.delete_prefix("/part/")
            for i in range(4):
                await direct.put(f"/part/k{i}", b"before")
            cache = await LocalCache.start(cached, ["/part/"], probe_interval=0.1)
            before = cache.get_prefix("/part/")

            proxy.cut()
            await until(lambda: cache is not None and cache.stale_since is not None)
            await direct.put("/part/k0", b"changed")
            await direct.delete("/part/k1")
            await direct.put("/part/new", b"new")
            await direct.compact(await direct.current_revision())
            assert cache.get_prefix("/part/") == before

            proxy.pass_through()
            await converged(cache, direct, "/part/")
            assert "is compacted" in caplog.text
            revision = await direct.put("/part/after", b"after")  # and it follows the store again
            await cache.wait_for_revision(revision, 5, key="/part/after")
            assert cache.get("/part/after") == await direct.get("/part/after")
        finally:
            if cache is not None:
                await cache.close()
            if cached is not None:
                await cached.close()
            await direct.close()
            proxy.close()

    run(check(), timeout=TEST_SECONDS)


# compaction behind the cache's back, store closed under it ------------------------------------------------


def test_resyncs_to_the_store_when_its_history_is_compacted(run: Callable[..., Any], store: StoreFactory,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    async def check() -> None:
        async with store() as s:
            for i in range(4):
                await s.put(f"/c/k{i}", b"before")
            cache = await LocalCache.start(s, ["/c/"])
            try:
                sub = cache.subscribe("/c/")
                paused_at = cache.revision
                await cache._pause_watches()  # test hook: the cache stops following, as if cut off
                assert cache.stale_since is not None
                await s.put("/c/k0", b"changed")
                await s.delete("/c/k1")
                await s.put("/c/new", b"new")
                await s.put("/c/gone", b"briefly")
                await s.delete("/c/gone")
                await s.delete("/c/k2")
                await s.put("/c/k2", b"recreated")
                now = await s.current_revision()
                await s.compact(now)
                watch = s.watch_prefix("/c/", start_revision=paused_at + 1)
                with pytest.raises(Compacted):  # what the cache will meet when it resumes
                    await anext(watch)
                await watch.aclose()  # type: ignore[attr-defined]  # both stores return async generators

                cache._resume_watches()
                await converged(cache, s, "/c/")
                assert "is compacted" in caplog.text
                k0, new, k2 = await s.get("/c/k0"), await s.get("/c/new"), await s.get("/c/k2")
                assert k0 is not None and new is not None and k2 is not None
                assert cache.get("/c/k2") == k2 and k2.create_revision > paused_at
                assert await take(sub, 4) == sorted([  # the differences, in revision order
                    ("put", "/c/k0", k0.mod_revision), ("put", "/c/new", new.mod_revision),
                    ("put", "/c/k2", k2.mod_revision), ("delete", "/c/k1", now)], key=lambda e: e[2])
                revision = await s.put("/c/after", b"after")
                await cache.wait_for_revision(revision, 5, key="/c/")
                assert await take(sub, 1) == [("put", "/c/after", revision)]
            finally:
                await cache.close()

    run(check(), timeout=TEST_SECONDS)


def test_store_closed_under_the_cache(run: Callable[..., Any], tmp_path: Path) -> None:
    """The follower retries, the probe fails: stale, last values still served, and close() stays clean."""

    async def check() -> None:
        s = await EmbeddedStore.open(tmp_path / "meta.db")
        await s.put("/k/1", b"one")
        cache = await LocalCache.start(s, ["/k/"], probe_interval=0.05)
        try:
            await s.close()
            await until(lambda: cache.stale_since is not None)
            kv = cache.get("/k/1")
            assert kv is not None and kv.value == b"one"
            with pytest.raises(MetadataUnavailable):
                await s.put("/k/1", b"two")
            with pytest.raises(TimeoutError):
                await cache.wait_for_revision(cache.revision + 1, 0.3)
        finally:
            await cache.close()

    run(check(), timeout=TEST_SECONDS)

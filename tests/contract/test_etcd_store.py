"""What only the etcd store has to prove: behaviour while etcd is down, and recovery when the same server
(same data dir and ports) comes back. The `etcd` fixture restarts the server if a test leaves it stopped."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from danube_fast.meta.etcd import EtcdStore
from danube_fast.meta.store import Compare, MetadataUnavailable, Put
from danube_fast.testing.etcd import EtcdServer, until_reachable

TEST_SECONDS = 10
FAIL_FAST_SECONDS = 5



def test_calls_fail_fast_while_etcd_is_down_then_work(run: Callable[..., Any], etcd: EtcdServer) -> None:
    async def check() -> None:
        s = await EtcdStore.connect([etcd.endpoint], timeout=3)
        try:
            await s.put("/down/k", b"before")
            lease = await s.grant_lease(60)
            await asyncio.to_thread(etcd.stop)
            calls: list[Callable[[], Awaitable[object]]] = [
                lambda: s.get("/down/k"), lambda: s.get_prefix("/down/"), lambda: s.put("/down/k", b"during"),
                lambda: s.delete("/down/k"), lambda: s.delete_prefix("/down/"), lambda: s.current_revision(),
                lambda: s.transaction([Compare("/down/k", "version", ">", 0)], [Put("/down/k", b"during")]),
                lambda: s.grant_lease(10), lambda: s.keep_alive(lease), lambda: s.revoke_lease(lease),
                lambda: s.compact(1), lambda: EtcdStore.connect([etcd.endpoint], timeout=1)]
            for call in calls:
                started = time.monotonic()
                with pytest.raises(MetadataUnavailable) as caught:
                    await call()
                assert time.monotonic() - started < FAIL_FAST_SECONDS
                assert f"etcd is unreachable at {etcd.endpoint}" in str(caught.value)
                assert caught.value.retriable and caught.value.grpc_code == "UNAVAILABLE"
            await asyncio.to_thread(etcd.start)
            await until_reachable(s)
            kv = await s.get("/down/k")
            assert kv is not None and kv.value == b"before"
            assert 0 < await s.keep_alive(lease) <= 60
            await s.revoke_lease(lease)
        finally:
            await s.close()

    run(check(), timeout=TEST_SECONDS)


def test_watch_resumes_after_etcd_restarts(run: Callable[..., Any], etcd: EtcdServer) -> None:
    async def check() -> None:
        s = await EtcdStore.connect([etcd.endpoint])
        try:
            await s.delete_prefix("/wr/")
            watch = s.watch_prefix("/wr/")
            r1 = await s.put("/wr/a", b"1")
            assert (await asyncio.wait_for(anext(watch), 5)).revision == r1
            r2 = await s.put("/wr/b", b"2")  # not read yet when etcd goes down
            first = await asyncio.wait_for(anext(watch), 5)
            pending = asyncio.ensure_future(anext(watch))  # reading the stream when it breaks
            await asyncio.to_thread(etcd.stop)
            await asyncio.to_thread(etcd.start)
            await until_reachable(s)
            r3 = await s.put("/wr/c", b"3")
            second = await asyncio.wait_for(pending, 8)
            assert (first.key, first.revision, second.key, second.revision) == ("/wr/b", r2, "/wr/c", r3)
            assert r3 == r2 + 1, "no change was made while etcd was down"
            await watch.aclose()  # type: ignore[attr-defined]
        finally:
            await s.close()

    run(check(), timeout=TEST_SECONDS)


def test_watch_gives_up_when_etcd_stays_down(run: Callable[..., Any], etcd: EtcdServer) -> None:
    async def check() -> None:
        s = await EtcdStore.connect([etcd.endpoint], watch_retry_seconds=1.0)
        try:
            watch = s.watch_prefix("/gone/")
            await s.put("/gone/a", b"")
            await asyncio.wait_for(anext(watch), 5)  # the stream is up
            pending = asyncio.ensure_future(anext(watch))
            await asyncio.to_thread(etcd.stop)
            started = time.monotonic()
            with pytest.raises(MetadataUnavailable) as caught:
                await asyncio.wait_for(pending, 5)
            assert 1.0 <= time.monotonic() - started < 4
            assert f"etcd is unreachable at {etcd.endpoint}" in str(caught.value)
        finally:
            await s.close()

    run(check(), timeout=TEST_SECONDS)

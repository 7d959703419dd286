"""Fixtures of the contract suite: a real etcd server, and a fresh MetadataStore of each kind per test."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.etcd import EtcdStore
from danube_fast.meta.etcd_process import EtcdServer, start_etcd
from danube_fast.meta.store import MetadataStore, MetadataUnavailable


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = start_etcd(tmp_path_factory.mktemp("etcd") / "data")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd(etcd_server: EtcdServer) -> Iterator[EtcdServer]:
    """The session's etcd, running again after the test whatever the test did to it."""
    yield etcd_server
    if etcd_server.process is None:
        etcd_server.start()


StoreFactory = Callable[[], AbstractAsyncContextManager[MetadataStore]]


@pytest.fixture(params=["embedded", "etcd"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """`async with store() as s:` a fresh, empty store on the running loop (stores are bound to a loop, and
    the `run` fixture makes one per test). The etcd server is shared: the factory deletes every key first."""

    @contextlib.asynccontextmanager
    async def open_embedded() -> AsyncIterator[MetadataStore]:
        s = await EmbeddedStore.open(tmp_path / "meta.db")
        try:
            yield s
        finally:
            await s.close()

    @contextlib.asynccontextmanager
    async def open_etcd() -> AsyncIterator[MetadataStore]:
        s = await EtcdStore.connect([server.endpoint])
        try:
            await s.delete_prefix("/")
            yield s
        finally:
            await s.close()

    if request.param == "etcd":
        server: EtcdServer = request.getfixturevalue("etcd")
        return open_etcd
    return open_embedded


async def until_reachable(s: MetadataStore, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await s.current_revision()
            return
        except MetadataUnavailable:
            assert time.monotonic() < deadline, f"etcd not reachable again within {timeout} s"
            await asyncio.sleep(0.05)

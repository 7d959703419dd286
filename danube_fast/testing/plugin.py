"""The pytest plugin of the harness (tests/conftest.py: `pytest_plugins = ["danube_fast.testing.plugin"]`):
the fixtures every suite shares, each owning what it starts and stopping it at its scope's end.

- `run`: a coroutine on a fresh asyncio or uvloop loop (the test runs on both), with a timeout; an error the
  loop only logs fails the test.
- `etcd_server` (session) and `etcd` (the same server, running again after the test): a real etcd;
  `store`: a fresh, empty MetadataStore of each kind, embedded and etcd, per test.
- `moto_server` (session): a real S3 endpoint (moto) that a test may not take down.
- `shared_broker` (module; `BROKER_CONFIG` in the module configures it) and `broker` (it, alive before and
  after the test); `broker_factory`: brokers of the test's own.
- `cluster`: cluster-mode brokers on the session's etcd, emptied first.

Markers by fixture: a test that uses `etcd_server` (directly or through `etcd`, `cluster`, the etcd `store`)
gets the `etcd` marker, one that uses `moto_server` the `s3` marker, one that uses `shared_broker` or
`broker_factory` the `broker_process` marker, so that `-m "not etcd"` leaves out exactly the tests that need
an etcd binary. Modules that start such servers themselves mark themselves.
When a test fails, the end of the log of each broker it used is added to the report.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop

from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.etcd import EtcdStore
from danube_fast.meta.store import MetadataStore
from danube_fast.testing.broker import Broker, BrokerFactory
from danube_fast.testing.cluster import Cluster
from danube_fast.testing.etcd import EtcdServer, start_etcd
from danube_fast.testing.moto import MotoServer

T = TypeVar("T")
Run = Callable[..., Any]
StoreFactory = Callable[[], AbstractAsyncContextManager[MetadataStore]]
LOOPS = ["asyncio", "uvloop"]
MARK_BY_FIXTURE = {"etcd_server": "etcd", "moto_server": "s3", "shared_broker": "broker_process",
                   "broker_factory": "broker_process"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in MARK_BY_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


def grpc_poller_teardown(context: dict[str, Any]) -> bool:
    """grpc.aio's completion-queue poller is process-wide: a loop may get one last poller callback while it
    shuts down, which fails with 'Event loop is closed' inside grpc. It says nothing about the code under
    test (a fresh-clone CI run met it in tests/contract/test_backup.py), so it alone does not fail a test;
    tests/compat/compat_support.py uses this too."""
    exc = context.get("exception")
    return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed" and \
        "PollerCompletionQueue" in str(context.get("message", ""))


@pytest.fixture(params=LOOPS)
def run(request: pytest.FixtureRequest) -> Run:
    """Run a coroutine on a fresh asyncio or uvloop loop, with a timeout; an exception the loop only logs
    (a failed callback, a never-retrieved task exception) fails the test."""

    def runner(coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        loop = uvloop.new_event_loop() if request.param == "uvloop" else asyncio.new_event_loop()
        errors: list[dict[str, Any]] = []
        def handle(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if not grpc_poller_teardown(context):
                errors.append(context)

        loop.set_exception_handler(handle)
        try:
            return loop.run_until_complete(asyncio.wait_for(coro, timeout))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
            assert not errors, f"the event loop reported unhandled errors: {errors}"

    return runner


# -- etcd and the metadata stores -----------------------------------------------------------------------


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


@pytest.fixture(params=["embedded", pytest.param("etcd", marks=pytest.mark.etcd)])
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


# -- S3 -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    server = MotoServer()
    yield server
    server.stop()


# -- brokers --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_broker(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    broker = Broker(tmp_path_factory.mktemp("broker"), getattr(request.module, "BROKER_CONFIG", None))
    try:
        broker.start()
        yield broker
    finally:
        broker.close()


@pytest.fixture
def broker(shared_broker: Broker) -> Iterator[Broker]:
    """The module's broker, which must be alive when the test starts and still alive when it ends."""
    assert shared_broker.running, f"the module's broker died before this test:\n{shared_broker.log_tail()}"
    yield shared_broker
    assert shared_broker.running, f"the broker died during this test:\n{shared_broker.log_tail()}"


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[BrokerFactory]:
    factory = BrokerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def cluster(etcd: EtcdServer, tmp_path: Path) -> Iterator[Cluster]:
    """Brokers on the session's etcd, emptied first (the key layout is global), and a shared folder as the
    object store."""
    async def wipe() -> None:
        s = await EtcdStore.connect([etcd.endpoint])
        try:
            await s.delete_prefix("/")
        finally:
            await s.close()

    asyncio.run(wipe())
    c = Cluster(tmp_path, f"etcd://{etcd.endpoint}", str(tmp_path / "objects"))
    try:
        yield c
    finally:
        c.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
        None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        brokers: list[Broker] = []
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, Broker):
                brokers.append(value)
            elif isinstance(value, BrokerFactory | Cluster):
                brokers.extend(value.brokers)
        for b in dict.fromkeys(brokers):
            report.sections.append((f"broker log ({b.log_path})", b.log_tail()))
    return report

"""Fixtures of the contract suite: a real etcd server, and a fresh MetadataStore of each kind per test."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.etcd import EtcdStore
from danube_fast.meta.store import MetadataStore

ETCD_START_SECONDS = 15.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EtcdServer:
    """One etcd process on loopback. stop() and start() keep its data dir and ports: the same server
    comes back, as after a crash or a restart in production."""

    def __init__(self, data_dir: Path) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("the etcd binary is missing: run scripts/system-deps.sh (Debian: etcd-server)")
        self.binary = binary
        self.data_dir = data_dir
        self.client_port, self.peer_port = _free_port(), _free_port()
        self.endpoint = f"127.0.0.1:{self.client_port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        client, peer = f"http://{self.endpoint}", f"http://127.0.0.1:{self.peer_port}"
        log = (self.data_dir.parent / "etcd.log").open("ab")
        self.process = subprocess.Popen(
            [self.binary, "--name", "contract", "--data-dir", str(self.data_dir),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"contract={peer}", "--logger", "zap", "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + ETCD_START_SECONDS
        while not self.healthy():
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.process.returncode}; see {log.name}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"etcd was not healthy within {ETCD_START_SECONDS} s; see {log.name}")
            time.sleep(0.05)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as response:
                return b'"health":"true"' in response.read()
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    for attempt in range(3):  # a free port may be taken by someone else before etcd binds it
        server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data")
        try:
            server.start()
            break
        except RuntimeError:
            if attempt == 2:
                raise
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

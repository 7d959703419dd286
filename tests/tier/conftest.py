"""Fixtures of the object-tier tests: every object-store test runs over both backends, a FolderStore in a
temporary folder and an S3Store against a real S3 endpoint on loopback (the plugin's `moto_server`), with a
fresh bucket per test. Faults are real: the folder's root is replaced by a file; the S3 server is stopped and
its port closed, then a server is started again on the same port (moto keeps buckets in the process)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from danube_fast.storage.objects.folder import FolderStore
from danube_fast.storage.objects.s3 import S3Store
from danube_fast.storage.objects.store import ObjectStore
from danube_fast.testing.moto import REGION, MotoServer

CREDENTIALS = {"access_key": "testing", "secret_key": "testing"}


class Backend:
    """One object-store backend under test: `await open()` a store on it; `down()` / `up()` a real fault."""

    name: str

    async def open(self) -> ObjectStore:
        raise NotImplementedError

    def down(self) -> None:
        raise NotImplementedError

    def up(self) -> None:
        raise NotImplementedError


class FolderBackend(Backend):
    name = "folder"

    def __init__(self, root: Path) -> None:
        self.root = root

    async def open(self) -> ObjectStore:
        return await FolderStore.open(self.root)

    def down(self) -> None:
        os.rename(self.root, self.root.with_name("away"))
        self.root.write_bytes(b"not a folder")  # every put, get and list now fails with an OSError

    def up(self) -> None:
        self.root.unlink()
        os.rename(self.root.with_name("away"), self.root)


class S3Backend(Backend):
    name = "s3"

    def __init__(self, server: MotoServer, private: bool) -> None:
        self._shared = server
        self._private: MotoServer | None = None
        self._wants_private = private
        self.bucket = server.create_bucket()

    @property
    def server(self) -> MotoServer:
        if self._private is None and self._wants_private:
            self._private = MotoServer()  # faults must not disturb the session's server
        return self._private or self._shared

    async def open(self) -> ObjectStore:
        return await S3Store.open(self.bucket, "pre/fix", endpoint_url=self.server.endpoint, region=REGION,
                                  connect_timeout=1.0, read_timeout=5.0, max_attempts=1, **CREDENTIALS)

    def down(self) -> None:
        self.server.stop()

    def up(self) -> None:
        self.server.start()

    def close(self) -> None:
        if self._private is not None:
            self._private.stop()


def _backend(request: pytest.FixtureRequest, tmp_path: Path, private: bool) -> Iterator[Backend]:
    if request.param == "folder":
        yield FolderBackend(tmp_path / "objects")
        return
    s3 = S3Backend(request.getfixturevalue("moto_server"), private)
    yield s3
    s3.close()


@pytest.fixture(params=["folder", pytest.param("s3", marks=pytest.mark.s3)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Both backends, on the session's S3 server: do not take it down."""
    yield from _backend(request, tmp_path, private=False)


@pytest.fixture(params=["folder", pytest.param("s3", marks=pytest.mark.s3)])
def faulty_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Both backends, S3 on a server of the test's own: `down()` and `up()` are free to use."""
    yield from _backend(request, tmp_path, private=True)


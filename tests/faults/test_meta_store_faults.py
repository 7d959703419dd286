"""Real faults under the embedded metadata store: a full disk, a read-only file system, a damaged file.

Each error must say what happened and carry the status an operator's fix calls for: a full or read-only disk
is UNAVAILABLE and retriable (free space, remount: the same store writes again, nothing committed is lost),
a damaged file is DATA_LOSS. The last test shows a broker answering so.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_wal_crash import ROOT

from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.embedded_db import store_error
from danube_fast.meta.store import (
    KeyValue,
    MetadataCorrupt,
    MetadataError,
    MetadataReadOnly,
    MetadataStoreFull,
    MetadataUnavailable,
    Put,
)
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.testing.broker import Broker
from tests.compat.compat_support import RawApi, bounded, rpc_error, run_async, status_line

TEST_SECONDS = 20
BIG = b"v" * 100 * 1024  # 25 SQLite pages: more than any slack a full disk leaves in the store's files


def fill(mnt: Path) -> Path:
    """A file taking every free block of `mnt`; delete it to give the space back."""
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        while True:
            os.write(fd, b"\0" * 64 * 1024)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    return filler


def assert_sqlite_cause(e: BaseException, name: str) -> None:
    cause = e.__cause__
    assert isinstance(cause, sqlite3.Error), f"not chained to the sqlite3 error: {e!r} from {cause!r}"
    assert cause.sqlite_errorname.startswith(name), cause.sqlite_errorname


def test_full_disk_fails_writes_retriably_and_the_store_recovers(run: Callable[..., Any],
                                                                 small_tmpfs: Path) -> None:
    path = small_tmpfs / "meta.db"

    async def check() -> None:
        s = await EmbeddedStore.open(path)
        try:
            before = await s.put("/keep/a", b"a")
            await s.transaction([], [Put("/keep/b", b"b"), Put("/keep/c", b"c")])
            revision = await s.current_revision()
            filler = fill(small_tmpfs)

            with pytest.raises(MetadataError) as raised:
                await s.put("/lost/one", BIG)
            e = raised.value
            assert isinstance(e, MetadataStoreFull)
            assert (e.retriable, e.grpc_code) == (True, "UNAVAILABLE")
            assert "disk is full" in str(e) and str(path) in str(e), str(e)
            assert_sqlite_cause(e, "SQLITE_FULL")

            # a group commit: every transaction of the failed COMMIT gets the error, none is half applied
            group = await asyncio.gather(*(s.put(f"/lost/{i}", BIG) for i in range(8)),
                                         return_exceptions=True)
            assert all(isinstance(r, MetadataStoreFull) for r in group), group
            assert await s.current_revision() == revision
            assert await s.get_prefix("/lost/") == []
            assert [kv.key for kv in await s.get_prefix("/keep/")] == ["/keep/a", "/keep/b", "/keep/c"]

            filler.unlink()  # space returns: the same store writes again, no reopen needed
            assert await s.put("/after", BIG) == revision + 1
            assert (await s.get("/keep/a")) == KeyValue("/keep/a", b"a", before, before, 1)
        finally:
            await s.close()

        s = await EmbeddedStore.open(path)
        try:
            assert await s.current_revision() == revision + 1
            assert [kv.key for kv in await s.get_prefix("/")] == ["/after", "/keep/a", "/keep/b", "/keep/c"]
        finally:
            await s.close()

    run(check(), timeout=TEST_SECONDS)


CRASHED_WRITER = """
import asyncio, os, sys
from danube_fast.meta.embedded import EmbeddedStore

async def main() -> None:
    s = await EmbeddedStore.open(sys.argv[1])
    await s.put("/keep", b"kept")
    os._exit(0)  # a crash: the SQLite WAL and shared-memory files stay behind

asyncio.run(main())
"""


def remount(mnt: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mnt)], check=True)


def test_read_only_file_system_fails_writes_retriably(run: Callable[..., Any], small_tmpfs: Path) -> None:
    """A file system can only be remounted read-only once no file on it is open for writing, so the store
    meets it at open: after a crash (SQLite opens the file read-only, writes fail) or after a clean close
    (SQLite cannot open it at all)."""
    crashed, clean = small_tmpfs / "crashed.db", small_tmpfs / "clean.db"
    subprocess.run([sys.executable, "-c", CRASHED_WRITER, str(crashed)], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert Path(f"{crashed}-wal").exists()

    async def before() -> None:
        s = await EmbeddedStore.open(clean)
        await s.put("/keep", b"kept")
        await s.close()

    async def read_only() -> None:
        s = await EmbeddedStore.open(crashed)
        try:
            assert (await s.get("/keep")) is not None, "reads work on a read-only file system"
            with pytest.raises(MetadataError) as raised:
                await s.put("/more", b"x")
            e = raised.value
            assert isinstance(e, MetadataReadOnly)
            assert (e.retriable, e.grpc_code) == (True, "UNAVAILABLE")
            assert "read-only" in str(e) and str(crashed) in str(e), str(e)
            assert_sqlite_cause(e, "SQLITE_READONLY")
        finally:
            await s.close()

        with pytest.raises(MetadataError) as raised:
            await EmbeddedStore.open(clean)
        e = raised.value
        assert isinstance(e, MetadataReadOnly)
        assert (e.retriable, e.grpc_code) == (True, "UNAVAILABLE")
        assert "read-only" in str(e) and str(clean) in str(e), str(e)
        assert_sqlite_cause(e, "SQLITE_CANTOPEN")

    async def read_write() -> None:
        for path in (crashed, clean):
            s = await EmbeddedStore.open(path)
            try:
                assert (await s.get("/keep")) is not None
                await s.put("/more", b"x")
            finally:
                await s.close()

    run(before(), timeout=TEST_SECONDS)
    remount(small_tmpfs, "ro")
    try:
        run(read_only(), timeout=TEST_SECONDS)
    finally:
        remount(small_tmpfs, "rw")
    run(read_write(), timeout=TEST_SECONDS)


def damage_pages(path: Path) -> None:
    """Every page but the first (the header and the schema) overwritten."""
    data = path.read_bytes()
    path.write_bytes(data[:4096] + b"\xff" * (len(data) - 4096))


@pytest.mark.parametrize("damage", ["garbage", "pages"])
def test_a_damaged_file_is_data_loss_at_open(run: Callable[..., Any], tmp_path: Path, damage: str) -> None:
    path = tmp_path / "meta.db"

    async def check() -> None:
        if damage == "garbage":
            path.write_bytes(os.urandom(16 * 1024))
        else:
            s = await EmbeddedStore.open(path)
            for i in range(50):
                await s.put(f"/k{i}", b"v" * 500)
            await s.close()
            damage_pages(path)
        with pytest.raises(MetadataError) as raised:
            await EmbeddedStore.open(path)
        e = raised.value
        assert isinstance(e, MetadataCorrupt)
        assert (e.retriable, e.grpc_code) == (False, "DATA_LOSS")
        assert str(path) in str(e) and "damaged" in str(e), str(e)
        assert_sqlite_cause(e, "SQLITE_NOTADB" if damage == "garbage" else "SQLITE_CORRUPT")

    run(check(), timeout=TEST_SECONDS)


def test_create_producer_on_a_full_metadata_disk_is_unavailable(small_tmpfs: Path, tmp_path: Path) -> None:
    """A standalone broker whose data dir is the tmpfs; its WAL directory is a symlink to the ordinary disk,
    so that the full disk meets the metadata write and nothing else."""
    workdir, wal = tmp_path / "broker", tmp_path / "wal"
    workdir.mkdir()
    wal.mkdir()
    (workdir / "data").symlink_to(small_tmpfs, target_is_directory=True)
    (small_tmpfs / "wal").symlink_to(wal, target_is_directory=True)
    broker = Broker(workdir)
    try:
        broker.start()
        filler = fill(small_tmpfs)

        async def full() -> None:
            async with RawApi(broker.target) as api:
                e = await rpc_error(api.create_producer("/default/while_full", "p"), "CreateProducer")
                assert e.code() == grpc.StatusCode.UNAVAILABLE, f"{status_line(e)}\n{broker.log_tail()}"
                assert "disk is full" in e.details(), status_line(e)

        run_async(full())
        assert broker.running, broker.log_tail()
        filler.unlink()

        async def space_back() -> None:
            async with RawApi(broker.target) as api:
                await api.create_producer("/default/while_full", "p")

        run_async(space_back())
        broker.restart()  # a clean stop (exit 0), then the topic is found again

        async def after_restart() -> None:
            async with RawApi(broker.target) as api:
                request = pb.TopicLookupRequest(request_id=1, topic="/default/while_full")
                found = await bounded(api.discovery.TopicLookup(request), "TopicLookup")
                assert found.response_type == pb.TopicLookupResponse.Connect, found
                await api.create_producer("/default/after_restart", "p")

        run_async(after_restart())
    finally:
        broker.close()


def test_a_store_another_process_holds_locked_is_unavailable(tmp_path: Path) -> None:
    """The store waits 5 s (sqlite3's default timeout) for a lock before SQLite answers SQLITE_BUSY: here
    two connections that do not wait show what that answer becomes."""
    path = str(tmp_path / "meta.db")
    holder, waiter = (sqlite3.connect(path, isolation_level=None, timeout=0) for _ in range(2))
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as raised:
            waiter.execute("BEGIN IMMEDIATE")
    finally:
        holder.close()
        waiter.close()
    e = store_error(raised.value, path, "unused")
    assert type(e) is MetadataUnavailable and e.retriable and e.grpc_code == "UNAVAILABLE"
    assert "locked (SQLITE_BUSY)" in str(e) and path in str(e), str(e)


def test_an_io_error_is_unavailable_and_other_errors_stay_internal(tmp_path: Path) -> None:
    """No file system at hand fails reads or writes with EIO: the error SQLite would raise, made by hand."""
    e = sqlite3.OperationalError("disk I/O error")
    e.sqlite_errorcode, e.sqlite_errorname = sqlite3.SQLITE_IOERR_WRITE, "SQLITE_IOERR_WRITE"
    error = store_error(e, str(tmp_path / "meta.db"), "unused")
    assert type(error) is MetadataUnavailable and error.retriable and error.grpc_code == "UNAVAILABLE"
    assert "I/O error (SQLITE_IOERR_WRITE)" in str(error), str(error)
    e = sqlite3.OperationalError("no such table: nowhere")
    e.sqlite_errorcode, e.sqlite_errorname = sqlite3.SQLITE_ERROR, "SQLITE_ERROR"
    error = store_error(e, str(tmp_path / "meta.db"), "the embedded metadata store failed")
    assert type(error) is MetadataError and not error.retriable and error.grpc_code == "INTERNAL"
    assert str(error) == "the embedded metadata store failed: no such table: nowhere"

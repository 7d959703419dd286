"""The shared WAL I/O pool (storage/io_pool.py), and many WALs on one small pool: no thread per topic, every
append acknowledged in order with the offsets it was given, close with fsyncs still queued."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from danube_fast.codec import frames
from danube_fast.storage import SyncPolicy, Wal, WalConfig
from danube_fast.storage.io_pool import IoPool

Run = Callable[..., Any]


def test_tasks_run_soon_or_at_their_time_and_a_failing_task_does_not_stop_the_pool(
        caplog: pytest.LogCaptureFixture) -> None:
    pool = IoPool(2, name="test-io")
    done: list[str] = []
    lock = threading.Lock()
    finished = threading.Event()

    def note(what: str) -> Callable[[], None]:
        def task() -> None:
            with lock:
                done.append(what)
                if len(done) == 4:
                    finished.set()
        return task

    def fails() -> None:
        raise RuntimeError("a bug in a task")

    start = time.monotonic()
    pool.submit_at(start + 0.2, note("late"))
    pool.submit_at(start + 0.1, note("later"))
    pool.submit(fails)
    pool.submit(note("now"))
    pool.submit(note("now too"))
    assert finished.wait(5)
    assert sorted(done[:2]) == ["now", "now too"] and done[2:] == ["later", "late"]
    assert time.monotonic() - start >= 0.2
    assert "a WAL I/O task failed" in caplog.text
    pool.close()
    assert not any(t.name.startswith("test-io") for t in threading.enumerate())


def test_the_shared_pool_grows_to_the_largest_size_asked_for() -> None:
    """The broker's `[wal] io_threads` applies even when another WAL of the process opened the pool first
    with fewer threads; asking for fewer never shrinks it."""

    class Fresh(IoPool):  # its own process-wide instance, so the real shared pool is left alone
        _shared = None

    first = Fresh.shared(2)
    assert Fresh.shared(3) is first and first.size == 3
    assert Fresh.shared(1) is first and Fresh.shared() is first and first.size == 3
    running = threading.Barrier(4)  # three pool threads at once, and this one

    def meet() -> None:
        running.wait(5)

    for _ in range(3):
        first.submit(meet)
    running.wait(5)
    first.close()
    assert sum(t.name.startswith("wal-io") and t.is_alive() for t in first._threads) == 0


def batch(n: int) -> bytes:
    return frames.encode_payloads([b"r%d" % n])


@pytest.mark.parametrize("sync", ["always", "interval(5)", "none"])
def test_two_hundred_wals_on_two_threads(tmp_path: Path, run: Run, sync: str) -> None:
    """200 topics' WALs opened, written concurrently and closed on a pool of 2 threads: the process gains no
    thread, each WAL's appends get contiguous offsets in call order, and reopening finds every record."""

    async def main() -> None:
        pool = IoPool(2, name="test-wal-io")
        config = WalConfig(sync=SyncPolicy.parse(sync), linger_us=200)
        before = threading.active_count()
        wals = [await Wal.open(tmp_path / f"t{i}", config, pool=pool) for i in range(200)]
        executor = min(32, (os.cpu_count() or 1) + 4)  # the loop's default executor (recovery runs there)
        assert threading.active_count() <= before + executor  # not one thread per WAL
        acks = await asyncio.gather(*(w.append(batch(n)) for n in range(5) for w in wals))
        assert [a for a in acks[:200]] == [(0, 0)] * 200  # every WAL's first append is its offset 0
        assert [a for a in acks[-200:]] == [(4, 4)] * 200
        await asyncio.gather(*(w.close() for w in wals))
        reopened = await Wal.open(tmp_path / "t123", config, pool=pool)
        assert reopened.committed_offset == 5
        await reopened.close()
        pool.close()

    run(main(), timeout=60)


def test_close_waits_for_a_queued_fsync_and_acknowledges_it(tmp_path: Path, run: Run) -> None:
    """Big groups go to the sync task; a close right after them still acknowledges every one (the last write
    task fsyncs what the sync task has not reached) and nothing is lost on reopen."""

    async def main() -> None:
        pool = IoPool(1, name="test-wal-io")  # the sync task can only run after the write task
        big = frames.encode_payloads([bytes(100_000)])  # above the inline-fsync size
        wal = await Wal.open(tmp_path, WalConfig(), pool=pool)
        appends = [wal.submit(big) for _ in range(5)]
        await asyncio.sleep(0)
        await wal.close()
        assert [await a for a in appends] == [(i, i) for i in range(5)]
        again = await Wal.open(tmp_path, WalConfig(), pool=pool)
        assert again.committed_offset == 5
        await again.close()
        pool.close()

    run(main(), timeout=30)

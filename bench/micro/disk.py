"""The disk workloads: plain writes (the baseline), the asyncio WAL facade, the bare engine, and a log with
every batch indexed (for lookups and reads). Each writer returns the seconds of its timed part only: opening
and closing files and logs is outside the clock."""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import random
import time
from typing import TYPE_CHECKING

import uvloop

from bench.common import PUBLISH_TIME, no_gc
from danube_fast.codec import frames
from danube_fast.storage import SyncPolicy, Wal, WalConfig
from danube_fast.storage._wal_common import INDEX_ENTRY_BYTES
from danube_fast.storage.segmented_log import SegmentedLog
from danube_fast.storage.segments import FILE_HEADER

if TYPE_CHECKING:
    from typing_extensions import Buffer


def encode_batch_of(payload_bytes: int, records: int) -> bytes:
    """One encoded batch of `records` random payloads of `payload_bytes` each (encoded once, reused)."""
    payload = os.urandom(payload_bytes)
    return frames.encode_payloads([payload] * records, publish_time=PUBLISH_TIME)


def write_baseline(path: str, chunk: bytes, chunks: int, direct: bool = False) -> float:
    """What the disk gives without us: os.write of `chunk`, then os.fdatasync, `chunks` times, new file.
    With `direct`, the file is open with O_DIRECT and written from a page-aligned copy of `chunk` (whose
    length must be a multiple of 4 KiB), as the WAL's direct appends write."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | (os.O_DIRECT if direct else 0)
    with contextlib.ExitStack() as stack:
        source: bytes | mmap.mmap = chunk
        if direct:
            source = stack.enter_context(mmap.mmap(-1, len(chunk)))  # anonymous maps are page-aligned
            source[:] = chunk
        fd = os.open(path, flags, 0o644)
        stack.callback(os.close, fd)
        view = stack.enter_context(memoryview(source))
        with no_gc():
            t0 = time.perf_counter()
            for _ in range(chunks):
                done = 0
                while done < len(view):
                    done += os.write(fd, view[done:])
                os.fdatasync(fd)
            elapsed = time.perf_counter() - t0
    return elapsed


def sync_latencies(path: str, chunk_bytes: int, count: int, interval: float) -> list[float]:
    """Seconds each of `count` appends of `chunk_bytes` (a multiple of 4 KiB) took through O_DIRECT with an
    fdatasync after each, one every `interval` seconds to a new file, sorted: the disk's own part of a
    durable acknowledgement at a rate the disk keeps up with."""
    latencies: list[float] = []
    with contextlib.ExitStack() as stack:
        source = stack.enter_context(mmap.mmap(-1, chunk_bytes))  # anonymous maps are page-aligned
        source[:] = os.urandom(chunk_bytes)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_DIRECT, 0o644)
        stack.callback(os.close, fd)
        view = stack.enter_context(memoryview(source))
        with no_gc():
            start = time.perf_counter()
            for i in range(count):
                if (wait := start + i * interval - time.perf_counter()) > 0:
                    time.sleep(wait)
                t0 = time.perf_counter()
                done = 0
                while done < chunk_bytes:
                    done += os.write(fd, view[done:])
                os.fdatasync(fd)
                latencies.append(time.perf_counter() - t0)
    return sorted(latencies)


def wal_facade_append(directory: str, batch: bytes, appends: int, in_flight: int) -> float:
    """`appends` appends of `batch` through the asyncio Wal (sync=always) on uvloop, `in_flight` at a time."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_facade_append(directory, batch, appends, in_flight))


async def _facade_append(directory: str, batch: bytes, appends: int, in_flight: int) -> float:
    wal = await Wal.open(directory, WalConfig(sync=SyncPolicy.parse("always")))
    gate = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with gate:
            await wal.append(batch)

    try:
        with no_gc():
            t0 = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(appends)))
            elapsed = time.perf_counter() - t0
        _check_offsets(wal.committed_offset, batch, appends)
    finally:
        await wal.close()
    return elapsed


def engine_append(directory: str, batch: bytes, per_call: int, calls: int) -> float:
    """`calls` times: SegmentedLog.append of `per_call` copies of `batch`, then sync(); no event loop. Direct
    appends on, as the broker's Wal opens a sync=always log."""
    log = SegmentedLog(directory, direct_io=True)
    buffers: list[Buffer] = [batch] * per_call
    try:
        with no_gc():
            t0 = time.perf_counter()
            for _ in range(calls):
                log.append(buffers)
                log.sync()
            elapsed = time.perf_counter() - t0
        _check_offsets(log.next_offset, batch, per_call * calls)
    finally:
        log.close()
    return elapsed


def _check_offsets(next_offset: int, batch: bytes, batches: int) -> None:
    expected = batches * frames.parse_header(batch).record_count
    if next_offset != expected:
        raise RuntimeError(f"the log holds {next_offset} records after the run, expected {expected}")


# -- lookups and reads ----------------------------------------------------------------------------------


def build_indexed_log(directory: str, batches: int, payload_bytes: int) -> SegmentedLog:
    """A one-segment log of `batches` one-record batches, every batch in the index (index_interval_bytes=0,
    index sized to hold them all). Raises if the index does not point at every batch."""
    batch = encode_batch_of(payload_bytes, 1)
    log = SegmentedLog(directory, segment_bytes=1 << 30, index_interval_bytes=0,
                       index_max_bytes=INDEX_ENTRY_BYTES * (batches + 1))
    group: list[Buffer] = [batch] * 1000
    for start in range(0, batches, len(group)):
        log.append(group[:batches - start])
    log.sync()
    if len(log.segment_bases) != 1 or log.next_offset != batches:
        raise RuntimeError(f"expected one segment of {batches} records, got {log.segment_bases} "
                           f"and {log.next_offset} records")
    for offset in random.Random(1).sample(range(batches), 100):
        if log.lookup(offset)[1] != len(FILE_HEADER) + offset * len(batch):
            raise RuntimeError(f"offset {offset} is not indexed exactly: lookup gives {log.lookup(offset)}")
    return log


def time_lookups(log: SegmentedLog, offsets: list[int]) -> float:
    """Seconds for one lookup per offset (the loop itself costs a few tens of ns per call)."""
    lookup = log.lookup
    with no_gc():
        t0 = time.perf_counter()
        for offset in offsets:
            lookup(offset)
        return time.perf_counter() - t0


def read_all(log: SegmentedLog, max_bytes: int) -> int:
    """Read the whole log front to back, `max_bytes` per call, as a consumer does; returns bytes read."""
    limit = log.next_offset
    offset = log.start_offset
    total = 0
    while (data := log.read(offset, max_bytes, limit)) is not None:
        total += memoryview(data).nbytes
        offset = frames.span(data)[1]
    return total


def build_direct_log(directory: str, total_bytes: int) -> None:
    """A log of about `total_bytes` in 1 MiB batches of 64 KiB records, written with direct appends (so its
    data is not in the page cache), closed."""
    batch = encode_batch_of(64 * 1024, 16)
    log = SegmentedLog(directory, direct_io=True)
    try:
        for _ in range(max(1, total_bytes // len(batch))):
            log.append([batch])
        log.sync()
    finally:
        log.close()


def cold_read(directory: str, direct: bool, max_bytes: int) -> tuple[int, float, float]:
    """Read the log front to back with its files out of the page cache, through direct reads (a log opened
    with direct_reads) or buffered ones: (bytes, seconds, CPU seconds of this process)."""
    log = SegmentedLog(directory, direct_io=True, direct_reads=direct)
    try:
        for name in os.listdir(directory):
            if name.endswith(".log"):
                fd = os.open(os.path.join(directory, name), os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        with no_gc():
            t0, c0 = time.perf_counter(), time.process_time()
            total = read_all(log, max_bytes)
            return total, time.perf_counter() - t0, time.process_time() - c0
    finally:
        log.close()

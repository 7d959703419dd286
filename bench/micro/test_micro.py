"""pytest-benchmark micro-benchmarks of the native hot path. Not part of the test suite (testpaths is tests/):

    .venv/bin/python -m pytest bench/micro/test_micro.py --benchmark-only -q -p no:cacheprovider

Each benchmark also checks its output, so a fast wrong answer fails instead of looking good.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from bench.micro import codec, disk
from danube_fast.codec import frames
from danube_fast.storage.objects.folder import FolderStore
from danube_fast.storage.objects.format import build_object
from danube_fast.storage.segmented_log import SegmentedLog
from danube_fast.storage.uploader import READ_BYTES

pytest.importorskip("pytest_benchmark")

_T = TypeVar("_T")

RECORDS = 1000
PAYLOAD = 256


class Benchmark(Protocol):
    """The part of pytest-benchmark's `benchmark` fixture used here (its own class is untyped)."""

    extra_info: dict[str, Any]

    def __call__(self, fn: Callable[..., _T], /, *args: Any) -> _T: ...

    def pedantic(self, target: Callable[..., _T], args: tuple[Any, ...] = ..., *, rounds: int = ...,
                 warmup_rounds: int = ..., iterations: int = ...) -> _T: ...


@pytest.fixture(scope="module")
def payloads() -> list[bytes]:
    return codec.make_payloads(RECORDS, PAYLOAD)


@pytest.fixture(scope="module")
def one_batch(payloads: list[bytes]) -> bytes:
    return codec.batches_buffer(1, RECORDS, PAYLOAD)


def test_encode_batch(benchmark: Benchmark, payloads: list[bytes]) -> None:
    records = codec.make_records(payloads)
    benchmark.extra_info["records"] = len(records)
    out = benchmark(frames.encode_batch, records)
    assert frames.verify_batch(out).record_count == RECORDS


def test_encode_payloads(benchmark: Benchmark, payloads: list[bytes]) -> None:
    benchmark.extra_info["records"] = len(payloads)
    out = benchmark(frames.encode_payloads, payloads)
    assert frames.verify_batch(out).record_count == RECORDS


def test_decode_arrow(benchmark: Benchmark, one_batch: bytes) -> None:
    benchmark.extra_info["bytes"] = len(one_batch)
    table = benchmark(frames.decode_arrow, one_batch)
    assert table.num_rows == RECORDS


def test_decode_records(benchmark: Benchmark, one_batch: bytes) -> None:
    benchmark.extra_info["bytes"] = len(one_batch)
    records = benchmark(frames.decode_records, one_batch)
    assert len(records) == RECORDS and records[-1].offset == RECORDS - 1


def test_crc32c_1mib(benchmark: Benchmark) -> None:
    data = os.urandom(1024 * 1024)
    assert frames.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    benchmark.extra_info["bytes"] = len(data)
    benchmark(frames.crc32c, data)


@pytest.fixture(scope="module")
def indexed_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SegmentedLog]:
    log = disk.build_indexed_log(str(tmp_path_factory.mktemp("indexed")), 131_072, 100)
    yield log
    log.close()


def test_index_lookup_1000(benchmark: Benchmark, indexed_log: SegmentedLog) -> None:
    """1,000 random lookups per round over a segment whose 131,072 batches are all indexed."""
    rng = random.Random(7)
    offsets = [rng.randrange(indexed_log.next_offset) for _ in range(1000)]
    lookup = indexed_log.lookup

    def lookups() -> None:
        for offset in offsets:
            lookup(offset)

    benchmark.extra_info["lookups_per_round"] = len(offsets)
    benchmark(lookups)


def test_engine_append_sync_256k(benchmark: Benchmark, tmp_path: Path) -> None:
    """One ~256 KiB batch (64 x 4 KiB records) appended and fdatasync'd per round; disk-bound: 50 rounds."""
    batch = disk.encode_batch_of(4096, 64)
    log = SegmentedLog(str(tmp_path / "wal"))

    def append_sync() -> None:
        log.append([batch])
        log.sync()

    try:
        benchmark.extra_info["bytes"] = len(batch)
        benchmark.pedantic(append_sync, rounds=50, warmup_rounds=2, iterations=1)
        assert log.next_offset == 52 * 64
    finally:
        log.close()


# The uploader's object build and store (danube_fast/storage/uploader.py): 64 MiB objects, 8 MiB WAL reads.

OBJECT_BYTES = 64 * 1024 * 1024


@pytest.fixture(scope="module")
def wal_reads() -> list[bytes]:
    """A 64 MiB object's body as the uploader reads it: WAL reads of at most READ_BYTES, whole ~265 KB batches
    of 1,000 records of 256 bytes (a fast-API batch), offsets contiguous."""
    batch_bytes = len(codec.batches_buffer(1, RECORDS, PAYLOAD))
    body = codec.batches_buffer(OBJECT_BYTES // batch_bytes, RECORDS, PAYLOAD)
    reads: list[bytes] = []
    start = end = 0
    for h in frames.scan_batches(body, verify=False):
        if h.end - start > READ_BYTES:
            reads.append(body[start:end])
            start = end
        end = h.end
    reads.append(body[start:end])
    return reads


def _joined_verified_build(reads: list[bytes]) -> bytes:
    """The build before objects were stored as parts: join the reads, verify every CRC, join the object."""
    return build_object(b"".join(reads), verify=True).data


def test_build_object_joined_verified(benchmark: Benchmark, wal_reads: list[bytes]) -> None:
    benchmark.extra_info["bytes"] = sum(map(len, wal_reads))
    data = benchmark(_joined_verified_build, wal_reads)
    assert len(data) == build_object(wal_reads, verify=False).size


def test_build_object_parts(benchmark: Benchmark, wal_reads: list[bytes]) -> None:
    """What the uploader does now: the reads become the object's parts, batch framing checked, no CRC."""
    benchmark.extra_info["bytes"] = sum(map(len, wal_reads))
    built = benchmark(lambda: build_object(wal_reads, verify=False))
    assert built.parts[1:-1] == tuple(wal_reads) and built.data == _joined_verified_build(wal_reads)


@pytest.fixture
def folder_store(tmp_path: Path) -> Iterator[tuple[asyncio.AbstractEventLoop, FolderStore]]:
    loop = asyncio.new_event_loop()
    try:
        yield loop, loop.run_until_complete(FolderStore.open(tmp_path / "objects"))
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


def test_folder_put_joined(benchmark: Benchmark, wal_reads: list[bytes],
                           folder_store: tuple[asyncio.AbstractEventLoop, FolderStore]) -> None:
    """The 64 MiB object joined, then put (write, fsync, rename, fsync dir); disk-bound: 5 rounds."""
    loop, store = folder_store
    built = build_object(wal_reads, verify=False)
    benchmark.extra_info["bytes"] = built.size
    benchmark.pedantic(lambda: loop.run_until_complete(store.put("ns/t/o.dnb1", b"".join(built.parts))),
                       rounds=5, warmup_rounds=1, iterations=1)
    assert os.path.getsize(os.path.join(store.root, "ns", "t", "o.dnb1")) == built.size


def test_folder_put_parts(benchmark: Benchmark, wal_reads: list[bytes],
                          folder_store: tuple[asyncio.AbstractEventLoop, FolderStore]) -> None:
    """The same object's parts written with writev, then fsync, rename, fsync dir; disk-bound: 5 rounds."""
    loop, store = folder_store
    built = build_object(wal_reads, verify=False)
    benchmark.extra_info["bytes"] = built.size
    benchmark.pedantic(lambda: loop.run_until_complete(store.put_parts("ns/t/o.dnb1", built.parts)),
                       rounds=5, warmup_rounds=1, iterations=1)
    assert os.path.getsize(os.path.join(store.root, "ns", "t", "o.dnb1")) == built.size

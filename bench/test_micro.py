"""pytest-benchmark micro-benchmarks of the native hot path. Not part of the test suite (testpaths is tests/):

    .venv/bin/python -m pytest bench/test_micro.py --benchmark-only -q -p no:cacheprovider

Each benchmark also checks its output, so a fast wrong answer fails instead of looking good.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from bench import codec, disk
from danube_fast import frames
from danube_fast.wal_engine import SegmentedLog

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

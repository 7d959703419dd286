"""The CPU-bound workloads: encoding, decoding to Arrow, CRC32C. Each returns one run's rate, timed over about
`budget_s` seconds of repeated calls on inputs built before the clock starts."""

from __future__ import annotations

import itertools
import os
import random
import zlib

from bench.common import PUBLISH_TIME, time_calls
from danube_fast.codec import frames


def make_payloads(count: int, payload_bytes: int) -> list[bytes]:
    return [os.urandom(payload_bytes) for _ in range(count)]


TEXT_WORDS = ("order", "customer", "amount", "currency", "EUR", "USD", "status", "shipped", "pending",
              "returned", "sku", "quantity", "warehouse", "berlin", "lisbon", "priority")


def text_payloads(count: int, payload_bytes: int, seed: int = 1) -> list[bytes]:
    """JSON-like payloads (field names from a small vocabulary, numbers drawn at random), each different:
    the "text-like" records the compression figures use."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts: list[str] = []
        size = 0
        while size < payload_bytes:
            parts.append(f'"{rng.choice(TEXT_WORDS)}": {rng.randint(0, 999_999)}, ')
            size += len(parts[-1])
        out.append("".join(parts).encode()[:payload_bytes])
    return out


def make_records(payloads: list[bytes]) -> list[frames.Record]:
    return [frames.Record(payload=p, publish_time=PUBLISH_TIME + i) for i, p in enumerate(payloads)]


def encode_batch_rate(records: list[frames.Record], budget_s: float) -> float:
    """Records/s through encode_batch (Record objects: the general path)."""
    calls, elapsed = time_calls(lambda: frames.encode_batch(records), budget_s)
    return calls * len(records) / elapsed


def encode_payloads_rate(payloads: list[bytes], budget_s: float) -> float:
    """Records/s through encode_payloads (bare payloads, one publish time: the producer fast path)."""
    calls, elapsed = time_calls(lambda: frames.encode_payloads(payloads, publish_time=PUBLISH_TIME), budget_s)
    return calls * len(payloads) / elapsed


def batches_buffer(batches: int, records: int, payload_bytes: int, text: bool = False,
                   compression: str = "none", distinct: bool = False) -> bytes:
    """`batches` back-to-back batches of `records` records each with contiguous offsets, as in the WAL
    (random payloads, or `text` ones, compressed with `compression`). Every batch repeats one set of
    payloads unless `distinct`: then each record's is its own random bytes (records repeated from one batch
    to the next would let Parquet's dictionary encoding store them once)."""
    seeds = itertools.count(1)

    def payloads() -> list[bytes]:
        if text:
            return text_payloads(records, payload_bytes, seed=next(seeds))
        return make_payloads(records, payload_bytes)

    shared = payloads()
    return b"".join(frames.encode_payloads(payloads() if distinct else shared, publish_time=PUBLISH_TIME,
                                           producer_name="bench", base_offset=i * records,
                                           compression=compression)
                    for i in range(batches))


def decode_arrow_records_rate(buf: bytes, budget_s: float) -> float:
    """Records/s of a (possibly compressed) batch buffer turned into one pyarrow.RecordBatch."""
    records = sum(h.record_count for h in frames.scan_batches(buf, verify=False))
    calls, elapsed = time_calls(lambda: frames.decode_arrow(buf), budget_s)
    return calls * records / elapsed


def decode_arrow_rate(buf: bytes, verify: bool, budget_s: float) -> float:
    """Bytes/s of batch buffer turned into one pyarrow.RecordBatch."""
    calls, elapsed = time_calls(lambda: frames.decode_arrow(buf, verify=verify), budget_s)
    return calls * len(buf) / elapsed


def table_file(buf: bytes, directory: str) -> str:
    """The records of `buf` as a topic table holds them (the envelope's columns, zstd; docs/TABLES.md):
    the Parquet file's path."""
    import pyarrow.parquet as pq

    from danube_fast.tables.envelope import rows_of

    records = sum(h.record_count for h in frames.scan_batches(buf, verify=False))
    path = os.path.join(directory, "table.parquet")
    pq.write_table(rows_of([memoryview(buf)], 0, records, "/default/bench", -1), path, compression="zstd")
    return path


def parquet_read_rate(path: str, nbytes: int, budget_s: float) -> float:
    """Bytes/s of record batches (`nbytes` of them in the file) read back from the table's Parquet file
    into Arrow."""
    import pyarrow.parquet as pq

    calls, elapsed = time_calls(lambda: pq.read_table(path), budget_s)
    return calls * nbytes / elapsed


def crc32c_rate(data: bytes, budget_s: float) -> float:
    calls, elapsed = time_calls(lambda: frames.crc32c(data), budget_s)
    return calls * len(data) / elapsed


def zlib_crc32_rate(data: bytes, budget_s: float) -> float:
    """zlib's CRC-32 (a different polynomial, same job): the yardstick for our CRC32C loop."""
    calls, elapsed = time_calls(lambda: zlib.crc32(data), budget_s)
    return calls * len(data) / elapsed

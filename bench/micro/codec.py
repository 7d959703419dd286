"""The CPU-bound workloads: encoding, decoding to Arrow, CRC32C. Each returns one run's rate, timed over about
`budget_s` seconds of repeated calls on inputs built before the clock starts."""

from __future__ import annotations

import os
import zlib

from bench.common import PUBLISH_TIME, time_calls
from danube_fast import frames


def make_payloads(count: int, payload_bytes: int) -> list[bytes]:
    return [os.urandom(payload_bytes) for _ in range(count)]


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


def batches_buffer(batches: int, records: int, payload_bytes: int) -> bytes:
    """`batches` back-to-back batches of `records` records each with contiguous offsets, as in the WAL."""
    payloads = make_payloads(records, payload_bytes)
    return b"".join(frames.encode_payloads(payloads, publish_time=PUBLISH_TIME, producer_name="bench",
                                           base_offset=i * records) for i in range(batches))


def decode_arrow_rate(buf: bytes, verify: bool, budget_s: float) -> float:
    """Bytes/s of batch buffer turned into one pyarrow.RecordBatch."""
    calls, elapsed = time_calls(lambda: frames.decode_arrow(buf, verify=verify), budget_s)
    return calls * len(buf) / elapsed


def crc32c_rate(data: bytes, budget_s: float) -> float:
    calls, elapsed = time_calls(lambda: frames.crc32c(data), budget_s)
    return calls * len(data) / elapsed


def zlib_crc32_rate(data: bytes, budget_s: float) -> float:
    """zlib's CRC-32 (a different polynomial, same job): the yardstick for our CRC32C loop."""
    calls, elapsed = time_calls(lambda: zlib.crc32(data), budget_s)
    return calls * len(data) / elapsed

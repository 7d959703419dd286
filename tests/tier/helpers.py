"""Data helpers of the object-tier tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from danube_fast.codec import frames
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.storage import SyncPolicy, Wal, WalConfig
from danube_fast.storage.objects.format import HEADER_SIZE, parse_footer
from danube_fast.storage.objects.store import ObjectStore
from danube_fast.storage.tiered import ReadableLog

S = TypeVar("S", bound=ObjectStore)


def batch(first_seq: int, count: int = 4, size: int = 64) -> bytes:
    """A batch whose payloads carry their sequence numbers (which, in a WAL filled from 0 by these batches,
    equal their offsets), so reads are checked record by record."""
    return frames.encode_payloads(
        [seq.to_bytes(8, "little") * (size // 8) for seq in range(first_seq, first_seq + count)],
        publish_time=1_700_000_000_000 + first_seq,
    )


def seq_of(payload: bytes) -> int:
    return int.from_bytes(payload[:8], "little")


def stamped_body(first: int, batches: int, count: int = 4, size: int = 64) -> bytes:
    """Batches as the WAL stores them: offset-stamped and contiguous from `first`."""
    out = bytearray()
    for i in range(batches):
        b = bytearray(batch(first + i * count, count, size))
        frames.stamp_base_offset(b, first + i * count)
        out += b
    return bytes(out)


async def fill(wal: Wal, first_seq: int, batches: int, count: int = 4) -> None:
    """Append `batches` batches of `count` records whose payloads carry first_seq, first_seq + 1, ..."""
    for i in range(batches):
        await wal.append(batch(first_seq + i * count, count))


async def read_all(log: ReadableLog, start: int, max_bytes: int = 1 << 20) -> list[frames.Record]:
    """Every record from `start` to the committed end, read the way a dispatcher does."""
    out: list[frames.Record] = []
    position = start
    while True:
        got = await log.read(position, max_bytes)
        if got is None:
            return out
        data, nxt = got
        assert nxt > position
        out.extend(r for r in frames.decode_records(data) if r.offset >= position)
        position = nxt


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def stored_records(store: ObjectStore, prefix: str = "") -> list[frames.Record]:
    """The records of every object under `prefix`, objects in offset order, checked against their footer."""
    out: list[frames.Record] = []
    keys = await store.list(prefix)
    objects = [(await store.get(k), k) for k in keys]
    for data, key in sorted(objects, key=lambda o: parse_footer(o[0]).min_offset):
        footer = parse_footer(data)
        records = frames.decode_records(memoryview(data)[HEADER_SIZE : footer.body_end])
        assert key.endswith(f"data-{records[0].offset}-{records[-1].offset}.dnb1")
        assert (footer.min_offset, footer.max_offset) == (records[0].offset, records[-1].offset)
        out.extend(records)
    return out


def wal_config(segment_bytes: int = 2048) -> WalConfig:
    return WalConfig(sync=SyncPolicy("none"), segment_bytes=segment_bytes, linger_us=0)


def check_sequence(records: list[frames.Record], offsets: Sequence[int]) -> None:
    """Exactly the offsets of `offsets`, once each, in order, each with the payload written for it."""
    assert [r.offset for r in records] == list(offsets)
    assert [seq_of(r.payload) for r in records] == list(offsets)


async def open_topic(store: S, path: Path, segment_bytes: int = 2048,
                     initial_offset: int = 0) -> tuple[S, EmbeddedStore, Wal]:
    """The three parts an uploader or a tiered reader works on: a store, the metadata, the topic's WAL."""
    meta = await EmbeddedStore.open(path / "meta.db")
    wal = await Wal.open(path / "wal", wal_config(segment_bytes), initial_offset=initial_offset)
    return store, meta, wal


async def close_all(store: ObjectStore, meta: EmbeddedStore, wal: Wal) -> None:
    await wal.close()
    await meta.close()
    await store.close()

"""Where an operator's seek, skip, peek and browse land in a Reliable topic's log (docs/SUBSCRIPTIONS.md).

Everything here reads through the topic's log as a consumer does (objects, then the WAL, then the committed
tail) and changes nothing; Subscriptions.move applies a position.

- `offset_at_time`: the first record published at or after a time. A binary search over offsets: each probe
  reads the one batch at or after an offset (the WAL's sparse index and the objects' footers locate it, a
  hole is skipped as any read skips it) and compares the batch's largest publish time. A topic of 100 M
  records takes about 27 small reads, not a scan. Times are taken to grow with offsets, as they do when the
  producers' clocks agree; a record stamped earlier than one before it may land on either side.
- `after_records`: the position `count` records on (offsets are not dense: a hole holds no records).
- `peek`: the next records from a position, skipping those acknowledged one by one above it.
- `before`: the last records below a position (browsing backwards). Offsets are not dense, so it reads a
  window of offsets before the position and doubles it until the window holds enough records or reaches the
  log's start. The window is sized in the records `records_between` counts (offsets less the holes the
  object tier declares empty), so a declared hole, 10 million offsets after a takeover, costs no widening.
- `publish_time_at`: when the record at a position was published (message expiry's check).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from danube_fast.codec import frames
from danube_fast.storage.tiered import ReadableLog, records_between

if TYPE_CHECKING:
    import pyarrow as pa

PROBE_BYTES = 1  # a probe reads the one batch at or after an offset
WALK_BYTES = 1024 * 1024  # skip and peek read this much at a time


@dataclass(frozen=True)
class Peeked:
    record: frames.Record  # its offset set
    producer_name: str


async def _batch_at(log: ReadableLog, offset: int) -> tuple[frames.BatchHeader, memoryview] | None:
    """The batch holding `offset`, or the first after it (a hole), with its bytes; None when nothing is
    committed at or after `offset`."""
    got = await log.read(offset, PROBE_BYTES)
    if got is None:
        return None
    data = memoryview(got[0])
    for h in frames.scan_batches(data, verify=False):
        if h.last_offset >= offset:
            return h, data[h.position:h.end]
    return None


async def publish_time_at(log: ReadableLog, offset: int) -> int | None:
    """The publish time of the first record at or after `offset` (its batch's first time); None when none is
    committed."""
    found = await _batch_at(log, offset)
    if found is None:
        return None
    for r in frames.iter_records(found[1], verify=False):
        if r.offset >= offset:
            return int(r.publish_time)
    return None


async def offset_at_time(log: ReadableLog, time_ms: int) -> int:
    """The offset of the first record published at or after `time_ms`; the committed end when none is."""
    lo, hi = log.start_offset, log.committed_offset
    # The search is for the first offset whose batch (the one holding it, or the first after it) has a
    # record at or after time_ms, or that has no batch after it at all. Every offset before `lo` is not it;
    # `hi` may be.
    while lo < hi:
        mid = (lo + hi) // 2
        found = await _batch_at(log, mid)
        if found is None or found[0].max_timestamp >= time_ms:
            hi = mid
        else:
            lo = max(mid, found[0].last_offset) + 1  # the whole batch is earlier, and the hole before it
    found = await _batch_at(log, lo)
    if found is None:
        return log.committed_offset
    header, batch = found
    for r in frames.iter_records(batch, verify=False):
        if r.offset >= lo and r.publish_time >= time_ms:
            return int(r.offset)
    return min(header.last_offset + 1, log.committed_offset)


async def after_records(log: ReadableLog, start: int, count: int) -> int:
    """The position `count` records after `start` (every record from `start` on counts once); the committed
    end when fewer are there."""
    end = log.committed_offset
    offset, left = start, count
    while left > 0 and offset < end:
        got = await log.read(offset, WALK_BYTES)
        if got is None:
            break
        for h in frames.scan_batches(got[0], verify=False):
            if h.last_offset < offset:
                continue
            first = max(h.base_offset, offset)
            here = h.last_offset - first + 1
            if here >= left:
                return first + left
            left -= here
            offset = h.last_offset + 1
        offset = max(offset, got[1])
    return min(offset, end) if left > 0 else offset


async def peek(log: ReadableLog, start: int, count: int, acked: set[int] | frozenset[int] = frozenset(),
               end: int | None = None) -> list[Peeked]:
    """Up to `count` records from `start` on, below `end` (the committed end when None), without those in
    `acked`. A batch is decoded into Arrow columns and only the records shown become Python objects (a batch
    may hold thousands before them)."""
    out: list[Peeked] = []
    offset = start
    if end is None:
        end = log.committed_offset
    while len(out) < count and offset < end:
        found = await _batch_at(log, offset)
        if found is None:
            break
        header, batch = found
        columns = frames.decode_arrow(batch, verify=True)
        first = max(0, offset - header.base_offset)
        for row in range(first, columns.num_rows):
            at = header.base_offset + row
            if at >= end:
                return out
            if at in acked:
                continue
            out.append(Peeked(_record(columns, row, at), header.producer_name))
            if len(out) == count:
                return out
        offset = header.last_offset + 1
    return out


async def before(log: ReadableLog, end: int, count: int) -> list[Peeked]:
    """Up to `count` records below `end`, the last ones there, in ascending offset order (fewer when the log
    keeps fewer before `end`)."""
    start = log.start_offset
    wanted = count
    while True:
        low = _low_for(log, start, end, wanted)
        got = await peek(log, low, wanted, end=end)  # [low, end) holds at most `wanted` records
        if len(got) >= count or low <= start:
            return got[-count:]
        wanted *= 2  # a hole the object tier does not declare: widen the window


def _low_for(log: ReadableLog, start: int, end: int, records: int) -> int:
    """The highest offset `low` from `start` on such that [low, end) holds `records` offsets with records in
    them as `records_between` counts (in memory: no read); `start` when fewer are there."""
    if records_between(log, start, end) <= records:
        return start
    lo, hi = start, max(start, end - records)  # [end - records, end) holds at most `records`
    while lo < hi:  # [lo, end) holds at least `records`; nothing above `hi` does
        mid = (lo + hi + 1) // 2
        if records_between(log, mid, end) >= records:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _record(columns: pa.RecordBatch, row: int, offset: int) -> frames.Record:
    """Row `row` of decode_arrow's columns as a Record."""
    cell = {name: columns.column(name)[row].as_py() for name in
            ("value", "key", "attributes", "schema_id", "schema_version")}
    published = columns.column("timestamp")[row].value  # ms since the epoch, as stored
    attributes = dict(cell["attributes"]) if cell["attributes"] is not None else None
    return frames.Record(cell["value"], published, 0, cell["key"], attributes, cell["schema_id"],
                         cell["schema_version"], offset)

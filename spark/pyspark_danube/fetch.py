"""Reading one chunk on an executor: bytes from the object store (a ranged GET) or the broker (the tail),
decoded by the native codec straight into Arrow, cut to the chunk's offsets and times.

Work is per batch of records, never per record in Python: the codec walks the records (docs/FORMAT.md), and
the cuts are Arrow slices and one vectorized filter when a time bound is set. A chunk is decoded DECODE_BYTES
of batches at a time, so an executor holds about that much besides the fetched range.

Data loss (failOnDataLoss): an object that is gone, or bytes that fail their checks, stop the task with an
error naming the object and the offset when the option is true (the default); when false, what cannot be
read is skipped and counted in a warning. A value that does not decode with valueFormat avro or json is not
data loss: it is null in the value column, counted in a warning (values.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from danube_fast.access.objects import (
    FrameCorrupt,
    ObjectCorrupt,
    ObjectNotFound,
    ObjectStore,
    check_header,
    frames,
    object_key,
    open_object_store,
    parse_footer,
)
from danube_fast.access.tables import AvroDecoder, JsonDecoder
from pyspark_danube import columns, values
from pyspark_danube.plan import Chunk

log = logging.getLogger("pyspark_danube")

DECODE_BYTES = 8 * 1024 * 1024  # batches decoded into one Arrow batch


class DataLossError(RuntimeError):
    """Stored records cannot be read (failOnDataLoss=true)."""


def read_chunk(chunk: Chunk, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows of `chunk` as batches of `schema`, for a DataSourceReader.read."""
    loop = asyncio.new_event_loop()
    try:
        agen = _read(chunk, schema)
        while True:
            try:
                yield loop.run_until_complete(anext(agen))
            except StopAsyncIteration:
                break
        loop.run_until_complete(agen.aclose())
    finally:
        loop.close()


async def _read(chunk: Chunk, schema: pa.Schema) -> AsyncGenerator[pa.RecordBatch, None]:
    if chunk.object_id is None:
        async for data in _tail(chunk):
            for batch in _decode(data, chunk, schema, f"the broker's batches of {chunk.stored.name}"):
                yield batch
        return
    opts = chunk.options
    store = await open_object_store(opts.object_store, **(opts.s3.kwargs() if opts.object_store.startswith(
        "s3://") else {}))
    try:
        body = await _object_body(store, chunk)
        if body is not None:
            for batch in _decode(body, chunk, schema, f"object {chunk.object_id} of {chunk.stored.name}"):
                yield batch
    finally:
        await store.close()


async def _object_body(store: ObjectStore, chunk: Chunk) -> memoryview | None:
    """The batches of the chunk's byte range (the footer cut off when the range reaches the object's end)."""
    key = object_key(chunk.stored.namespace, chunk.stored.short, chunk.object_id or "")
    where = (f"object {chunk.object_id} of {chunk.stored.name} "
             f"(offsets {chunk.from_offset}..{chunk.to_offset - 1})")
    try:
        data = await store.get(key, chunk.byte_low, chunk.byte_high)
        if len(data) != chunk.byte_high - chunk.byte_low:
            raise ObjectCorrupt(f"asked for bytes {chunk.byte_low}..{chunk.byte_high}, got {len(data)}")
        end = len(data)
        if chunk.byte_high == chunk.object_size:
            body_end = parse_footer(data).body_end
            if not chunk.byte_low < body_end <= chunk.byte_high:
                raise ObjectCorrupt(f"its footer puts the body's end at {body_end}")
            end = body_end - chunk.byte_low
        if chunk.byte_low == 0:
            check_header(data)
        return memoryview(data)[:end]
    except (ObjectNotFound, ObjectCorrupt) as e:
        _lost(chunk, f"{where}: {e}", chunk.to_offset - chunk.from_offset)
        return None


def _decode(data: memoryview | bytes, chunk: Chunk, schema: pa.Schema,
            where: str) -> Iterator[pa.RecordBatch]:
    """Decode whole batches DECODE_BYTES at a time; keep the chunk's offsets and times; with valueFormat
    avro or json, decode their values too (values.py)."""
    values_decoder = values.decoder(chunk.options, schema.field("value").type)
    view = memoryview(data)
    try:
        headers = frames.scan_batches(view, verify=False)
    except FrameCorrupt as e:  # the batch structure itself is broken: nothing after it can be found
        _lost(chunk, f"{where}: {e}", chunk.to_offset - chunk.from_offset)
        return
    i = 0
    while i < len(headers):
        j, start = i, headers[i].position
        while j < len(headers) and (j == i or headers[j].end - start <= DECODE_BYTES):
            j += 1
        span = headers[i:j]
        first, last = span[0], span[-1]
        i = j
        if last.base_offset + last.record_count <= chunk.from_offset:
            continue
        if first.base_offset >= chunk.to_offset:
            break
        try:
            decoded = frames.decode_arrow(view[start:last.end], verify=True)
        except FrameCorrupt:
            decoded = _decode_good(view, span, chunk, where)
            if decoded is None:
                continue
        batch = _cut(decoded, chunk)
        if batch.num_rows:
            value = None if values_decoder is None else _values(values_decoder, batch, chunk, where)
            yield columns.to_spark(batch, chunk.stored.topic, chunk.stored.partition, schema, value)


def _values(decoder: AvroDecoder | JsonDecoder, batch: pa.RecordBatch, chunk: Chunk, where: str) -> pa.Array:
    """The batch's values decoded; those that do not decode are null, counted in a warning."""
    decoded = decoder.decode(batch)
    if decoded.failed:
        offsets = batch.column("offset")
        log.warning("%d of %d values of %s (offsets %d..%d) did not decode as %s: null in the value column "
                    "(%s)", decoded.failed, batch.num_rows, where, offsets[0].as_py(), offsets[-1].as_py(),
                    chunk.options.value_format, decoded.reason)
    return decoded.values


def _decode_good(view: memoryview, headers: list[frames.BatchHeader], chunk: Chunk,
                 where: str) -> pa.RecordBatch | None:
    """failOnDataLoss=false: the batches of a span that pass their CRC, the others counted as lost."""
    good = []
    for h in headers:
        try:
            frames.verify_batch(view, h.position)
            good.append(frames.decode_arrow(view[h.position:h.end], verify=False))
        except FrameCorrupt as e:
            _lost(chunk, f"{where}: batch of offsets {h.base_offset}..{h.last_offset}: {e}", h.record_count)
    return pa.Table.from_batches(good).combine_chunks().to_batches()[0] if good else None


def _cut(decoded: pa.RecordBatch, chunk: Chunk) -> pa.RecordBatch:
    """Rows of the chunk's offsets (contiguous in the decoded batches: a slice) and times (a filter)."""
    first = decoded.column("offset")[0].as_py()
    low = max(chunk.from_offset - first, 0)
    high = min(chunk.to_offset - first, decoded.num_rows)
    batch = decoded.slice(low, max(high - low, 0))
    if chunk.min_time is None and chunk.max_time is None:
        return batch
    times = batch.column("timestamp").cast(pa.int64())
    keep = None
    if chunk.min_time is not None:
        keep = pc.greater_equal(times, chunk.min_time)
    if chunk.max_time is not None:
        below = pc.less(times, chunk.max_time)
        keep = below if keep is None else pc.and_(keep, below)
    return batch.filter(keep)


def _lost(chunk: Chunk, what: str, records: int) -> None:
    if chunk.options.fail_on_data_loss:
        raise DataLossError(f"{what} (set failOnDataLoss=false to skip what cannot be read)")
    log.warning("skipped up to %d records: %s", records, what)


async def _tail(chunk: Chunk) -> AsyncIterator[bytes | memoryview]:
    """The chunk's offsets from the broker serving the topic (records not in the object tier yet)."""
    from danube_fast.access.brokers import TopicReader

    async with TopicReader(chunk.broker, credentials=chunk.options.credentials) as reader:
        async for data, _first, _last in reader.read(chunk.stored.name, chunk.from_offset, chunk.to_offset):
            yield data

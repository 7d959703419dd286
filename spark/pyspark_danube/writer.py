"""`df.write.format("danube")` and `df.writeStream.format("danube")`: rows published to one topic.

Each task publishes its rows on a producer of its own through the fast API, in batches, and returns only once
the broker acknowledged every batch (as durable as the topic promises); its commit message carries the row
count and the offset ranges it got. The driver's commit only reports them: there is nothing to make visible,
a row is readable as soon as it is acknowledged.

Delivery is at least once. A topic is append-only and nothing takes an acknowledged row back, so when a task
fails after some of its batches were acknowledged, Spark's retry of that task publishes them again; so does a
job (a micro-batch) that fails and is run again. A reader that needs each row once keeps an id of its own in
the key or an attribute and deduplicates on it.

Columns: `value` (binary or string, required, never null), `key` (string or binary holding UTF-8, optional:
the routing key) and `attributes` (map<string,string>, optional). The others a read gives (offset, timestamp,
producer_name, ...) belong to the topic and are refused, so are unknown ones.

Two publishers, one protocol, both on `FastProducer`, which follows the topic and resends what was not
acknowledged after a broker restart or a topic move: rows of `value` alone as payloads (`send_batch`), rows
with a key or attributes as records (`send_records`).

Producer names: `{producerName}-{write}-p{partition}-a{attempt}`, where `write` is an id the driver draws
per batch write, or a streaming query's id (kept across restarts). A stream therefore reuses the same few
names in every micro-batch: the broker keeps a record per producer name of a topic until the topic is
deleted, so names must not grow with the batches.
"""

from __future__ import annotations

import asyncio
import logging
import time
import unicodedata
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from danube_fast.access.brokers import CHANNEL_OPTIONS, Credentials, FastProducer, Offsets, open_channel
from danube_fast.access.objects import frames
from pyspark_danube.options import SECURITY_OPTIONS, OptionError, credentials, topic_name

log = logging.getLogger("pyspark_danube")

BATCH_RECORDS = 1000  # rows per batch sent, and at most BATCH_BYTES of values: FastProducer's defaults
BATCH_BYTES = 1 << 20
MAX_PREFIX_CHARS = 100  # producerName: the broker takes names up to 256 bytes, the rest of ours is ~50
QUERY_ID = "sql.streaming.queryId"  # the local property Spark's StreamExecution sets on every task

_NAMES = ("broker", "topic", "reliable", "producerName", "brokerTimeoutMs", "compression", *SECURITY_OPTIONS)
_CANONICAL = {n.lower(): n for n in _NAMES}
# DataStreamWriter hands its own options to the sink along with the user's.
_STREAM_OWN = frozenset({"checkpointlocation"})
_COLUMNS = {"value": "binary or string", "key": "string or binary (UTF-8)",
            "attributes": "map<string,string>"}


class ColumnError(ValueError):
    """The DataFrame has a column a topic cannot take, or lacks `value`."""


@dataclass(frozen=True)
class WriteOptions:
    broker: str  # host:port of any broker's client API: the topic is looked up from there
    topic: str
    reliable: bool = True
    producer_prefix: str = "spark"
    timeout: float = 10.0  # seconds: the driver's check that the broker answers, and a stream's Open
    records: bool = False  # the rows carry a key or attributes: sent as records, else as payloads
    compression: str = "none"  # batches compressed by the task before they are sent (docs/FORMAT.md)
    credentials: Credentials | None = None  # TLS and token (docs/SECURITY.md); None: plaintext


def parse(raw: Mapping[str, str], schema: StructType, *, streaming: bool) -> WriteOptions:
    """The write's options and columns, checked; OptionError or ColumnError naming the first problem."""
    given: dict[str, str] = {}
    for key, value in raw.items():
        name = _CANONICAL.get(key.lower())
        if name is None and key.lower() == "path":
            name = "topic"  # save("/ns/t"), start("/ns/t")
        if name is None:
            if streaming and key.lower() in _STREAM_OWN:
                continue
            raise OptionError(f"unknown option {key!r} for writing format('danube'); known: "
                              f"{', '.join(_NAMES)}")
        given[name] = value
    broker = given.get("broker", "").strip().removeprefix("http://").removeprefix("https://")
    if not broker or ":" not in broker:
        raise OptionError("option broker is required: host:port of a broker's client API (any broker of the "
                          f"cluster), got {given.get('broker', '')!r}")
    topic = given.get("topic", "").strip()
    if not topic:
        raise OptionError("option topic is required: a topic name /namespace/topic")
    topic = topic_name(topic, "topic")
    reliable = given.get("reliable", "true").strip().lower()
    if reliable not in ("true", "false"):
        raise OptionError(f"option reliable is {given['reliable']!r}: expected true (the topic keeps every "
                          "record in its WAL) or false (NonReliable: live delivery only)")
    prefix = given.get("producerName", "spark")
    if not prefix or len(prefix) > MAX_PREFIX_CHARS or \
            any(unicodedata.category(c) == "Cc" for c in prefix):
        raise OptionError(f"option producerName is {prefix!r}: expected 1 to {MAX_PREFIX_CHARS} characters "
                          "without control characters")
    timeout_text = given.get("brokerTimeoutMs", "10000")
    try:
        timeout_ms = int(timeout_text)
    except ValueError:
        raise OptionError(f"option brokerTimeoutMs is {timeout_text!r}: expected an integer") from None
    if timeout_ms < 1:
        raise OptionError(f"option brokerTimeoutMs is {timeout_ms}: expected at least 1")
    compression = given.get("compression", "none").strip().lower()
    if compression not in frames.COMPRESSIONS:
        raise OptionError(f"option compression is {given['compression']!r}: expected one of "
                          f"{', '.join(frames.COMPRESSIONS)}")
    return WriteOptions(broker, topic, reliable == "true", prefix, timeout_ms / 1000, _records(schema),
                        compression, credentials(given))


def _records(schema: StructType) -> bool:
    """Whether the columns carry more than a payload; ColumnError for a column a topic cannot take."""
    types = {f.name: f.dataType for f in schema.fields}
    for name in types:
        if name not in _COLUMNS:
            raise ColumnError(f"column {name!r} cannot be written to a topic: write value "
                              f"({_COLUMNS['value']}), and optionally key ({_COLUMNS['key']}) and "
                              f"attributes ({_COLUMNS['attributes']}); offsets, times and producer names "
                              "are the topic's")
    if "value" not in types:
        raise ColumnError(f"a DataFrame written to a topic needs a value column ({_COLUMNS['value']})")
    text = (BinaryType, StringType)
    attributes = types.get("attributes")
    if not isinstance(types["value"], text) or not isinstance(types.get("key", BinaryType()), text) or (
            attributes is not None and not (isinstance(attributes, MapType) and
                                            isinstance(attributes.keyType, StringType) and
                                            isinstance(attributes.valueType, StringType))):
        wrong = ", ".join(f"{n} is {t.simpleString()} (expected {_COLUMNS[n]})" for n, t in types.items())
        raise ColumnError(f"columns of the wrong type: {wrong}")
    return "key" in types or "attributes" in types


@dataclass(frozen=True)
class DanubeCommitMessage(WriterCommitMessage):
    """What one task published: its rows, all acknowledged, at these offset ranges (inclusive)."""

    topic: str
    producer: str
    rows: int
    offsets: tuple[tuple[int, int], ...]


class DanubeWriter(DataSourceArrowWriter):
    """A batch write (mode append): every task's rows acknowledged before it returns. At least once: see the
    module's docstring; `abort` reports what stays in the topic."""

    def __init__(self, raw: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise OptionError("mode('overwrite') cannot write to a Danube topic: a topic is append-only; "
                              "use mode('append')")
        self.options = parse(raw, schema, streaming=False)
        self.write_id = uuid.uuid4().hex[:12]
        asyncio.run(_check_broker(self.options))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DanubeCommitMessage:
        return publish(iterator, self.options, producer_name(self.options.producer_prefix, self.write_id))

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        log.info("wrote %s", _summary(messages, self.options.topic))

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        log.warning("the write to %s failed; what its tasks published stays in the topic (append-only): %s, "
                    "and whatever failed tasks had acknowledged before failing", self.options.topic,
                    _summary(messages, self.options.topic))


class DanubeStreamWriter(DataSourceStreamArrowWriter):
    """A streaming sink (append and update modes): each micro-batch's tasks publish as a batch write does.
    At least once: a micro-batch run again after a failure or a restart publishes its rows again.

    Spark builds this writer again for every micro-batch's commit, so it does not contact the broker here;
    an unreachable broker fails the first micro-batch's tasks."""

    def __init__(self, raw: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise OptionError("outputMode('complete') cannot write to a Danube topic: it replaces the sink's "
                              "contents and a topic is append-only; use outputMode('append') or 'update'")
        self.options = parse(raw, schema, streaming=True)
        self.write_id = uuid.uuid4().hex[:12]  # used only when a task does not name its query

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DanubeCommitMessage:
        context = TaskContext.get()
        query = (context.getLocalProperty(QUERY_ID) if context is not None else None) or self.write_id
        return publish(iterator, self.options, producer_name(self.options.producer_prefix, query))

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        log.info("micro-batch %d: wrote %s", batchId, _summary(messages, self.options.topic))

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("micro-batch %d failed; what its tasks published stays in %s and is published again when "
                    "the batch is run again: %s", batchId, self.options.topic,
                    _summary(messages, self.options.topic))


def producer_name(prefix: str, write: str) -> str:
    """`{prefix}-{write}-p{partition}-a{attempt}` of the running task (partition 0, attempt 0 outside one)."""
    context = TaskContext.get()
    partition, attempt = (context.partitionId(), context.attemptNumber()) if context is not None else (0, 0)
    return f"{prefix}-{write}-p{partition}-a{attempt}"


def _summary(messages: Sequence[WriterCommitMessage | None], topic: str) -> str:
    done = [m for m in messages if isinstance(m, DanubeCommitMessage)]
    ranges = sorted(r for m in done for r in m.offsets)
    shown = ", ".join(f"{a}..{b}" for a, b in ranges[:10]) + (" ..." if len(ranges) > 10 else "")
    return (f"{sum(m.rows for m in done)} rows to {topic} from {len(done)} of {len(messages)} tasks"
            f"{f' at offsets {shown}' if ranges else ''}")


async def _check_broker(opts: WriteOptions) -> None:
    channel = open_channel(opts.broker, CHANNEL_OPTIONS, opts.credentials)
    try:
        await asyncio.wait_for(channel.channel_ready(), opts.timeout)
    except TimeoutError:
        raise OptionError(f"option broker: no broker answers at {opts.broker} within {opts.timeout:g} s "
                          "(brokerTimeoutMs)") from None
    finally:
        await channel.close()


# -- a task ----------------------------------------------------------------------------------------------


def publish(batches: Iterator[pa.RecordBatch], opts: WriteOptions, name: str) -> DanubeCommitMessage:
    """Publish every row of `batches` as producer `name`; return once all are acknowledged."""
    return asyncio.run(_publish(batches, opts, name))


async def _publish(batches: Iterator[pa.RecordBatch], opts: WriteOptions, name: str) -> DanubeCommitMessage:
    publisher: Publisher | None = None  # opened with the first row: an empty partition registers no producer
    rows = 0
    acked: list[Offsets] = []
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if publisher is None:
                publisher = await (Records.open(opts, name) if opts.records else Payloads.open(opts, name))
            batch = _normalized(batch)
            for low, high in _cuts(batch.column("value")):
                await publisher.publish(batch.slice(low, high - low))
            rows += batch.num_rows
        if publisher is not None:
            acked = await publisher.finish()
    finally:
        if publisher is not None:
            await publisher.close()
    count = sum(last - first + 1 for first, last in acked)
    if count != rows:
        raise RuntimeError(f"{opts.topic}: the broker acknowledged {count} records of the {rows} producer "
                           f"{name} sent")
    return DanubeCommitMessage(opts.topic, name, rows, _merged(acked))


def _normalized(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`value` as binary without nulls, `key` as UTF-8 text (the routing key is a string)."""
    names = batch.schema.names
    columns = []
    for name, column in zip(names, batch.columns, strict=True):
        if name == "value":
            if column.null_count:
                raise ColumnError(f"column value is null in {column.null_count} of {len(column)} rows: a "
                                  "record needs a payload (write an empty one instead)")
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                column = column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else
                                     pa.binary())
        elif name == "key" and not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            try:
                column = column.cast(pa.string())
            except pa.ArrowInvalid as e:
                raise ColumnError(f"column key holds bytes that are not UTF-8 (a routing key is text): {e}") \
                    from e
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, names=names)


def _cuts(values: pa.Array) -> Iterator[tuple[int, int]]:
    """[low, high) row ranges of at most BATCH_RECORDS rows and BATCH_BYTES of values (a larger value goes
    alone)."""
    low, size = 0, 0
    for i, length in enumerate(pc.binary_length(values).to_pylist()):
        if i > low and (i - low >= BATCH_RECORDS or size + length > BATCH_BYTES):
            yield low, i
            low, size = i, 0
        size += length
    if low < len(values):
        yield low, len(values)


def _merged(acked: Sequence[Offsets]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for first, last in sorted(acked):
        if out and out[-1][1] + 1 == first:
            out[-1] = (out[-1][0], last)
        else:
            out.append((first, last))
    return tuple(out)


class Publisher(Protocol):
    """Sends a task's rows in batches on one producer. Owned by the task's event loop."""

    async def publish(self, rows: pa.RecordBatch) -> None:
        """Send `rows` (normalized, one batch's worth) as one batch; may wait for room, not for the ack."""

    async def finish(self) -> list[Offsets]:
        """Wait until every batch is acknowledged: their (first, last) offsets, or the first refusal."""

    async def close(self) -> None: ...


class Payloads:
    """Rows of value alone, through FastProducer (reconnects and resends, see danube_fast.client.producer)."""

    def __init__(self, producer: FastProducer) -> None:
        self._producer = producer
        self._futures: list[asyncio.Future[Offsets]] = []

    @classmethod
    async def open(cls, opts: WriteOptions, name: str) -> Payloads:
        return cls(await FastProducer.connect(opts.broker, opts.topic, name, reliable=opts.reliable,
                                              compression=opts.compression, credentials=opts.credentials))

    async def publish(self, rows: pa.RecordBatch) -> None:
        self._futures.append(await self._producer.send_batch(rows.column("value").to_pylist()))

    async def finish(self) -> list[Offsets]:
        return await _acknowledged(self._producer, self._futures)

    async def close(self) -> None:
        await self._producer.close()


class Records:
    """Rows with a key or attributes: encoded as records, through FastProducer.send_records (reconnects and
    resends like Payloads)."""

    def __init__(self, producer: FastProducer) -> None:
        self._producer = producer
        self._futures: list[asyncio.Future[Offsets]] = []

    @classmethod
    async def open(cls, opts: WriteOptions, name: str) -> Records:
        return cls(await FastProducer.connect(opts.broker, opts.topic, name, reliable=opts.reliable,
                                              compression=opts.compression, credentials=opts.credentials))

    async def publish(self, rows: pa.RecordBatch) -> None:
        records = _to_records(rows, int(time.time() * 1000))
        self._futures.append(await self._producer.send_records(records))

    async def finish(self) -> list[Offsets]:
        return await _acknowledged(self._producer, self._futures)

    async def close(self) -> None:
        await self._producer.close()


async def _acknowledged(producer: FastProducer, futures: list[asyncio.Future[Offsets]]) -> list[Offsets]:
    """Wait until every batch is acknowledged: their (first, last) offsets, or the first refusal."""
    await producer.flush()
    offsets = []
    for outcome in await asyncio.gather(*futures, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome  # a batch the broker refused
        offsets.append(outcome)
    return offsets


def _to_records(rows: pa.RecordBatch, publish_time: int) -> list[frames.Record]:
    names = rows.schema.names
    values = rows.column("value").to_pylist()
    keys = rows.column("key").to_pylist() if "key" in names else [None] * len(values)
    attributes = rows.column("attributes").to_pylist() if "attributes" in names else [None] * len(values)
    return [frames.Record(v, publish_time, routing_key=k, attributes=_attributes(a))
            for v, k, a in zip(values, keys, attributes, strict=True)]


def _attributes(pairs: list[tuple[str, str | None]] | None) -> dict[str, str] | None:
    if not pairs:
        return None
    out = {}
    for name, value in pairs:
        if value is None:
            raise ColumnError(f"column attributes: attribute {name!r} is null (an attribute is a string)")
        out[name] = value
    return out

"""Planning on the driver: which stored topics, which offsets, which pieces of which objects.

A query names topics (a partitioned topic stands for its `-part-N` topics); each stored topic contributes
the offsets [start, end) its options (and pushed filters) ask for. Offsets up to the last uploaded object are
read from the object tier, one `Chunk` per object (split at its sparse index when it holds more than
maxRecordsPerPartition records, or to reach minPartitions); offsets after it, up to the committed offset at
planning time, are one tail chunk read from the broker that serves the topic (FastReader.Read). So
`endingOffsets=latest` sees everything acknowledged before the query started; `uploaded` reads the object
tier alone, without a broker.

Everything here only reads: the metadata through danube_fast.meta.reader, the objects' footers (when a time
bound prunes objects) with ranged GETs, and the broker's FastReader.Offsets.
"""

from __future__ import annotations

import asyncio
import bisect
import fnmatch
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pyspark.sql.datasource import InputPartition

from danube_fast.access.metadata import (
    BrokerRegistration,
    DeliveryMode,
    MetadataReader,
    ObjectDescriptor,
    TopicDelivery,
    keys,
    names,
)
from danube_fast.access.objects import (
    HEADER_SIZE,
    Footer,
    ObjectStore,
    load_descriptors,
    object_key,
    read_footer,
)
from pyspark_danube.options import EARLIEST, LATEST, Options
from pyspark_danube.pushdown import Bounds

if TYPE_CHECKING:
    from danube_fast.access.brokers import Credentials, TopicReader

log = logging.getLogger("pyspark_danube")



class PlanError(ValueError):
    """The query cannot be planned: a topic is missing or keeps nothing, a store is unreachable, an offset
    is out of range (with failOnDataLoss)."""


@dataclass(frozen=True)
class Stored:
    """One stored topic: a plain topic, or one partition of a partitioned topic."""

    name: str  # /ns/t or /ns/t-part-N: where it is stored
    topic: str  # the topic column: a partition's base name
    partition: int  # the partition column: N, or -1

    @property
    def namespace(self) -> str:
        return self.name.split("/")[1]

    @property
    def short(self) -> str:
        return self.name.split("/")[2]


@dataclass(frozen=True)
class Span:
    """What a query reads of one stored topic: offsets [start, end), and publish times [min_time,
    max_time) when bounded (ms)."""

    stored: Stored
    start: int
    end: int
    min_time: int | None = None
    max_time: int | None = None


@dataclass(frozen=True)
class Chunk(InputPartition):
    """One Spark input partition: offsets [from_offset, to_offset) of a stored topic, from one byte range of
    one object (object_id) or from the broker (object_id None: the tail). Picklable; carries the options
    the executor needs to reach the stores."""

    stored: Stored
    from_offset: int
    to_offset: int
    options: Options
    object_id: str | None = None
    byte_low: int = 0  # the range starts at an indexed batch whose base offset is indexed_offset
    byte_high: int = 0  # the object's size: read to its end, where the footer says the body ends
    indexed_offset: int = 0
    object_size: int = 0
    broker: str = ""  # host:port serving the topic, for the tail
    min_time: int | None = None
    max_time: int | None = None
    index: tuple[tuple[int, int], ...] = ()  # the object's index entries inside [byte_low, byte_high)

    def __repr__(self) -> str:  # the options hold credentials: keep them out of Spark's logs and UI
        where = self.object_id or f"broker {self.broker}"
        return f"Chunk({self.stored.name} [{self.from_offset}, {self.to_offset}) from {where})"


# -- topics -------------------------------------------------------------------------------------------------


async def stored_topics(meta: MetadataReader, options: Options) -> list[Stored]:
    """The stored topics the options name, in name and partition order; PlanError for a missing topic."""
    found: list[Stored] = []
    listed: dict[str, set[str]] = {}

    async def namespace_topics(ns: str) -> set[str]:
        if ns not in listed:
            listed[ns] = await _namespace_topics(meta, ns)
        return listed[ns]

    if options.topic_pattern is not None:
        ns = options.topic_pattern.split("/")[1]
        bases = sorted({_base(ns, short)[0] for short in await namespace_topics(ns)})
        names = [b for b in bases if fnmatch.fnmatchcase(b, options.topic_pattern)]
        if not names:
            raise PlanError(f"no topic matches topicPattern {options.topic_pattern}")
    else:
        names = list(options.topics)
    for name in names:
        ns, short = name.split("/")[1:]
        shorts = await namespace_topics(ns)
        if short in shorts:
            found.append(Stored(name, name, -1))
            continue
        parts = sorted((idx, s) for s in shorts for base, idx in [_base(ns, s)] if base == name and idx >= 0)
        if not parts:
            raise PlanError(f"topic {name} does not exist (as a topic or as a partitioned topic)")
        found.extend(Stored(f"/{ns}/{s}", name, idx) for idx, s in parts)
    for stored in found:
        kv = await meta.get(keys.topic_delivery(stored.namespace, stored.short))
        if kv is None or TopicDelivery.from_json(kv.value, key=kv.key).mode != DeliveryMode.RELIABLE:
            raise PlanError(f"topic {stored.name} is NonReliable: it stores nothing to read")
    return found


async def _namespace_topics(meta: MetadataReader, ns: str) -> set[str]:
    shorts = set()
    for kv in await meta.get_prefix(keys.namespace_topics_prefix(ns)):
        try:
            shorts.add(keys.parse_namespace_topic(kv.key)[1])
        except ValueError:
            continue
    return shorts


def _base(ns: str, short: str) -> tuple[str, int]:
    """(the topic column, the partition column) of stored topic /ns/short: the broker's own partition rule."""
    base = names.partition_base(short)
    return (f"/{ns}/{short}", -1) if base is None else (f"/{ns}/{base}", names.partition_index(short))


# -- brokers -------------------------------------------------------------------------------------------------


async def owners(meta: MetadataReader, stored: Sequence[Stored]) -> dict[str, str]:
    """host:port of the broker each stored topic is assigned to, where one is registered."""
    wanted = {(s.namespace, s.short): s.name for s in stored}
    assigned: dict[str, int] = {}
    for kv in await meta.get_prefix(keys.brokers_prefix()):
        try:
            broker_id, ns, short = keys.parse_broker_topic(kv.key)
        except ValueError:
            continue
        if (ns, short) in wanted:
            assigned[wanted[(ns, short)]] = broker_id
    found = {}
    for name, broker_id in assigned.items():
        registered = await meta.get(keys.broker_register(broker_id))
        if registered is not None:
            url = BrokerRegistration.from_json(registered.value, key=registered.key).broker_addr
            found[name] = url.removeprefix("http://").removeprefix("https://")
    return found


# -- offsets -------------------------------------------------------------------------------------------------


def resolve(stored: Stored, descriptors: list[ObjectDescriptor], committed: tuple[int, int] | None,
            options: Options) -> Span:
    """The offsets of `stored` the options ask for. `committed` is (start, next) from the serving broker,
    None when it was not asked (endingOffsets=uploaded) or could not be reached."""
    uploaded_end = max((d.end_offset + 1 for d in descriptors), default=0)
    first = min((d.start_offset for d in descriptors), default=uploaded_end)
    if committed is not None:
        first = min(first, committed[0]) if descriptors else committed[0]
        latest = committed[1]
    else:
        latest = uploaded_end

    def pick(bound: object, default_word: str) -> int:
        word = bound if isinstance(bound, str) else default_word
        if isinstance(bound, dict):
            value = bound.get((stored.topic, stored.partition))
            if value is None:
                raise PlanError(f"offsets JSON names no offset for {stored.topic} partition "
                                f"{stored.partition}")
            if value == EARLIEST:
                return first
            if value == LATEST:
                return latest
            return int(value)
        if word == "earliest":
            return first
        if word == "uploaded":
            return uploaded_end
        if committed is None:
            raise PlanError(f"{stored.name}: the broker serving it could not be reached for its committed "
                            "offset; set endingOffsets=uploaded to read only the object tier")
        return latest

    start = pick(options.starting, "earliest")
    end = pick(options.ending, "latest")
    if start < first:
        if options.fail_on_data_loss:
            raise PlanError(f"{stored.name}: starting offset {start} is no longer stored (the earliest is "
                            f"{first}); set failOnDataLoss=false to start at the earliest")
        log.warning("%s: offsets %d..%d are no longer stored; starting at %d", stored.name, start, first - 1,
                    first)
        start = first
    if end > latest:
        end = latest
    return Span(stored, start, max(start, end), options.starting_timestamp, options.ending_timestamp)


# -- chunks --------------------------------------------------------------------------------------------------


async def chunks(span: Span, descriptors: list[ObjectDescriptor], store: ObjectStore, broker: str,
                 options: Options) -> list[Chunk]:
    """The input partitions of one span: object pieces, then the tail from the broker."""
    out: list[Chunk] = []
    uploaded_end = 0
    for d in descriptors:
        uploaded_end = max(uploaded_end, d.end_offset + 1)
        if d.size == 0 and not d.object_id:  # an empty range declared by orphan recovery: no records
            continue
        low, high = max(span.start, d.start_offset), min(span.end, d.end_offset + 1)
        if low >= high:
            continue
        if span.min_time is not None or span.max_time is not None:
            footer = await _footer(store, span.stored, d)
            if (span.max_time is not None and footer.min_time >= span.max_time) or \
                    (span.min_time is not None and footer.max_time < span.min_time):
                continue  # every record of this object lies outside the time bounds
        out.extend(_split(span, d, low, high, options))
    if span.end > uploaded_end:
        if not broker:
            first = max(span.start, uploaded_end)
            raise PlanError(f"{span.stored.name}: offsets {first}..{span.end - 1} are not uploaded yet "
                            "and no broker serving the topic is registered")
        out.append(Chunk(span.stored, max(span.start, uploaded_end), span.end, options, broker=broker,
                         min_time=span.min_time, max_time=span.max_time))
    return out


def _split(span: Span, d: ObjectDescriptor, low: int, high: int, options: Options) -> list[Chunk]:
    """Pieces of object `d` for offsets [low, high): each starts at an indexed batch; pieces hold about
    maxRecordsPerPartition records when that is set, else the whole object is one piece."""
    index = list(d.offset_index) or [(d.start_offset, HEADER_SIZE)]
    i = max(bisect.bisect_right(index, low, key=lambda e: e[0]) - 1, 0)
    limit = options.max_records_per_partition
    pieces: list[tuple[int, int]] = []  # (index entry, next index entry or len)
    j = i
    while j < len(index) and index[j][0] < high:
        k = j + 1
        if limit is not None:
            while k < len(index) and index[k][0] - index[j][0] < limit and index[k][0] < high:
                k += 1
        else:
            k = len(index)
        pieces.append((j, k))
        j = k
    out = []
    for j, k in pieces:
        offset, position = index[j]
        end_position = index[k][1] if k < len(index) else d.size
        to = min(high, index[k][0]) if k < len(index) else high
        out.append(Chunk(span.stored, max(low, offset), to, options, object_id=d.object_id, byte_low=position,
                         byte_high=end_position, indexed_offset=offset, object_size=d.size,
                         min_time=span.min_time, max_time=span.max_time, index=tuple(index[j:k])))
    return out


async def _footer(store: ObjectStore, stored: Stored, d: ObjectDescriptor) -> Footer:
    return await read_footer(store, object_key(stored.namespace, stored.short, d.object_id))


def at_least(parts: list[Chunk], wanted: int | None) -> list[Chunk]:
    """minPartitions: halve the piece with the most offsets, at its middle index entry (an object piece),
    else at its middle offset, until there are `wanted` pieces or none has two offsets left."""
    if wanted is None:
        return parts
    parts = list(parts)
    while len(parts) < wanted:
        order = sorted(range(len(parts)), key=lambda i: parts[i].from_offset - parts[i].to_offset)
        for i in order:
            halves = _halve(parts[i])
            if halves is not None:
                parts[i:i + 1] = halves
                break
        else:
            return parts
    return parts


def _halve(c: Chunk) -> tuple[Chunk, Chunk] | None:
    if c.object_id is None:
        if c.to_offset - c.from_offset < 2:
            return None
        mid = (c.from_offset + c.to_offset) // 2
        return replace(c, to_offset=mid), replace(c, from_offset=mid)
    inner = [e for e in c.index if c.from_offset < e[0] < c.to_offset]
    if not inner:
        # No index entry inside: both halves fetch the same bytes and keep their own offsets. Spark's work
        # per row (the conversion to its rows) dominates the fetch, so the split still spreads the load.
        if c.to_offset - c.from_offset < 2:
            return None
        mid = (c.from_offset + c.to_offset) // 2
        return replace(c, to_offset=mid), replace(c, from_offset=mid)
    offset, position = inner[len(inner) // 2]
    return (replace(c, to_offset=offset, byte_high=position,
                    index=tuple(e for e in c.index if e[0] < offset)),
            replace(c, from_offset=offset, byte_low=position, indexed_offset=offset,
                    index=tuple(e for e in c.index if e[0] >= offset)))


class CommittedOffsets:
    """(start, next) of a topic from the broker serving it: FastReader.Offsets (danube_fast.client.reader)."""

    def __init__(self, timeout: float, credentials: Credentials | None = None) -> None:
        self._timeout = timeout
        self._credentials = credentials

    async def __call__(self, broker: str, topic: str) -> tuple[int, int] | None:
        from danube_fast.access.brokers import TopicReader

        try:
            async with TopicReader(broker, credentials=self._credentials) as reader:
                return await asyncio.wait_for(reader.offsets(topic), self._timeout)
        except Exception as e:
            log.warning("%s: cannot ask broker %s for its committed offset: %s", topic, broker, e)
            return None


class OpenCommittedOffsets(CommittedOffsets):
    """CommittedOffsets over one TopicReader per broker kept open until `close()`, for a stream that asks
    at every micro-batch (a reader reconnects by itself after its broker restarts). Owner: the event loop
    that first calls it."""

    def __init__(self, timeout: float, credentials: Credentials | None = None) -> None:
        super().__init__(timeout, credentials)
        self._readers: dict[str, TopicReader] = {}  # by host:port

    async def __call__(self, broker: str, topic: str) -> tuple[int, int] | None:
        from danube_fast.access.brokers import TopicReader

        reader = self._readers.get(broker)
        if reader is None:
            reader = self._readers[broker] = TopicReader(broker, credentials=self._credentials)
        try:
            return await asyncio.wait_for(reader.offsets(topic), self._timeout)
        except Exception as e:
            log.warning("%s: cannot ask broker %s for its committed offset: %s", topic, broker, e)
            return None

    async def close(self) -> None:
        readers, self._readers = list(self._readers.values()), {}
        for reader in readers:
            await reader.close()


async def plan(meta: MetadataReader, store: ObjectStore, options: Options, committed_of: CommittedOffsets,
               bounds: Bounds) -> list[Chunk]:
    """Every chunk of the query, in topic, partition and offset order, within the pushed filters' bounds."""
    if bounds.empty:
        return []
    stored = [s for s in await stored_topics(meta, options)
              if (bounds.topics is None or s.topic in bounds.topics) and
              (bounds.partitions is None or s.partition in bounds.partitions)]
    brokers = await owners(meta, stored)
    out: list[Chunk] = []
    for s in stored:
        descriptors = await load_descriptors(meta, s.namespace, s.short)
        broker = brokers.get(s.name, "")
        committed = None
        if options.ending != "uploaded" or options.starting == "latest":
            committed = await committed_of(broker, s.name) if broker else None
        span = narrow(resolve(s, descriptors, committed, options), bounds)
        out.extend(await chunks(span, descriptors, store, broker, options))
    return sized(out, options)


def sized(parts: list[Chunk], options: Options) -> list[Chunk]:
    """`parts` cut to maxRecordsPerPartition offsets each, then split further to reach minPartitions."""
    if options.max_records_per_partition is not None:
        parts = [piece for c in parts for piece in _at_most(c, options.max_records_per_partition)]
    return at_least(parts, options.min_partitions)


def _at_most(c: Chunk, limit: int) -> list[Chunk]:
    """maxRecordsPerPartition where the object's index is too sparse to split at: pieces of `limit` offsets
    over the same bytes (each keeps its own offsets)."""
    if c.to_offset - c.from_offset <= limit:
        return [c]
    return [replace(c, from_offset=low, to_offset=min(low + limit, c.to_offset))
            for low in range(c.from_offset, c.to_offset, limit)]


def narrow(span: Span, bounds: Bounds) -> Span:
    """`span` within the pushed filters' offsets and times."""
    start = max(span.start, bounds.min_offset)
    end = span.end if bounds.max_offset is None else min(span.end, bounds.max_offset)
    lo = [t for t in (span.min_time, bounds.min_time) if t is not None]
    hi = [t for t in (span.max_time, bounds.max_time) if t is not None]
    return Span(span.stored, start, max(start, end), max(lo) if lo else None, min(hi) if hi else None)



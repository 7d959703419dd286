"""`spark.readStream.format("danube")`: micro-batches of exactly the records between two offsets.

Offsets, as Spark writes them to the checkpoint's offset log: one JSON object mapping every stored topic (a
topic, or one `-part-N` partition of a partitioned topic) to the next offset to read,
`{"/default/orders": 1200, "/default/clicks-part-0": 37, "/default/clicks-part-1": 41}`, keys sorted. A
stored topic without an entry starts at 0, so a partition or a topicPattern match that appears after the
stream started is read from its beginning.

A micro-batch reads [start[t], end[t]) of every stored topic t:
- `initialOffset`: startingOffsets resolved against what is stored (plan.resolve), for a new query only;
  Spark restarts a query from its checkpoint instead.
- `latestOffset(start, limit)`: each topic's committed next offset now, from the broker serving it
  (FastReader.Offsets; the object tier's uploaded end, never below start, when that broker cannot be
  reached), cut to maxOffsetsPerTrigger offsets in all topics together (Spark's ReadMaxRows), shared fairly
  between the topics that have records to read, and to the offsets of the query's start under
  Trigger.AvailableNow.
- `partitions(start, end)`: plan.chunks of those offsets (object pieces, the tail from the broker), read by
  fetch.read_chunk as the batch reader's are. They depend on start and end alone, so a batch Spark runs
  again after a restart (its offsets are in the checkpoint) reads the same records. startingTimestamp
  keeps the rows published at or after it in every batch; maxRecordsPerPartition and minPartitions size
  each batch's partitions.
- `commit`: nothing. The reader writes nothing anywhere (no subscription, no cursor): Spark's checkpoint
  is the only record of how far the query read.

Data loss (failOnDataLoss): offsets of a batch that are no longer stored (a start below a topic's first
stored offset, a topic deleted), or a topic whose committed offset went back below the start (deleted and
created again): the batch fails with an error naming the topic and the offsets when true; when false a
warning is logged and the batch reads what is stored (a topic that went back from its first offset).

Owner: the Python process Spark keeps on the driver for the query (pyspark.sql.streaming.
python_streaming_source_runner) calls every method but `read` from one thread; the metadata reader, object
store and broker readers opened there stay open, on one private event loop, until `stop()`. `read` runs on
executors, on a copy of the reader pickled before anything was opened.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from danube_fast.access.metadata import MetadataReader, ObjectDescriptor, open_reader
from danube_fast.access.objects import ObjectStore, load_descriptors, open_object_store
from pyspark_danube import columns
from pyspark_danube.fetch import DataLossError, read_chunk
from pyspark_danube.options import OptionError, Options
from pyspark_danube.plan import (
    Chunk,
    OpenCommittedOffsets,
    Span,
    Stored,
    chunks,
    owners,
    resolve,
    sized,
    stored_topics,
)

log = logging.getLogger("pyspark_danube")

T = TypeVar("T")
Offsets = dict[str, int]  # stored topic -> the next offset to read


class DanubeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads the records of Danube topics as a stream; see README, Spark, and the module docstring."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        if opts.ending_timestamp is not None:
            raise OptionError("option endingTimestamp is for batch queries; a stream reads on "
                              "(maxOffsetsPerTrigger bounds a micro-batch)")
        self.options = opts
        self.schema = schema
        self._session: _Session | None = None  # opened by the first call on the driver
        self._target: Offsets | None = None  # Trigger.AvailableNow: the latest offsets when the query began
        self._latest: Offsets | None = None  # the latest offsets last seen, uncut, for the query's progress

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_session": None}  # an event loop and connections stay where they are

    def initialOffset(self) -> Offsets:
        return self._run(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        cap = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if cap is None else ReadMaxRows(cap)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._run(lambda s: self._latest_now(s, {}))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> Offsets:
        now = self._run(lambda s: self._latest_now(s, start))
        self._latest = now
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return next_end(start, now, cap, self._target)

    def reportLatestOffset(self) -> Offsets | None:
        return self._latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return self._run(lambda s: self._partitions(s, start, end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, Chunk):
            return iter(())
        return read_chunk(partition, columns.arrow_schema(self.schema))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the reader keeps no position anywhere but in Spark's checkpoint."""

    def stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()

    # -- on the driver ---------------------------------------------------------------------------------

    def _run(self, work: Callable[[_Session], Awaitable[T]]) -> T:
        if self._session is None:
            self._session = _Session(self.options)
        return self._session.run(work)

    async def _initial(self, s: _Session) -> Offsets:
        stored = await stored_topics(s.meta, self.options)
        committed = await s.committed_of(stored)
        out = {}
        for st in stored:
            descriptors = await load_descriptors(s.meta, st.namespace, st.short)
            known = committed.get(st.name)
            if known is None:
                known = _object_tier(descriptors)
                log.warning("%s: the broker serving it did not answer: startingOffsets resolved against the "
                            "object tier alone, which ends at offset %d", st.name, known[1])
            out[st.name] = resolve(st, descriptors, known, self.options).start
        return dict(sorted(out.items()))

    async def _latest_now(self, s: _Session, start: dict[str, Any]) -> Offsets:
        """Each stored topic's committed next offset; the uploaded end, never below its start, for a topic
        whose broker cannot be reached."""
        stored = await stored_topics(s.meta, self.options)
        committed = await s.committed_of(stored)
        out = {}
        for st in stored:
            known = committed.get(st.name)
            if known is not None:
                out[st.name] = known[1]
            else:
                uploaded = _object_tier(await load_descriptors(s.meta, st.namespace, st.short))[1]
                out[st.name] = max(int(start.get(st.name, 0)), uploaded)
        return dict(sorted(out.items()))

    async def _partitions(self, s: _Session, start: dict[str, Any], end: dict[str, Any]) -> list[Chunk]:
        wanted = {name: (int(start.get(name, 0)), int(e)) for name, e in end.items()
                  if int(e) != int(start.get(name, 0))}
        if not wanted:
            return []
        stored = {st.name: st for st in await stored_topics(s.meta, self.options)}
        brokers = await owners(s.meta, [stored[name] for name in wanted if name in stored])
        out: list[Chunk] = []
        for name, (low, high) in sorted(wanted.items()):
            st = stored.get(name)
            if st is None:
                self._lost(f"{name}: offsets {low}..{high - 1} are no longer stored: the topic is gone",
                           "without them")
                continue
            if high < low:
                self._lost(f"{name}: its committed offset went back from {low} to {high} (was the topic "
                           "deleted and created again?)", "from its first offset")
                low = 0
            descriptors = await load_descriptors(s.meta, st.namespace, st.short)
            broker = brokers.get(name, "")
            first = await _first_stored(s, st, broker, descriptors, low)
            if low < first:
                self._lost(f"{name}: offsets {low}..{first - 1} are no longer stored", f"from offset {first}")
                low = first
            if low < high:
                span = Span(st, low, high, self.options.starting_timestamp, None)
                out.extend(await chunks(span, descriptors, s.store, broker, self.options))
        return sized(out, self.options)

    def _lost(self, what: str, then: str) -> None:
        """Data loss: an error saying `what` (failOnDataLoss), or a warning and the stream goes on `then`."""
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{what}; set failOnDataLoss=false to go on {then}")
        log.warning("%s; going on %s (failOnDataLoss=false)", what, then)


def next_end(start: dict[str, Any], latest: Offsets, cap: int | None,
             target: Offsets | None = None) -> Offsets:
    """The end offsets of the next micro-batch: each topic's `latest`, cut to `target` (Trigger.AvailableNow)
    and, together, to `cap` offsets (maxOffsetsPerTrigger) shared by fair_share. A topic absent from `start`
    begins at 0, and so does one whose latest went below its start (partitions() reports that as data
    loss); one absent from `latest` (gone) stays at its start, one absent from `target` (new since the
    query began) is left for a later query."""
    begin = {t: 0 if n < int(start.get(t, 0)) else int(start.get(t, 0)) for t, n in latest.items()}
    top = dict(latest)
    if target is not None:
        top = {t: max(begin[t], min(n, target[t])) for t, n in latest.items() if t in target}
    available = {t: top[t] - begin[t] for t in top}
    taken = available if cap is None else fair_share(available, cap)
    end = {t: int(n) for t, n in start.items()}
    for t in top:
        if t in start or taken[t] > 0:  # a new topic gets an entry once it has something to read
            end[t] = begin[t] + taken[t]
    return dict(sorted(end.items()))


def fair_share(available: dict[str, int], cap: int) -> dict[str, int]:
    """At most `cap` offsets in all, shared max-min fairly: every topic gets an equal share, a topic that
    needs less leaves the rest to the others; the last few offsets that cannot be shared equally go one each
    to the topics with the most left to read (by name among equals), so no topic waits for ever."""
    taken = dict.fromkeys(available, 0)
    wanting = {t: n for t, n in available.items() if n > 0}
    left = cap
    while wanting and left >= len(wanting):
        each = left // len(wanting)
        for t, n in list(wanting.items()):
            got = min(n, each)
            taken[t] += got
            left -= got
            if got == n:
                del wanting[t]
            else:
                wanting[t] = n - got
    for t in sorted(wanting, key=lambda t: (-wanting[t], t))[:left]:
        taken[t] += 1
    return taken


def _object_tier(descriptors: list[ObjectDescriptor]) -> tuple[int, int]:
    """(first, next) of the offsets in the object tier; (0, 0) when it holds nothing."""
    end = max((d.end_offset + 1 for d in descriptors), default=0)
    return min((d.start_offset for d in descriptors), default=end), end


async def _first_stored(s: _Session, st: Stored, broker: str, descriptors: list[ObjectDescriptor],
                        low: int) -> int:
    """The first offset of `st` still stored, as far as it matters for reading from `low`: the object tier
    answers when it holds `low`; otherwise the broker (the tiers it reads); `low` when neither knows."""
    first = descriptors[0].start_offset if descriptors else None
    if first is None or low < first:
        known = (await s.committed_of([st], {st.name: broker})).get(st.name)
        if known is not None:
            first = known[0] if first is None else min(first, known[0])
    return low if first is None else first


class _Session:
    """What the driver keeps open between micro-batches: a private event loop, the metadata reader, the
    object store and the broker readers. Owner: the thread that calls `run`."""

    def __init__(self, opts: Options) -> None:
        self.options = opts
        self.loop = asyncio.new_event_loop()
        self._meta: MetadataReader | None = None
        self._store: ObjectStore | None = None
        self._committed = OpenCommittedOffsets(opts.broker_timeout, opts.credentials)

    @property
    def meta(self) -> MetadataReader:
        assert self._meta is not None, "opened by run()"
        return self._meta

    @property
    def store(self) -> ObjectStore:
        assert self._store is not None, "opened by run()"
        return self._store

    def run(self, work: Callable[[_Session], Awaitable[T]]) -> T:
        return self.loop.run_until_complete(self._opened(work))

    async def _opened(self, work: Callable[[_Session], Awaitable[T]]) -> T:
        if self._meta is None:
            self._meta = await open_reader(self.options.metadata_store, access=self.options.etcd)
        if self._store is None:
            opts = self.options
            self._store = await open_object_store(
                opts.object_store, **(opts.s3.kwargs() if opts.object_store.startswith("s3://") else {}))
        return await work(self)

    async def committed_of(self, stored: list[Stored], brokers: dict[str, str] | None = None
                           ) -> dict[str, tuple[int, int]]:
        """(start, next) of each stored topic whose serving broker answers, asked at once."""
        if brokers is None:
            brokers = await owners(self.meta, stored)
        asked = [st.name for st in stored if brokers.get(st.name)]
        answers = await asyncio.gather(*(self._committed(brokers[name], name) for name in asked))
        return {name: answer for name, answer in zip(asked, answers, strict=True) if answer is not None}

    def close(self) -> None:
        async def closing() -> None:
            await self._committed.close()
            if self._store is not None:
                await self._store.close()
            if self._meta is not None:
                await self._meta.close()

        try:
            self.loop.run_until_complete(closing())
        finally:
            self.loop.close()

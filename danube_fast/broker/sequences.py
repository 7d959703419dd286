"""Idempotent produce on a Reliable topic: a sequenced batch (docs/FORMAT.md#sequenced-batches) that the topic
already stored, or is storing, is not stored again; its sender gets the offsets of the first copy.

Per producer name the topic keeps the session it last used and the outcomes of that session's last WINDOW
sequences: a future while the append runs, then (first offset, last offset, records). A batch whose
(session, sequence) is among them is a retry; one far below them (WINDOW sequences or more under the highest)
is refused, since the topic can no longer tell whether it was stored; a new session starts afresh. Sequences
may arrive out of order within the window (a client may ship batches in a different order than it numbered
them).

The table is rebuilt once per topic, before its first producer of the fast API is answered (`ready`), from the
sequenced batches of the WAL's last two segments: a retry after a broker restart or crash finds the first copy
there. Topics that only the Danube API publishes to never read them. Not covered yet: a topic
moved to another broker in cluster mode starts with an empty table (its new owner has no local WAL), so a
retry across a move may be stored twice (docs/ARCHITECTURE.md, "Idempotent produce").

Owner: the ReliableTopic, on the event loop; only the fast API's Produce handler calls `publish`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from danube_fast import frames
from danube_fast.broker.errors import ApiError
from danube_fast.storage.wal import Wal

Outcome = tuple[int, int, int]  # first offset, last offset, records
WINDOW = 1024  # sequences remembered per producer: far above what one producer has in flight (64 batches)
SCAN_READ_BYTES = 8 * 1024 * 1024


@dataclass
class _Producer:
    session: int
    highest: int = 0
    outcomes: OrderedDict[int, asyncio.Future[Outcome] | Outcome] = field(default_factory=OrderedDict)

    def remember(self, sequence: int, outcome: asyncio.Future[Outcome] | Outcome) -> None:
        self.outcomes[sequence] = outcome
        self.highest = max(self.highest, sequence)
        while len(self.outcomes) > WINDOW:
            self.outcomes.popitem(last=False)


class ProducerSequences:
    def __init__(self) -> None:
        self._producers: dict[str, _Producer] = {}
        self._rebuilt: asyncio.Future[int] | None = None
        self.duplicates = 0  # batches answered from a first copy instead of stored again

    async def ready(self, wal: Wal) -> None:
        """Return once the table holds what `wal` holds (the first call rebuilds it; the others wait for
        that; a failed rebuild is tried again by the next call)."""
        if self._rebuilt is None or (self._rebuilt.done() and self._rebuilt.exception() is not None):
            self._rebuilt = asyncio.ensure_future(self._rebuild(wal))
        await asyncio.shield(self._rebuilt)

    def publish(self, name: str, session: int, sequence: int,
                append: Callable[[], Awaitable[Outcome]]) -> asyncio.Future[Outcome]:
        """The outcome of sequenced batch (session, sequence) of producer `name`: the first copy's when it
        was seen, else that of `append()` (started here, at once, so that appends keep the order of calls)."""
        producer = self._producers.get(name)
        if producer is None or producer.session != session:
            producer = self._producers[name] = _Producer(session)
        known = producer.outcomes.get(sequence)
        loop = asyncio.get_running_loop()
        if known is not None:
            self.duplicates += 1
            if isinstance(known, tuple):
                done: asyncio.Future[Outcome] = loop.create_future()
                done.set_result(known)
                return done
            return asyncio.ensure_future(_same(known))
        if sequence + WINDOW <= producer.highest:
            failed: asyncio.Future[Outcome] = loop.create_future()
            failed.set_exception(ApiError(
                "FAILED_PRECONDITION",
                f"batch {sequence} of producer {name!r} (session {session}) is too old to tell whether it "
                f"was stored: the topic remembers sequences above {producer.highest - WINDOW}"))
            return failed
        future = asyncio.ensure_future(append())
        producer.remember(sequence, future)
        future.add_done_callback(lambda f: self._settled(producer, sequence, f))
        return future

    @staticmethod
    def _settled(producer: _Producer, sequence: int, future: asyncio.Future[Outcome]) -> None:
        """Keep the offsets of a stored batch; forget a failed one (its retry is stored as new)."""
        if producer.outcomes.get(sequence) is not future:
            return  # forgotten meanwhile (the window moved on, or a new session replaced the producer)
        if future.cancelled() or future.exception() is not None:
            del producer.outcomes[sequence]
        else:
            producer.outcomes[sequence] = future.result()

    def learn(self, header: frames.BatchHeader) -> None:
        """A sequenced batch found in the WAL (in offset order) while rebuilding."""
        producer = self._producers.get(header.producer_name)
        if producer is None or producer.session != header.session:
            producer = self._producers[header.producer_name] = _Producer(header.session)
        producer.remember(header.sequence, (header.base_offset, header.last_offset, header.record_count))

    async def _rebuild(self, wal: Wal) -> int:
        """Learn the sequenced batches of the WAL's last two segments; the batches read."""
        bases = wal.segment_bases
        offset = max(bases[-2] if len(bases) > 1 else (bases[0] if bases else 0), wal.start_offset)
        seen = 0
        while offset < wal.committed_offset:
            got = await wal.read(offset, SCAN_READ_BYTES)
            if got is None:
                break
            data, offset = got
            for header in frames.scan_batches(data, verify=False):
                seen += 1
                if header.session:
                    self.learn(header)
        return seen


async def _same(first: asyncio.Future[Outcome]) -> Outcome:
    """The first copy's outcome, for a retry that came while it was being stored (not cancelled with it)."""
    return await asyncio.shield(first)

"""Idempotent produce on a Reliable topic: a sequenced batch (docs/FORMAT.md#sequenced-batches) that the topic
already stored, or is storing, is not stored again; its sender gets the offsets of the first copy.

Per producer name the topic keeps the session it last used and the outcomes of that session's last WINDOW
sequences: a future while the append runs, then (first offset, last offset, records), kept in arrays indexed
by sequence modulo WINDOW (8 KB per producer, so that 10,000 topics with a producer each hold 80 MB, not the
gigabytes a dict of tuples would). A batch whose (session, sequence) is among them is a retry; one far below
them (WINDOW sequences or more under the highest) is refused, since the topic can no longer tell whether it
was stored (our producer never has that many unacknowledged: client/producer.py); a new session starts
afresh. Sequences may arrive out of order within the window (a client may ship batches in a different order
than it numbered them). A topic keeps the MAX_PRODUCERS producers used last.

Order: a batch refused as retriable before anything of it was stored (too few copies in sync, the topic
moving) makes the later sequences of its session refused the same way until it comes again (for
REFUSED_HOLD_S at most), so that a batch sent after it cannot be stored before it: the client resends from
the refused one, in order. Without this, a copy that came back in sync between two batches of one stream
stored the second and refused the first (Kafka's producer relies on the broker's sequence check likewise).
The check and the refusal both happen in the first step of the append's task, which the loop runs in the
order the batches arrived.

The table is rebuilt once per topic, before its first producer of the fast API is answered (`ready`), from the
sequenced batches of the WAL's last two segments: a retry after a broker restart or crash finds the first copy
there. Topics that only the Danube API publishes to never read them. A topic moved in cluster mode takes its
table along: the old owner puts `snapshot()` (the last CARRY outcomes of the MAX_CARRIED producers used last)
into the sealed state and the new owner `restore`s it before anything is published; when the old owner's
table was complete (rebuilt, or carried complete in turn: the snapshot says so) the new owner reads nothing
more. A topic moved after its
owner crashed has no sealed state: what the dead owner stored last sits in a gap (storage/gaps.py) until that
broker, restarted, recovers it into the object tier. So with an object tier `ready` also learns the tier's
last TIER_SCAN_BYTES below the WAL (what earlier owners stored, recovered gaps included: a topic can pass
through several owners, crashed or not, between a batch and its retry), after waiting for the open gaps up to
`[cluster] producer_gap_wait_ms`; a dead owner that stays away longer costs idempotence for the retries of
what it stored, not availability (docs/ARCHITECTURE.md, "Idempotent produce").

Owner: the ReliableTopic, on the event loop; only the fast API's Produce handler calls `publish`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections.abc import Awaitable, Callable
from typing import TypeGuard

from danube_fast.codec import frames
from danube_fast.errors import ApiError, DanubeError, StorageError, unavailable
from danube_fast.meta.resources import JSON
from danube_fast.storage.gaps import RecoveryPending, open_gaps
from danube_fast.storage.tiered import TopicLog
from danube_fast.storage.wal import Buffer, Wal

log = logging.getLogger("danube_fast.broker")

Outcome = tuple[int, int, int]  # first offset, last offset, records
Confirm = Callable[[Outcome], Awaitable[None]]  # raises unless a stored outcome may be acknowledged now
Append = Callable[[Callable[[int, int], None]], Awaitable[Outcome]]  # append(stored): see publish
WINDOW = 256  # sequences remembered per producer: twice what our producer may have unacknowledged
MAX_PRODUCERS = 1024  # producers remembered per topic (the ones used last)
SCAN_READ_BYTES = 8 * 1024 * 1024
CARRY = 64  # outcomes per producer a move carries: what one producer stream may have in flight
COMPLETE = ""  # the snapshot's mark of a complete table (no producer is named "": names.check_name)
MAX_CARRIED = 128  # producers a move carries (the sealed state is one metadata value: ~1.3 KB per producer)
GAP_POLL_S = 0.5  # how often `ready` looks whether a dead owner recovered its gap
TIER_SCAN_BYTES = 16 * 1024 * 1024  # of the object tier's tail `ready` learns (a retry comes soon after)
REFUSED_HOLD_S = 60.0  # longer than our producer retries a batch (client/producer.py: about 25 s)


class _Producer:
    """One producer session's last WINDOW outcomes: stored ones in the arrays (slot = sequence % WINDOW,
    `sequences[slot]` says which one it holds, 0 none), appends in progress in `pending`."""

    def __init__(self, session: int) -> None:
        self.session = session
        self.highest = 0
        self.newest = -1  # the highest offset of a stored outcome: which of two sessions came last
        self.sequences = array("Q", bytes(8 * WINDOW))
        self.outcomes = array("Q", bytes(24 * WINDOW))  # first, last, records per slot
        self.pending: dict[int, asyncio.Future[Outcome]] = {}
        self.refused: tuple[int, float] | None = None  # (sequence, when): refused with nothing stored

    def known(self, sequence: int) -> asyncio.Future[Outcome] | Outcome | None:
        if sequence in self.pending:
            return self.pending[sequence]
        return self.outcome(sequence)

    def outcome(self, sequence: int) -> Outcome | None:
        """The stored outcome of `sequence`, if the window still holds it."""
        slot = sequence % WINDOW
        if self.sequences[slot] != sequence:
            return None
        return self.outcomes[3 * slot], self.outcomes[3 * slot + 1], self.outcomes[3 * slot + 2]

    def remember(self, sequence: int, outcome: Outcome) -> None:
        slot = sequence % WINDOW
        if self.sequences[slot] > sequence:
            return  # the slot holds a later sequence: this one is below the window already
        self.sequences[slot] = sequence
        self.outcomes[3 * slot:3 * slot + 3] = array("Q", outcome)
        self.highest = max(self.highest, sequence)
        self.newest = max(self.newest, outcome[1])

    def stored(self) -> list[JSON]:
        """[[sequence, first, last, records], ...] of the stored outcomes, oldest first."""
        slots = sorted((seq, slot) for slot, seq in enumerate(self.sequences) if seq)
        return [[seq, *self.outcomes[3 * slot:3 * slot + 3]] for seq, slot in slots]


class ProducerSequences:
    def __init__(self) -> None:
        self._producers: dict[str, _Producer] = {}
        self._rebuilt: asyncio.Future[int] | None = None
        self._tier: tuple[TopicLog, float] | None = None
        self._carried = False  # restored from a sealed move of a complete table: nothing to rebuild
        self.duplicates = 0  # batches answered from a first copy instead of stored again

    def with_tier(self, log: TopicLog, gap_wait: float) -> None:
        """The topic has an object tier: `ready` learns its tail below the WAL too, after waiting up to
        `gap_wait` seconds for the open gaps of `log` (a GapAwareLog) to be recovered."""
        self._tier = (log, gap_wait)

    async def ready(self, wal: Wal) -> None:
        """Return once the table holds what `wal` holds, and the tail of the tier of `with_tier` (the first
        call rebuilds it; the others wait for that; a failed rebuild is tried again by the next call), at
        once for a table a sealed move carried."""
        if self._carried:
            return
        if self._rebuilt is None or (self._rebuilt.done() and self._rebuilt.exception() is not None):
            self._rebuilt = asyncio.ensure_future(self._rebuild(wal))
        await asyncio.shield(self._rebuilt)

    def publish(self, name: str, session: int, sequence: int, append: Append,
                confirm: Confirm) -> asyncio.Future[Outcome]:
        """The outcome of sequenced batch (session, sequence) of producer `name`: the first copy's when it
        was seen (once `confirm(outcome)` says it may be acknowledged: on enough copies, this broker still
        the owner), else that of `append(stored)`
        (started here, at once, so that appends keep the order of calls). `append` calls `stored(first, last)`
        as soon as the batch is in the log: a batch stored whose acknowledgement then failed (the fence could
        not confirm the ownership in time) is a first copy all the same, and its retry must find it."""
        producer = self._producers.pop(name, None)  # re-inserted: the dict's order is the order of use
        if producer is None or producer.session != session:
            producer = _Producer(session)
        self._producers[name] = producer
        if len(self._producers) > MAX_PRODUCERS:
            del self._producers[next(iter(self._producers))]
        known = producer.known(sequence)
        loop = asyncio.get_running_loop()
        if known is not None:
            self.duplicates += 1
            if isinstance(known, tuple):
                return asyncio.ensure_future(_confirmed(known, confirm))
            return asyncio.ensure_future(_same(known, lambda: producer.outcome(sequence), confirm))
        if sequence + WINDOW <= producer.highest:
            failed: asyncio.Future[Outcome] = loop.create_future()
            failed.set_exception(ApiError(
                "FAILED_PRECONDITION",
                f"batch {sequence} of producer {name!r} (session {session}) is too old to tell whether it "
                f"was stored: the topic remembers sequences above {producer.highest - WINDOW}"))
            return failed
        future = asyncio.ensure_future(self._in_order(name, producer, sequence, append))
        producer.pending[sequence] = future
        producer.highest = max(producer.highest, sequence)
        future.add_done_callback(lambda f: self._settled(producer, sequence, f))
        return future

    @staticmethod
    async def _in_order(name: str, producer: _Producer, sequence: int, append: Append) -> Outcome:
        """`append`, unless an earlier sequence of the session was refused and has not come again."""
        if producer.refused is not None:
            first, since = producer.refused
            if sequence > first and time.monotonic() - since < REFUSED_HOLD_S:
                raise unavailable(f"batch {first} of producer {name!r} was refused: the batches after it are "
                                  f"refused too until it is sent again, so that they are stored in order")
            producer.refused = None  # it came again (or an earlier one did), or the client gave it up
        def stored(first: int, last: int) -> None:
            producer.remember(sequence, (first, last, last - first + 1))

        try:
            return await append(stored)
        except DanubeError as e:
            if e.retriable and producer.outcome(sequence) is None and \
                    (producer.refused is None or sequence < producer.refused[0]):
                producer.refused = (sequence, time.monotonic())
            raise

    @staticmethod
    def _settled(producer: _Producer, sequence: int, future: asyncio.Future[Outcome]) -> None:
        """The append is over: what it stored was remembered by `stored`; one that failed before storing
        anything is forgotten (its retry is stored as new)."""
        del producer.pending[sequence]

    def learn(self, header: frames.BatchHeader) -> None:
        """A sequenced batch found in the WAL or a recovered gap while rebuilding. A session replaces the
        one the table holds only if it came later (by offset), whatever order the batches are learnt in."""
        producer = self._producers.get(header.producer_name)
        if producer is None or producer.session != header.session:
            if producer is not None and producer.newest > header.base_offset:
                return
            producer = self._producers[header.producer_name] = _Producer(header.session)
        producer.remember(header.sequence, (header.base_offset, header.last_offset, header.record_count))

    def snapshot(self) -> JSON:
        """What a move carries: `{name: [session, [[sequence, first, last, records], ...]]}`, stored outcomes
        only (a move drains every append first), and `COMPLETE: 1` when the table knows the topic's tail
        (it was rebuilt, or carried complete in turn): the next owner then reads nothing more."""
        out: dict[str, JSON] = {}
        rebuilt = self._rebuilt
        if self._carried or (rebuilt is not None and rebuilt.done() and not rebuilt.cancelled()
                             and rebuilt.exception() is None):
            out[COMPLETE] = 1
        for name in list(self._producers)[-MAX_CARRIED:]:
            producer = self._producers[name]
            done = producer.stored()
            if done:
                out[name] = [producer.session, done[-CARRY:]]
        return out

    def restore(self, carried: JSON) -> None:
        """Take a `snapshot()` from the sealed state; anything malformed in it is left out (the metadata is
        checked, not trusted: a bad entry costs only idempotence, never a refusal)."""
        if not isinstance(carried, dict):
            return
        # The old owner drained every append and knew its own tail (rebuilt, or carried complete in turn):
        # the first producer after the move is answered without reading the WAL's last segments and the
        # tier's tail (a few hundred ms on a full WAL, every move). An owner that never rebuilt (no fast
        # producer came while it owned the topic) carries no such mark: what a dead owner before it stored
        # is learnt from the tier as after a crash.
        self._carried = carried.get(COMPLETE) == 1
        for name, value in carried.items():
            if not (isinstance(value, list) and len(value) == 2):
                continue
            session, entries = value
            if not (_u64(session) and isinstance(entries, list)):
                continue
            producer = self._producers[name] = _Producer(session)
            for entry in entries:
                if isinstance(entry, list) and len(entry) == 4:
                    seq, first, last, records = entry
                    if _u64(seq) and _offset(first) and _offset(last) and _u64(records):
                        producer.remember(seq, (first, last, records))

    async def _rebuild(self, wal: Wal) -> int:
        """Learn the sequenced batches of the tier's tail, then of the WAL's last two segments; the batches
        read."""
        seen = await self._learn_tier(wal) if self._tier is not None else 0
        bases = wal.segment_bases
        offset = max(bases[-2] if len(bases) > 1 else (bases[0] if bases else 0), wal.start_offset)
        while offset < wal.committed_offset:
            got = await wal.read(offset, SCAN_READ_BYTES)
            if got is None:
                break
            data, offset = got
            seen += self._learn_all(data)
        return seen

    async def _learn_tier(self, wal: Wal) -> int:
        """Wait for the open gaps to be recovered (or for the wait to end), then learn the batches of the
        tier's last TIER_SCAN_BYTES below the WAL; a gap still open is passed over."""
        assert self._tier is not None
        tier_log, wait = self._tier
        cloud = tier_log.cloud
        if cloud is None:
            return 0
        gaps = list(tier_log.gaps)
        deadline = time.monotonic() + wait
        while True:
            await cloud.refresh()
            still = open_gaps(gaps, cloud.descriptors)
            if not still or time.monotonic() >= deadline:
                break
            await asyncio.sleep(GAP_POLL_S)
        if still:
            log.warning("%s/%s: broker %d did not recover offsets %d..%d in %.0f s; a retry of an idempotent "
                        "producer's batch stored there may be stored again", cloud.namespace, cloud.topic,
                        still[0][2], still[0][0], still[0][1], wait)
        below = [d for d in cloud.descriptors if d.end_offset < wal.start_offset]
        offset, held = wal.start_offset, 0
        for d in reversed(below):
            if held >= TIER_SCAN_BYTES:
                break
            offset, held = d.start_offset, held + d.size
        seen = 0
        while offset < wal.start_offset:
            try:
                got = await tier_log.read(offset, SCAN_READ_BYTES)
            except RecoveryPending:  # a gap still open (its wait is over): nothing there to learn
                offset = next((g[1] + 1 for g in still if g[0] <= offset <= g[1]), wal.start_offset)
                continue
            except StorageError as e:  # the object store away: tried until the wait ends, then passed over
                if not e.retriable or time.monotonic() >= deadline:
                    log.warning("%s/%s: the object tier could not be read from offset %d (%s); a retry of an "
                                "idempotent producer's batch stored there may be stored again",
                                cloud.namespace, cloud.topic, offset, e)
                    break
                await asyncio.sleep(GAP_POLL_S)
                continue
            if got is None:
                break
            data, offset = got
            seen += self._learn_all(data)
        return seen

    def _learn_all(self, data: Buffer) -> int:
        headers = frames.scan_batches(data, verify=False)
        for header in headers:
            if header.session:
                self.learn(header)
        return len(headers)


def _u64(value: object) -> TypeGuard[int]:
    """A positive u64 (sessions, sequences and record counts are never 0)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 64


def _offset(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 64


async def _confirmed(outcome: Outcome, confirm: Confirm) -> Outcome:
    """A stored first copy's outcome, acknowledged only as the first copy would be: its records on enough
    copies (a first copy whose acknowledgement failed because its follower fell out of sync is not), and the
    fence confirming."""
    await confirm(outcome)
    return outcome


async def _same(first: asyncio.Future[Outcome], stored: Callable[[], Outcome | None],
                confirm: Confirm) -> Outcome:
    """The outcome of a first copy being appended, for its retry (not cancelled with it): the first copy's
    acknowledgement, or, when that failed after the batch was stored, the stored offsets once confirmed."""
    try:
        return await asyncio.shield(first)
    except Exception:
        known = stored()
        if known is None:
            raise
        return await _confirmed(known, confirm)

"""A replicated topic's copies, as its owner keeps track of them (docs/REPLICATION.md).

`ReplicaSet` is the topic's `Replicas` (broker/replicas.py): what its acknowledgements wait for. It learns
what each follower holds from the follower's fetches (each says how far its copy is durable), and keeps
the in-sync set (ISR) by the rules that make a failover lose nothing acknowledged:

- An acknowledgement of a record waits until every follower of the in-memory ISR holds it, and until the
  ISR as written counts `minInSyncReplicas` copies (the owner counts); with fewer in sync in memory the
  send is refused, UNAVAILABLE.
- Readers see records only once every ISR follower holds them: the WAL's line (Wal.hold_visible) is the
  lowest of their ends, so no reader sees a record that a failover to one of them could give to another.
  With no follower in sync the line is lifted: readers see what is durable here.
- The ISR persisted in `/cluster/replicas/{ns}/{topic}` (fenced on the assignment) is what the load
  manager picks a dead owner's successor from, so every broker it names must hold every record
  acknowledged: a follower joins in memory first (acknowledgements start waiting for it), and is written
  as in sync only once it holds everything durable here when it joined; a follower leaves by a write
  first, and acknowledgements stop waiting for it after.
- A follower has caught up to a moment once it holds durably what was durable here then (each response
  remembers that). It leaves the ISR when it has not caught up to any moment within `[cluster]
  replica_lag_ms`, or its broker's registration is gone, or it says it holds less than before; it joins
  when it has caught up to a moment within a quarter of that.
- Followers that leave a written ISR and take it below `minInSyncReplicas` are written as `eligible`:
  nothing is acknowledged until the written ISR is back at the minimum (the write that brings it back
  clears them), so they hold every acknowledged record and may continue the topic too (Kafka's eligible
  leader replicas). Without them, an owner lost after its last follower was partitioned away would leave
  the acknowledged records only on that follower, and no one to take them over.

Owner: the topic's owner broker, on the event loop (`Replication` in manager.py holds one per replicated
topic it serves).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from danube_fast.broker.topic import ReliableTopic
from danube_fast.codec.fast_wire import Buffer
from danube_fast.codec.replication_wire import FetchParts
from danube_fast.errors import unavailable
from danube_fast.meta import keys
from danube_fast.meta.resources import TopicReplicas
from danube_fast.meta.store import Delete, Op, Put, TxnResult
from danube_fast.proto import Replication_pb2 as pb
from danube_fast.storage.objects.format import clip_batches

log = logging.getLogger("danube_fast.replication")

FETCH_BYTES = 4 * 1024 * 1024  # a fetch that names no size
MAX_FETCH_BYTES = 16 * 1024 * 1024
MAX_WAIT_MS = 5000
MAX_SENT = 256  # responses remembered per follower (caught_up_at)
# A send finding too few copies in sync waits this share of replica_lag_ms (at most MAX_ADMIT_WAIT s) for
# them before it is refused: a planned move's new owner has its old owner back in sync in milliseconds.
ADMIT_WAIT = 0.25
MAX_ADMIT_WAIT = 1.0

Write = Callable[[Sequence[Op]], Awaitable[TxnResult]]


@dataclass
class _Follower:
    durable: int = -1  # it holds every record below this durably (as its last fetch said); -1: unknown
    # (when, this WAL's durable end then) of its recent responses: it has caught up to a moment once it
    # holds durably what was durable here then
    sent: deque[tuple[float, int]] = field(default_factory=deque)
    caught_up_at: float = float("-inf")  # the latest such moment
    joined_at: int | None = None  # in the ISR in memory, written as in sync once it holds this much
    regressed: bool = False  # said it holds less than before: it leaves the ISR at the next pass


class ReplicaSet:
    def __init__(self, topic: ReliableTopic, me: int, epoch: int, write: Write, copies: int, needed: int,
                 lag_s: float) -> None:
        """`epoch`: the create revision of this broker's assignment; `write`: the topic's fenced write."""
        self.topic = topic
        self.me = me
        self.epoch = epoch
        self.copies = copies
        self.needed = needed
        self._write = write
        self._lag_s = lag_s
        self._wal = topic.wal
        self._ns, self._t = topic.name.namespace, topic.name.topic
        self.followers: dict[int, _Follower] = {}
        self.isr: set[int] = set()  # followers in the in-memory ISR (the owner is always in sync)
        self.written: TopicReplicas | None = None  # what the metadata says
        self._sent: Counter[str] = Counter()  # record bytes fetched, by transport
        self._ready = asyncio.Event()  # the first write landed: acknowledgements may go out
        self._changed = asyncio.Event()
        self._closed = False
        self._writing = asyncio.Lock()  # one write of the copies at a time, with the memory change it makes
        self._tasks: set[asyncio.Task[None]] = set()
        # The admission of sends (admit): arrival tickets, those waiting, the first ticket not refused
        # with the last refusal, and since when too few copies are in sync.
        self._gate = asyncio.Lock()
        self._arrivals = 0
        self._queued = 0
        self._refused_upto = 0
        self._short_since: float | None = None

    # -- the topic's Replicas ----------------------------------------------------------------------------

    @property
    def wanted(self) -> int:
        return self.copies

    @property
    def in_sync(self) -> int:
        return 1 + len(self.isr)

    @property
    def sent_bytes(self) -> Mapping[str, int]:
        return self._sent

    async def admit(self) -> None:
        """Sends are admitted first come, first served: one that finds too few copies in sync waits (up to
        ADMIT_WAIT of the lag from when they fell short) and holds back those after it; when it is refused,
        so is every send that arrived before that, so that none of them overtakes a refused one (a follower
        back in sync between two sends of one stream must not let the second be stored and the first
        refused: the client resends from the first, and sequences.py holds back what comes after)."""
        ticket = self._arrivals
        self._arrivals += 1
        if not self._queued and (self.in_sync >= self.needed or self._closed):
            return
        self._queued += 1
        try:
            async with self._gate:
                if ticket < self._refused_upto:
                    raise self._too_few()
                await self._await_copies()
                if self.in_sync < self.needed and not self._closed:
                    self._refused_upto = self._arrivals
                    raise self._too_few()
        finally:
            self._queued -= 1

    async def _await_copies(self) -> None:
        """Until enough copies are in sync, or ADMIT_WAIT of the lag (at most MAX_ADMIT_WAIT) after they
        fell short: a follower that just joined a new term, or blinked, is back by then."""
        loop = asyncio.get_running_loop()
        if self._short_since is None:
            self._short_since = loop.time()
        deadline = self._short_since + min(self._lag_s * ADMIT_WAIT, MAX_ADMIT_WAIT)
        while self.in_sync < self.needed and not self._closed and loop.time() < deadline:
            await self._change(deadline)
        if self.in_sync >= self.needed:
            self._short_since = None

    async def _change(self, deadline: float) -> None:
        """Until the next change (a fetch, a write of the copies) or the loop time `deadline`."""
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), deadline - asyncio.get_running_loop().time())

    async def replicated(self, last: int) -> None:
        if not self._ready.is_set():
            await self._ready.wait()
        while True:
            written = self.written
            if self._line() > last and written is not None and len(written.isr) >= self.needed:
                return
            if self._closed:
                # Unloaded, lost, or no longer replicated while it waited: never acknowledged with fewer
                # copies than promised (the topic's fence alone may still pass: a chaos campaign caught an
                # owner back from a pause acknowledging what its follower, taking over, never got).
                raise unavailable(f"{self.topic.full} stopped being replicated here before offset {last} "
                                  f"was on enough copies: send again")
            if 1 + len(self.isr) < self.needed:
                raise self._too_few()
            changed = self._changed
            await changed.wait()

    def _too_few(self) -> Exception:
        return unavailable(f"{self.topic.full} has {1 + len(self.isr)} copies in sync, fewer than its "
                           f"minInSyncReplicas {self.needed}: not stored for sure, send again later")

    def _line(self) -> int:
        """Every record below this is on every copy a failover may continue from."""
        return min([self._wal.durable_offset, *(self.followers[b].durable for b in self._holders())])

    def _holders(self) -> set[int]:
        """The followers a failover may continue from: the in-memory ISR and those written eligible. Readers
        see nothing they lack: an eligible follower taking over continues at its copy's end, and a record
        above it that a reader saw would share its offset with the next one stored there."""
        eligible = self.written.eligible if self.written is not None else ()
        return self.isr | {b for b in eligible if b in self.followers}

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- life ------------------------------------------------------------------------------------------

    async def start(self, followers: Sequence[int]) -> None:
        """Acknowledgements wait for this: the copies are written with this broker alone in sync (a
        follower joins by catching up), so that a successor is never picked from an ISR of an earlier
        term of this topic here."""
        self.topic.replicate(self)
        for b in followers:
            self.followers.setdefault(b, _Follower())
        await self._persist()
        self._ready.set()

    def close(self, release: bool = False) -> None:
        """The topic stops being replicated here (unloaded, lost, or its policy asks for one copy): waiting
        acknowledgements of records not yet on enough copies fail (UNAVAILABLE: the client sends them
        again, and finds them stored). Readers stay held where they were unless `release`: a topic that
        lost its ownership is still read until it is unloaded, and a successor may be continuing it from
        a copy's end (the chaos campaign caught a reader there seeing a record whose offset the successor
        then gave another)."""
        self._closed = True
        if self.topic.replicas is self:
            self.topic.replicate(None)
        if release:
            self._wal.release_visible()
        self._ready.set()
        self._wake()

    async def forget(self) -> None:
        """replicationFactor went to 1: the copies are not wanted any more (the key goes, followers drop
        theirs)."""
        self.close(release=True)
        await self._write([Delete(keys.replicas(self._ns, self._t))])

    async def hand_over(self, timeout: float) -> list[int]:
        """A planned move, after appends stopped: the followers written in sync that hold every record of
        this WAL durably, waiting up to `timeout` for the first (each fetch says how far its copy is).
        Any of them can continue the topic from its copy, with nothing uploaded first. Empty: none got
        there (the move uploads the tail instead)."""
        end = self._wal.durable_offset  # all of it: no append comes any more
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self._closed:
            written = set(self.written.isr) if self.written is not None else set()
            ready = sorted(b for b in self.isr & written if self.followers[b].durable >= end)
            if ready or loop.time() >= deadline:
                return ready
            await self._change(deadline)
        return []

    # -- fetches ---------------------------------------------------------------------------------------

    async def fetch(self, request: pb.FetchRequest, transport: str) -> FetchParts:
        """A follower's fetch: what it holds is learnt, then the records after it (waiting up to wait_ms
        for one). The records are the log's buffers, for the caller to frame."""
        f = self.followers[request.follower_id]
        wal = self._wal
        start = self.start_offset()
        low = request.from_offset
        if low < 0:
            return FetchParts((), start, start, self._uploaded())
        if low < wal.start_offset or low > wal.durable_offset:
            # Below what the WAL keeps, or past its end (this log restarted shorter than a copy of it).
            log.info("%s: the copy of broker %d at %d does not fit this log (%d..%d): it starts again at %d",
                     self.topic.full, request.follower_id, low, wal.start_offset, wal.durable_offset, start)
            return FetchParts((), start, start, self._uploaded(), reset=True)
        self._progress(request.follower_id, f, low, min(request.durable_offset, low))
        wait = min(request.wait_ms, MAX_WAIT_MS) / 1000
        if low >= wal.durable_offset and wait > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wal.wait_durable(low), wait)
        chunks, next_offset = await self._read(low, min(request.max_bytes or FETCH_BYTES, MAX_FETCH_BYTES))
        answer = FetchParts(chunks, next_offset, start, self._uploaded())
        self._sent[transport] += answer.nbytes
        now = time.monotonic()
        f.sent.append((now, wal.durable_offset))
        while f.sent and (len(f.sent) > MAX_SENT or f.sent[0][0] < now - 2 * self._lag_s):
            f.sent.popleft()
        return answer

    def start_offset(self) -> int:
        """Where a new copy begins: the first offset the object tier lacks, or the WAL's first if later."""
        return max(self._uploaded() + 1, self._wal.start_offset)

    def _uploaded(self) -> int:
        """The last offset the objects hold; -1 when none, or not known yet: a follower may fetch from a
        new owner whose uploader has not started (the topic is still loading), and a copy that starts at
        the WAL's first offset, and keeps all of it, holds more than it needs, never less."""
        uploader = self.topic.uploader
        known = uploader.known_checkpoint if uploader is not None else None
        return -1 if known is None else known

    async def _read(self, low: int, room: int) -> tuple[list[Buffer], int]:
        """Whole batches from `low`, up to `room` bytes (at least one batch), and the offset after them."""
        wal = self._wal
        got = await wal.read(low, room, durable=True)
        if got is None:
            return [], low
        chunk, next_offset = clip_batches(got[0], low, wal.durable_offset, room, whole=True)
        chunks: list[Buffer] = [chunk]
        size = len(chunk)
        while size < room:  # join what more the tail cache holds, as a reader at the tail does
            more = wal.cached(next_offset, room - size, durable=True)
            if more is None:
                break
            chunk, after = clip_batches(more[0], next_offset, wal.durable_offset, room - size, whole=False)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            next_offset = after
        return chunks, next_offset

    def _progress(self, broker: int, f: _Follower, low: int, durable: int) -> None:
        """The follower has every record below `low`, durably those below `durable`."""
        if durable < f.durable and broker in self._holders():
            # Less than it said before (its copy started again): out of the ISR (or the eligible) at the
            # next pass, written first; until then the line stays where it was, never lowered under a reader.
            log.warning("%s: broker %d now holds less than it did (%d < %d)", self.topic.full, broker,
                        durable, f.durable)
            f.regressed = True
            return
        f.durable = durable
        now = time.monotonic()
        if durable >= self._wal.durable_offset:
            f.caught_up_at = now
        while f.sent and f.sent[0][1] <= durable:
            f.caught_up_at = max(f.caught_up_at, f.sent.popleft()[0])
        # Caught up within a quarter of the lag allowed (a pipelined copy trails by a few fetches): it joins.
        if broker not in self.isr and not self._closed and now - f.caught_up_at <= self._lag_s / 4:
            self._join(broker, f)
        if broker in self.isr and f.joined_at is not None and f.durable >= f.joined_at:
            f.joined_at = None
            self._schedule_persist()
        if broker in self._holders():
            self._show()
        self._wake()

    def _join(self, broker: int, f: _Follower) -> None:
        """In memory now: acknowledgements wait for it from here on; written as in sync once it holds what
        is durable here now (every record acknowledged so far)."""
        if not self._holders():
            self._wal.hold_visible(self._wal.committed_offset)
        self.isr.add(broker)
        f.joined_at = self._wal.durable_offset
        log.info("%s: broker %d caught up, joining the in-sync copies", self.topic.full, broker)

    def _show(self) -> None:
        if self._holders():
            self._wal.show_through(self._line())

    # -- the in-sync set over time ---------------------------------------------------------------------

    async def maintain(self, live: set[int], pick: Callable[[int, set[int]], list[int]]) -> None:
        """One pass: followers that lag or whose broker is gone leave the ISR (written first), dead
        followers are replaced by `pick(n, taken)` brokers, and what changed is written."""
        if self._closed or not self._ready.is_set():
            return
        now = time.monotonic()
        leaving = {b for b in self.isr
                   if b not in live or self.followers[b].regressed
                   or (now - self.followers[b].caught_up_at > self._lag_s
                       and self.followers[b].durable < self._wal.durable_offset)}
        gone = {b for b in self.followers if b not in live}
        surplus = self._surplus(gone, leaving)
        gone |= surplus
        leaving |= surplus & self.isr
        wanted = self.copies - 1 - (len(self.followers) - len(gone))
        added = pick(wanted, {self.me, *self.followers}) if wanted > 0 else []
        regressed = any(self.followers[b].regressed for b in self._holders() - self.isr)
        if not leaving and not gone and not added and not regressed:
            return
        if surplus:
            log.info("%s: %d copies wanted now: broker(s) %s no longer follow it", self.topic.full,
                     self.copies, sorted(surplus))
        for b in leaving:
            log.warning("%s: broker %d leaves the in-sync copies (%s)", self.topic.full, b,
                        "its registration is gone" if b not in live else
                        "its copy started again" if self.followers[b].regressed else
                        f"not caught up for {self._lag_s:.1f} s")
        await self._persist(leaving=leaving, gone=gone, adding=added)

    def _surplus(self, gone: set[int], leaving: set[int]) -> set[int]:
        """Followers beyond what replicationFactor asks for now (it was lowered): those out of sync first,
        then those holding least, never taking the in-sync copies below minInSyncReplicas."""
        staying = [b for b in self.followers if b not in gone]
        extra = len(staying) - (self.copies - 1)
        if extra <= 0:
            return set()
        in_sync = len(self.isr - leaving)
        out: set[int] = set()
        for b in sorted(staying, key=lambda b: (b in self.isr, self.followers[b].durable)):
            if len(out) == extra:
                break
            if b in self.isr and b not in leaving:
                if in_sync < self.needed:  # without it: the owner and in_sync - 1 followers
                    break
                in_sync -= 1
            out.add(b)
        return out

    def _schedule_persist(self) -> None:
        task = asyncio.create_task(self._persist_quietly())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _persist_quietly(self) -> None:
        try:
            await self._persist()
        except Exception as e:  # the next change or pass writes it again
            log.warning("%s: writing its in-sync copies failed: %s", self.topic.full, e)

    async def _persist(self, leaving: set[int] | None = None, gone: set[int] | None = None,
                       adding: Sequence[int] = ()) -> None:
        """Write the copies as they are (a follower that joined in memory counts as in sync once it holds
        what it joined at), less the `leaving` ISR members and the `gone` followers, plus `adding`; fenced
        on the assignment. Only then do those changes apply in memory, under the same lock, so that a
        write made meanwhile cannot put a leaving member back."""
        out = (leaving or set()) | (gone or set())
        async with self._writing:
            isr = [self.me, *sorted(b for b in self.isr - out if self.followers[b].joined_at is None)]
            before = self.written
            eligible: set[int] = set()
            if len(isr) < self.needed and before is not None:  # nothing is acknowledged from here on
                whole = out & set(before.isr)
                eligible = {b for b in (set(before.eligible) | whole) - set(isr)
                            if b in self.followers and not self.followers[b].regressed}
            # A dead follower stays named while it is eligible: its disk may hold the only other copy of
            # what was acknowledged (a crash, not a lost machine), and it goes on copying when it is back.
            dropped = (gone or set()) - eligible
            followers = sorted({*self.followers, *adding} - dropped)
            value = TopicReplicas(self.me, self.epoch, tuple(followers), tuple(isr), tuple(sorted(eligible)))
            if value != self.written:
                await self._write([Put(keys.replicas(self._ns, self._t), value.to_json())])
                self.written = value
                self._wake()  # acknowledgements wait for the written ISR to count enough copies
            self.isr -= out
            for b in (out | set(before.eligible if before is not None else ())) & set(self.followers):
                self.followers[b].regressed = False
                if b in out:
                    self.followers[b].joined_at = None
            for b in dropped:
                self.followers.pop(b, None)
            for b in adding:
                self.followers.setdefault(b, _Follower())
        if not self._holders():
            self._wal.release_visible()
        else:
            self._show()
        if out:
            self._wake()

    def describe(self) -> TopicReplicas:
        """The copies as this owner sees them now."""
        isr = [self.me, *sorted(b for b in self.isr if self.followers[b].joined_at is None)]
        eligible = self.written.eligible if self.written is not None else ()
        return TopicReplicas(self.me, self.epoch, tuple(sorted(self.followers)), tuple(isr),
                             tuple(b for b in eligible if b in self.followers and b not in isr))

"""Reliable dispatch: at-least-once delivery from the topic's WAL, a window of unacknowledged messages per
consumer, redelivery on nack, ack timeout and consumer loss, and a dead-letter topic after too many.

Ownership: one task per subscription (`_run`) reads the WAL and hands messages to consumers; Ack and Nack
handlers and consumer changes only update the bookkeeping below and wake it.

Bookkeeping, by offset:
- `_ready`: read from the WAL, not yet handed to a consumer (in offset order, at most one read's worth);
- `_pending`: handed to a consumer, waiting for its ack; insertion order is deadline order because every
  delivery gets the same ack timeout;
- `_waiting` + `_due` (a heap): to be delivered again at a time (after a nack, a timeout or a lost consumer);
  `_retry`: released from `_due`, in order; Key-Shared also parks here the messages whose consumer is away or
  full, so that one slow consumer does not stop every other key;
- the subscription's Cursor (dispatch/cursor.py, shared with the fast API's BatchDispatcher): its floor
  moves over every offset read that is no longer held (acknowledged, dead-lettered, or dropped because no
  consumer's key filter accepts it), and it is saved by its flush policy, so a restart resumes at the
  lowest unacknowledged offset and never skips one.

Delayed records (Shared and Key-Shared; docs/SUBSCRIPTIONS.md, "Delayed delivery"): a record whose
`danube-deliver-at` time has not come is not held when it is read: its (time, offset) goes to the DelayIndex
(delays.py) and the floor moves on. When its time comes it is read again by offset, parked in `_waiting` and
delivered as a retry. What a restart needs is saved with the floor (cursor.Delayed): `_scan` reads that
range of the log again for them, as it does for what the index left out when it was full.

Unlike v0.7.3 (one message in flight per subscription, docs/WIRE.md C.9), each consumer may have
`window` messages unacknowledged, and as many bytes of them as `window_bytes` allows (one message bigger
than that goes alone). Every message read holds its bytes (`_held`, and the broker's ByteBudget, see
budget.py) until it is acknowledged, dead-lettered or dropped; while the broker's budget is spent and this
subscription holds something, nothing more is read: the data waits in the WAL.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from operator import attrgetter

from danube_fast import deliver_at
from danube_fast.broker import messages
from danube_fast.broker.config import DispatchConfig
from danube_fast.broker.consumer import Consumer
from danube_fast.broker.dispatch.budget import ByteBudget
from danube_fast.broker.dispatch.cursor import Cursor, Delayed
from danube_fast.broker.dispatch.delays import DelayIndex
from danube_fast.broker.dispatch.members import Members
from danube_fast.broker.dispatch.select import Selector
from danube_fast.broker.ratelimit import RateLimiter
from danube_fast.codec import frames
from danube_fast.errors import DanubeError, OffsetOutOfRange
from danube_fast.meta.resources import SubscriptionType
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.storage.tiered import ReadableLog, records_between

log = logging.getLogger("danube_fast.dispatch")

READ_BYTES = 256 * 1024
RELEASE_BATCH = 1000  # delayed records taken from the index per pass, at most
FETCH_BYTES = 64 * 1024  # a read of a due delayed record: at least its batch
SAVING_WAIT_S = 1.0  # the longest idle wait while a cursor save runs (its end wakes the loop anyway)
SCAN_SLICE_S = 0.01  # a pass reads the log again for delayed records this long, then lets others run
PARK_WINDOWS = 10  # Key-Shared: messages parked for busy or absent consumers, in windows, before reads stop
_length = attrgetter("length")


def record_sizes(data: messages.Buffer, start: int, count: int) -> list[int]:
    """The bytes each of the `count` records at offsets >= `start` in `data` (whole batches) holds: its
    batch's length shared equally among the batch's records (exact for the Danube API's one-record batches),
    or all of `data` for a lone record. Fixed at the read, so what is released is exactly what was taken."""
    if count == 1:  # a read following the tail: one group commit, one message; it holds what was read
        return [len(data)]
    headers = frames.scan_batches(data, verify=False)
    if len(headers) == count and (not headers or headers[0].base_offset >= start):
        return list(map(_length, headers))  # one record per batch: no Python per record
    sizes: list[int] = []
    for h in headers:
        if h.last_offset >= start:
            sizes += [h.length // h.record_count] * (h.last_offset - max(h.base_offset, start) + 1)
    return sizes


def _deliver_at(value: str | None, published: int) -> int | None:
    """A record's deliver-at time when it was published to wait (a time after its publish time)."""
    if value is None:
        return None
    try:
        at = deliver_at.parse(value)
    except ValueError:  # the Danube API refuses these; a fast-API batch is not parsed per record
        return None
    return at if at > published else None


@dataclass(slots=True)
class _Scan:
    """Offsets [pos, end) read again for delayed records with times >= `since` (ms)."""

    pos: int
    end: int
    since: int


@dataclass(slots=True)
class _Pending:
    msg: pb.StreamMessage
    size: int
    consumer: Consumer | None
    deadline: float
    redeliveries: int = 0
    delivered: bool = True  # False for a Key-Shared message parked before its first delivery


class ReliableDispatcher:
    kind = "per_message"

    def __init__(self, subscription: Members, wal: ReadableLog, config: DispatchConfig, cursor: Cursor,
                 dead_letter: Callable[[pb.StreamMessage], Awaitable[None]], max_rate: int = 0,
                 budget: ByteBudget | None = None) -> None:
        """`budget`: the broker's, shared by all its dispatchers; without one, a budget of its own."""
        self._sub = subscription
        self._wal = wal
        self._config = config
        self._cursor = cursor
        cursor.forget_acks()  # acks above the floor (a fast-API stream's) are this dispatcher's to redo
        if cursor.low < wal.start_offset:
            cursor.skip_to(wal.start_offset)
        start = cursor.low
        self._dead_letter = dead_letter
        self._selector = Selector(subscription.kind)
        self._single = subscription.kind in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER)
        self._active: Consumer | None = None  # Exclusive / Failover: the consumer the last pass served
        self._keyed = subscription.kind == SubscriptionType.KEY_SHARED
        self._loop = asyncio.get_running_loop()
        self._budget = budget if budget is not None else ByteBudget(config.broker_bytes)
        self._window_bytes = config.window_bytes
        self._held = 0  # bytes of the messages in _ready, _pending and _waiting
        self._parked = 0  # bytes of those in _waiting before their first delivery (Key-Shared)
        self._size = 0  # bytes of the message being routed (what `_usable` checks)
        self._read_pos = start
        self._ready: deque[tuple[pb.StreamMessage, int]] = deque()  # (message, its bytes)
        self._pending: dict[int, _Pending] = {}
        self._waiting: dict[int, _Pending] = {}
        self._due: list[tuple[float, int]] = []
        self._retry: deque[int] = deque()  # released from _due (or parked), waiting for a consumer
        self._blocked_keys: set[str] = set()  # Key-Shared: keys that could not be delivered in this pass
        self._dead: deque[_Pending] = deque()
        # Delayed delivery is Shared's and Key-Shared's; Exclusive and Failover deliver in offset order, at
        # once (as Pulsar does).
        self._delays: DelayIndex | None = None
        self._delayed_out: dict[int, int] = {}  # offset -> time: released delayed records not yet acked
        # (lowest offset, a time at or before theirs) of records taken from the index and being read again:
        # in neither the index nor _delayed_out until the read is back; a cursor saved meanwhile covers them
        self._releasing: tuple[int, int] | None = None
        self._scan: _Scan | None = None
        self.delayed_released = 0
        if subscription.kind in (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED):
            self._delays = DelayIndex(config.delayed_index_records)
            stored = cursor.delayed
            if stored is not None and stored.from_offset < start:
                self._scan = _Scan(stored.from_offset, start, stored.from_time)
            cursor.delayed_source = self._delayed_state
        self._wake = asyncio.Event()
        self._rate = RateLimiter(max_rate)
        self._throttle = 0.0
        self._closed = False
        self.redelivered = 0
        self.dead_lettered = 0
        self._task = asyncio.create_task(self._run(), name=f"dispatch:{subscription.topic_name}:"
                                                           f"{subscription.name}")

    # -- what handlers call ------------------------------------------------------------------------

    def notify(self) -> None:
        """New records were committed to the WAL."""
        self._wake.set()

    def consumer_changed(self) -> None:
        self._wake.set()

    def ack(self, offset: int) -> bool:
        """True if `offset` was waiting for an ack (a duplicate or unknown ack is not an error)."""
        entry = self._pending.pop(offset, None)
        if entry is None:
            entry = self._waiting.pop(offset, None)  # acked after a nack or timeout: no redelivery needed
            if entry is None:
                return False
            if not entry.delivered:
                self._parked -= entry.size
        elif entry.consumer is not None:
            entry.consumer.settled(entry.size)
        self._release(entry.size)
        self._cursor.counted()
        self._advance_low()
        self._wake.set()
        return True

    def nack(self, offset: int, delay_ms: int | None) -> bool:
        entry = self._pending.pop(offset, None)
        if entry is None:
            return False
        if entry.consumer is not None:
            entry.consumer.settled(entry.size)
        self._retry_later(offset, entry, delay_ms, count=True)
        self._wake.set()
        return True

    def consumer_lost(self, consumer: Consumer) -> None:
        """Its stream ended or it was removed: what it held goes to the others (or to it, when it is back).
        A loss is not the message's fault, so it does not count toward the dead-letter limit."""
        consumer.drain_queue()
        lost = [off for off, e in self._pending.items() if e.consumer is consumer]
        for off in lost:
            entry = self._pending.pop(off)
            self._retry_later(off, entry, 0, count=False)
        consumer.settled_all()
        self._wake.set()

    def taken(self, size: int) -> None:
        """A stream took queued messages: they stay held until acknowledged."""

    # -- state for metrics and tests -----------------------------------------------------------------

    @property
    def floor(self) -> int:
        """The cursor's contiguous ack floor: every offset up to it is acknowledged."""
        return self._cursor.floor

    @property
    def backlog(self) -> int:
        return records_between(self._wal, self._cursor.low, self._wal.committed_offset)

    @property
    def unacked(self) -> int:
        return len(self._pending) + len(self._waiting)

    def counters(self) -> dict[str, int]:
        counted = {"redelivered": self.redelivered, "dead_lettered": self.dead_lettered,
                   "unacked": self.unacked}
        if self._delays is not None:
            counted["delayed"] = len(self._delays)
        return counted

    def stream_replaced(self, consumer: Consumer) -> None:
        """Messages the old stream had taken may never have reached the client: delivered again."""
        self.consumer_lost(consumer)

    def stop_streams(self) -> None:
        pass  # per-message streams end with their consumers (Clients)

    @property
    def held_bytes(self) -> int:
        """Bytes read for delivery and not yet released: read ahead, in flight, waiting for redelivery."""
        return self._held

    async def close(self, *, save: bool = True) -> None:
        """Stop dispatching and give back every byte held; persist the cursor unless the subscription is
        being deleted."""
        self._closed = True
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._cursor.settled()
        if self._delays is not None:  # what is saved below is the state before the clearing
            state = self._delayed_state()
            self._cursor.delayed_source = lambda: state
            self._delays = None
        self._budget.forget(self._wake.set)
        self._ready.clear()
        self._pending.clear()
        self._waiting.clear()
        self._retry.clear()
        self._due.clear()
        self._dead.clear()
        self._parked = 0
        self._release(self._held)
        try:
            if save:
                await self.save_cursor()
        finally:
            self._cursor.delayed_source = None

    async def save_cursor(self) -> None:
        await self._cursor.save()

    # -- the dispatch task ---------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._closed:
            self._wake.clear()
            if self._single:
                self._follow_active()
            now = self._loop.time()
            try:
                self._expire(now)
                self._release_due(now)
                delayed = await self._delayed(now) if self._delays is not None else False
                moved = self._send_retries(now) or delayed
                moved = await self._send_new(now) or moved
                await self._bury_dead()
                if self._cursor.due(now):
                    self._cursor.start_save(f"subscription {self._sub.name} on {self._sub.topic_name}",
                                            self._wake.set)
            except asyncio.CancelledError:
                raise
            except DanubeError as e:  # a WAL read failed: keep the state, try again soon
                log.warning("subscription %s on %s: %s", self._sub.name, self._sub.topic_name, e)
                moved = False
                await asyncio.sleep(0.5)
            except Exception:  # a bug: say so loudly, but do not let the subscription stop for good
                log.exception("dispatching subscription %s on %s failed", self._sub.name,
                              self._sub.topic_name)
                moved = False
                await asyncio.sleep(0.5)
            if moved:
                # let acks and publishes in; under max_subscription_dispatch_rate, wait out the excess
                await asyncio.sleep(self._throttle)
                self._throttle = 0.0
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._idle_timeout(now))

    def _follow_active(self) -> None:
        """Exclusive and Failover: when another consumer becomes the active one, what the others still hold
        comes back to be delivered to it first, in order, so that it never reads past a message another
        consumer holds (Pulsar's failover rewinds the same way). A standby that took over while the first
        consumer's stream was cut, and then lost the role to it when it came back, held three messages while
        the first went on from the next: the chaos campaign's poll-skips (docs/CHAOS.md)."""
        active = self._selector.active(self._sub.consumers)
        if active is self._active:
            return
        self._active = active
        if active is None:
            return
        for off in sorted(off for off, e in self._pending.items() if e.consumer is not active):
            entry = self._pending.pop(off)
            if entry.consumer is not None:
                entry.consumer.settled(entry.size)
            self._retry_later(off, entry, 0, count=False)

    def _idle_timeout(self, now: float) -> float:
        # (a save under way wakes the loop when done: a store that hangs does not make it spin)
        until = now + SAVING_WAIT_S if self._cursor.saving else self._cursor.next_save
        if self._delays is not None and (release := self._delays.next_release()) is not None:
            until = min(until, now + (release - deliver_at.now_ms()) / 1000)
        if self._due:
            until = min(until, self._due[0][0])
        if self._pending:
            until = min(until, next(iter(self._pending.values())).deadline)
        return max(0.001, until - now)

    def _usable(self, c: Consumer) -> bool:
        """Room in the consumer's window for the message being routed, by count and by bytes."""
        held = c.inflight_bytes
        return c.has_room and (not held or held + self._size <= self._window_bytes)

    def _release(self, size: int) -> None:
        self._held -= size
        self._budget.give(size)

    def _deliver(self, msg: pb.StreamMessage, size: int, c: Consumer, now: float, redeliveries: int) -> None:
        if self._rate.per_second:
            self._throttle = self._rate.delay()
        offset = msg.msg_id.topic_offset
        self._pending[offset] = _Pending(msg, size, c, now + self._config.ack_timeout_ms / 1000,
                                         redeliveries)
        c.deliver(msg, size)

    def _route(self, msg: pb.StreamMessage, size: int) -> tuple[Consumer | None, bool]:
        """(consumer, wait): a consumer to take `msg` (of `size` bytes) now; else whether to wait (True) or
        drop it (False: a Key-Shared key that no consumer's filters accept, as upstream does)."""
        self._size = size
        consumers = self._sub.consumers
        key = messages.routing_key(msg) if self._keyed else ""
        c, routable = self._selector.pick(consumers, key, self._usable)
        if c is not None:
            return c, False
        if routable or not any(x.active for x in consumers):
            return None, True
        return None, False

    def _send_retries(self, now: float) -> bool:
        """Deliver what waits in `_retry`, in order. Other types stop at the first message nobody can take;
        Key-Shared skips a key whose consumer is away or full (it is "blocked" for the rest of this pass, so
        its later messages cannot overtake it) and goes on with the other keys."""
        moved = False
        keep: deque[int] = deque()
        blocked = self._blocked_keys
        blocked.clear()
        while self._retry:
            off = self._retry.popleft()
            entry = self._waiting.get(off)
            if entry is None:  # acked meanwhile
                continue
            key = messages.routing_key(entry.msg) if self._keyed else ""
            if key in blocked:
                keep.append(off)
                continue
            c, wait = self._route(entry.msg, entry.size)
            if c is None:
                if wait:
                    keep.append(off)
                    if not self._keyed:
                        keep.extend(self._retry)
                        self._retry.clear()
                    blocked.add(key)
                    continue
                del self._waiting[off]  # a key no consumer accepts any more
                if not entry.delivered:
                    self._parked -= entry.size
                self._release(entry.size)
                self._advance_low()
                continue
            del self._waiting[off]
            self._deliver(entry.msg, entry.size, c, now, entry.redeliveries)
            if entry.delivered:
                self.redelivered += 1
            else:
                self._parked -= entry.size
            moved = True
        self._retry = keep
        return moved

    async def _send_new(self, now: float) -> bool:
        moved = False
        park_limit = self._config.window * PARK_WINDOWS
        park_bytes = self._window_bytes * PARK_WINDOWS
        while True:
            if not self._ready:
                if self._held and self._budget.spent:
                    self._budget.wait(self._wake.set)  # the data waits in the WAL
                    return moved
                if not await self._read():
                    return moved
                if not self._ready:  # all of that read was delayed
                    await asyncio.sleep(0)
                    continue
            msg, size = self._ready[0]
            if self._keyed and messages.routing_key(msg) in self._blocked_keys:
                c, wait = None, True
            else:
                c, wait = self._route(msg, size)
            if c is None and wait:
                if not self._keyed or len(self._retry) >= park_limit or self._parked >= park_bytes:
                    return moved
                self._park(*self._ready.popleft())  # Key-Shared: let the other keys go on
                continue
            self._ready.popleft()
            if c is not None:
                self._deliver(msg, size, c, now, 0)
                moved = True
            else:
                self._release(size)
                self._advance_low()

    def _park(self, msg: pb.StreamMessage, size: int) -> None:
        off = msg.msg_id.topic_offset
        self._waiting[off] = _Pending(msg, size, None, 0.0, 0, delivered=False)
        self._parked += size
        self._retry.append(off)
        self._blocked_keys.add(messages.routing_key(msg))

    async def _read(self) -> bool:
        if self._read_pos >= self._wal.committed_offset:
            return False
        try:
            got = await self._wal.read(self._read_pos, READ_BYTES)
        except OffsetOutOfRange:  # retention deleted what this subscription had not consumed
            log.warning("subscription %s on %s skips offsets %d..%d: deleted by retention", self._sub.name,
                        self._sub.topic_name, self._read_pos, self._wal.start_offset - 1)
            self._read_pos = self._wal.start_offset
            self._advance_low()
            return False
        if got is None:
            return False
        data, next_offset = got
        msgs = messages.decode(data, self._sub.topic_name, self._read_pos)
        sizes = record_sizes(data, self._read_pos, len(msgs))
        if self._delays is not None:
            msgs, sizes = self._not_delayed(msgs, sizes)
        self._ready.extend(zip(msgs, sizes, strict=True))
        size = sum(sizes)
        self._held += size
        self._budget.take(size)
        self._read_pos = next_offset
        if not self._ready:
            self._advance_low()  # all of it delayed: the floor moves over it
        return bool(self._ready) or self._read_pos < self._wal.committed_offset

    # -- delayed records (Shared, Key-Shared) ---------------------------------------------------------

    @staticmethod
    def delay_of(msg: pb.StreamMessage) -> int | None:
        """The record's deliver-at time when it was published to wait (a time after its publish time). Every
        record a Shared subscription reads goes through here: `in` first, the cheapest question to ask of
        a protobuf map (bench delayed: delay_check_ns_per_record)."""
        attributes = msg.attributes
        if deliver_at.ATTRIBUTE not in attributes:
            return None
        return _deliver_at(attributes[deliver_at.ATTRIBUTE], msg.publish_time)

    def _not_delayed(self, msgs: list[pb.StreamMessage], sizes: list[int]
                     ) -> tuple[list[pb.StreamMessage], list[int]]:
        """`msgs` (and their sizes) but those that wait: those go to the index."""
        assert self._delays is not None
        now = deliver_at.now_ms()
        kept: list[pb.StreamMessage] = []
        kept_sizes: list[int] = []
        for msg, size in zip(msgs, sizes, strict=True):
            at = self.delay_of(msg)
            if at is not None and at > now:
                self._delays.add(at, msg.msg_id.topic_offset)
            else:
                kept.append(msg)
                kept_sizes.append(size)
        return kept, kept_sizes

    async def _delayed(self, now: float) -> bool:
        """One step of the delayed records' work: a chunk of a scan, the spilled ones read again when the
        index has room, and the due ones parked for delivery. Whether there is more to do at once."""
        delays = self._delays
        assert delays is not None
        if self._scan is not None:
            until = self._loop.time() + SCAN_SLICE_S
            while self._scan is not None and self._loop.time() < until:
                await self._scan_step(self._scan)
        elif delays.cut is not None and len(delays) <= self._config.delayed_index_records // 2:
            spilled = delays.take_spill()
            if spilled is not None:
                self._scan = _Scan(spilled[0], self._read_pos, spilled[1])
        if len(self._retry) >= self._config.window or (self._held and self._budget.spent):
            return self._scan is not None  # what was released waits for a consumer first
        since = delays.earliest()
        due = delays.due(deliver_at.now_ms(), RELEASE_BATCH)
        if due and since is not None:
            self._releasing = (due[0], since)
        try:
            fetched = await self._fetch(due)
        finally:
            self._releasing = None
        for msg, size in fetched:
            offset = msg.msg_id.topic_offset
            self._waiting[offset] = _Pending(msg, size, None, 0.0, 0, delivered=False)
            self._parked += size
            self._held += size
            self._budget.take(size)
            self._retry.append(offset)
            self._delayed_out[offset] = self.delay_of(msg) or 0
            self.delayed_released += 1
        return self._scan is not None or len(due) == RELEASE_BATCH

    async def _scan_step(self, scan: _Scan) -> None:
        """Read one chunk of `scan`'s range and index the delayed records in it."""
        assert self._delays is not None
        scan.pos = max(scan.pos, self._wal.start_offset)  # retention may have deleted some meanwhile
        got = None
        if scan.pos < scan.end:
            try:
                got = await self._wal.read(scan.pos, READ_BYTES)
            except OffsetOutOfRange:
                return  # retention moved meanwhile: the next step starts at the new start
        if got is None:  # done (or the rest is a hole: nothing is stored there)
            self._scan = None
            return
        data, next_offset = got
        view = memoryview(data)
        for header in frames.scan_batches(view, verify=False):  # records, not messages: only times matter
            if header.last_offset < scan.pos:
                continue
            for r in frames.iter_records(view[header.position:header.end], verify=False):
                if r.offset < scan.pos or r.offset >= scan.end or not r.attributes:
                    continue
                at = _deliver_at(r.attributes.get(deliver_at.ATTRIBUTE), r.publish_time)
                if at is not None and at >= scan.since:
                    self._delays.add(at, r.offset)
        scan.pos = min(next_offset, scan.end)

    async def _fetch(self, offsets: list[int]) -> list[tuple[pb.StreamMessage, int]]:
        """The records at `offsets` (ascending) with their sizes; those deleted by retention meanwhile are
        left out."""
        out: list[tuple[pb.StreamMessage, int]] = []
        i = 0
        while i < len(offsets):
            first = offsets[i]
            try:  # about one batch: due records are usually far apart
                got = await self._wal.read(first, FETCH_BYTES)
            except OffsetOutOfRange:
                got = None
            if got is None:
                i += 1
                continue
            data, next_offset = got
            j = bisect.bisect_left(offsets, next_offset, i)
            out += messages.decode_some(data, self._sub.topic_name, offsets[i:j])
            i = j
        return out

    def _delayed_state(self) -> Delayed | None:
        """Where the delayed records not yet acknowledged may be: saved with the floor."""
        delays = self._delays
        if delays is None:
            return None
        offsets: list[int] = []
        times: list[int] = []
        if (low := delays.lowest_offset()) is not None:
            offsets.append(low)
        if (earliest := delays.earliest()) is not None:
            times.append(earliest)
        if delays.spill_from is not None and delays.cut is not None:
            offsets.append(delays.spill_from)
            times.append(delays.cut)
        for offset, at in list(self._delayed_out.items()):
            if offset in self._pending or offset in self._waiting:
                offsets.append(offset)
                times.append(at)
            else:  # acknowledged, dead-lettered or dropped
                del self._delayed_out[offset]
        if self._scan is not None:
            offsets.append(self._scan.pos)
            times.append(self._scan.since)
        if self._releasing is not None:
            offsets.append(self._releasing[0])
            times.append(self._releasing[1])
        if not offsets:
            return None
        return Delayed(min(offsets), min(times) if times else 0)

    # -- redelivery ----------------------------------------------------------------------------------

    def _retry_later(self, offset: int, entry: _Pending, delay_ms: int | None, *, count: bool) -> None:
        entry.consumer = None
        if count:
            entry.redeliveries += 1
            if entry.redeliveries > self._config.max_redeliveries:
                self._dead.append(entry)
                self._waiting[offset] = entry  # still unacked until the dead-letter topic has it
                return
            backoff = self._config.nack_base_delay_ms * (1 << min(entry.redeliveries - 1, 30))
            delay = min(max(backoff, delay_ms or 0), self._config.nack_max_delay_ms)
        else:
            delay = 0
        self._waiting[offset] = entry
        heapq.heappush(self._due, (self._loop.time() + delay / 1000, offset))

    def _release_due(self, now: float) -> None:
        released = []
        while self._due and self._due[0][0] <= now:
            _, off = heapq.heappop(self._due)
            entry = self._waiting.get(off)
            if entry is not None and entry.redeliveries <= self._config.max_redeliveries:
                released.append(off)
        if released:
            released.sort()
            self._retry.extend(released)

    def _expire(self, now: float) -> None:
        while self._pending:
            off, entry = next(iter(self._pending.items()))
            if entry.deadline > now:
                return
            del self._pending[off]
            if entry.consumer is not None:
                entry.consumer.settled(entry.size)
            self._retry_later(off, entry, 0, count=True)

    async def _bury_dead(self) -> None:
        while self._dead:
            entry = self._dead[0]
            off = entry.msg.msg_id.topic_offset
            if off not in self._waiting:  # acked while it waited
                self._dead.popleft()
                continue
            await self._dead_letter(entry.msg)
            self._dead.popleft()
            if self._waiting.pop(off, None) is not None:  # an ack may have come while the publish ran
                self._release(entry.size)
            self.dead_lettered += 1
            self._cursor.counted()
            self._advance_low()

    def _advance_low(self) -> None:
        limit = self._ready[0][0].msg_id.topic_offset if self._ready else self._read_pos
        self._cursor.settle_below(limit, self._pending, self._waiting)

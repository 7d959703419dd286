"""A Reliable subscription served to one fast-API consumer stream: whole record batches straight from the
WAL, no per-message work, a window of unacknowledged bytes, cumulative and individual acks.

It moves the subscription's Cursor (dispatch/cursor.py: the ack floor, the individual acks above it, when
it is saved), the same one the per-message ReliableDispatcher moves, so a subscription can go between the
two APIs: Subscriptions swaps the dispatcher when a consumer of the other kind subscribes while nobody of
this kind is streaming.

The window the client names is capped at [dispatch] window_bytes, and the unacknowledged bytes count in the
broker's ByteBudget (budget.py): while it is spent, a stream with something unacknowledged waits for room.

Ownership: the Consume stream that holds it (`holder`) calls `next_records` and `acknowledge`; both run on
the event loop. What it hands the stream is counted by the subscription (`Members.sent`), which outlives
it. Delivery is at least once: when the stream goes, delivery starts again at the floor, so
records acknowledged individually above the floor come again (a batch is delivered whole).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import cast

from danube_fast.broker.config import DispatchConfig
from danube_fast.broker.consumer import Consumer
from danube_fast.broker.dispatch.budget import ByteBudget
from danube_fast.broker.dispatch.cursor import Cursor
from danube_fast.broker.dispatch.members import Members
from danube_fast.broker.dispatch.read_ahead import ReadAhead
from danube_fast.codec.fast_wire import records_data
from danube_fast.errors import DanubeError, OffsetOutOfRange
from danube_fast.storage import file_span
from danube_fast.storage.file_span import FileSpan
from danube_fast.storage.objects.format import Buffer
from danube_fast.storage.tiered import ReadableLog, records_between

log = logging.getLogger("danube_fast.dispatch")

READ_BYTES = 1024 * 1024
# A delivery that may go by sendfile (next_chunks' `spans`) reads up to this much: no memory holds it, and
# per delivery the broker's CPU is nearly fixed. 64 KiB records caught up from the WAL's files at 1.34-1.36
# GB/s with 4 or 8 MiB against 0.95-1.14 GB/s with 1 MiB, at 0.54 ms of broker CPU per MB against 0.82
# (bench sendfile, 2026-11-30, 3 runs each); 4 keeps four deliveries in the default 16 MiB window.
SPAN_BYTES = 4 * READ_BYTES
RETRY_READ_S = 0.5  # a read that failed in a way worth retrying is tried again this much later


class BatchDispatcher:
    kind = "batches"

    def __init__(self, subscription: Members, wal: ReadableLog, config: DispatchConfig, cursor: Cursor,
                 budget: ByteBudget | None = None) -> None:
        """`budget`: the broker's, shared by all its dispatchers; without one, a budget of its own."""
        self._sub = subscription
        self._budget = budget if budget is not None else ByteBudget(config.broker_bytes)
        self._wal = wal
        self.read_ahead = ReadAhead(wal, self._budget)  # the next read, started while a delivery is sent
        self._config = config
        self._loop = asyncio.get_running_loop()
        self._cursor = cursor
        if cursor.low < wal.start_offset:
            cursor.skip_to(wal.start_offset)
        cursor.forget_acks()  # what was acknowledged above the floor on another stream comes again
        self._next = cursor.low  # next offset to send
        self._sent: deque[tuple[int, int]] = deque()  # (last offset, bytes) of what is out, in order
        self._unacked_bytes = 0
        self._wake = asyncio.Event()
        self.holder = 0  # id of the fast consumer streaming from it (0: nobody)
        self._epoch = 0  # bumped when the stream goes: a read begun for the old stream is dropped
        self._position = 0  # bumped when a nack moves `_next` back: a read begun before is dropped
        self.stopped = False  # the broker is stopping: the holding stream ends
        self.moved = ""  # why an operator's seek or skip replaced it: the stream ends, the client comes back
        self._closed = False  # closed: acks the old stream still sends must not move the cursor
        self.redelivered = 0
        self.dead_lettered = 0

    # -- what Subscription and the Danube API call ----------------------------------------------------

    def notify(self) -> None:
        self._wake.set()

    def consumer_changed(self) -> None:
        self._wake.set()

    def consumer_lost(self, consumer: Consumer | None = None) -> None:
        """The stream went: deliver again from the floor."""
        cursor = self._cursor
        self.redelivered += max(0, self._next - cursor.low - cursor.forget_acks())
        self._epoch += 1
        self.read_ahead.drop()
        self._next = cursor.low
        self._sent.clear()
        self._release(self._unacked_bytes)
        self._wake.set()

    def stream_replaced(self, consumer: Consumer) -> None:
        pass  # a fast-API stream is never replaced by a Danube API one (subscriptions.py switches)

    def taken(self, size: int) -> None:
        """Consumer streams of the Danube API take nothing from a subscription served by batches."""

    def counters(self) -> dict[str, int]:
        return {"redelivered": self.redelivered, "dead_lettered": self.dead_lettered, "unacked": self.unacked}

    def _release(self, size: int) -> None:
        self._unacked_bytes -= size
        self._budget.give(size)

    def ack(self, offset: int) -> bool:
        return self.acknowledge(None, [offset]) > 0

    def nack(self, offset: int, delay_ms: int | None) -> bool:
        """Deliver again from `offset` (whole batches from the one holding it), after `delay_ms`."""
        if not self._cursor.low <= offset < self._next:
            return False
        if delay_ms:
            self._loop.call_later(delay_ms / 1000, self._rewind, offset, self._epoch)
        else:
            self._rewind(offset, self._epoch)
        return True

    def _rewind(self, offset: int, epoch: int) -> None:
        acked = self._cursor.acked
        if epoch != self._epoch or not self._cursor.low <= offset < self._next:
            return  # the stream went meanwhile (delivery restarted at the floor) or it was acknowledged
        # Counted without walking the offsets: they are not dense (a reservation's gap after a crash).
        self.redelivered += max(0, self._next - offset - sum(1 for o in acked if o >= offset))
        self._position += 1  # a read in progress for the old position is dropped
        self.read_ahead.drop()
        while self._sent and self._sent[-1][0] >= offset:
            self._release(self._sent.pop()[1])
        self._next = offset if not self._sent else max(offset, self._sent[-1][0] + 1)
        self._wake.set()

    @property
    def floor(self) -> int:
        """The cursor's contiguous ack floor."""
        return self._cursor.floor

    @property
    def backlog(self) -> int:
        return records_between(self._wal, self._cursor.low, self._wal.committed_offset)

    @property
    def unacked(self) -> int:
        return max(0, self._next - self._cursor.low - len(self._cursor.acked))

    @property
    def held_bytes(self) -> int:
        """Bytes sent and not acknowledged."""
        return self._unacked_bytes

    def stop_streams(self) -> None:
        self.stopped = True
        self._wake.set()

    async def close(self, *, save: bool = True) -> None:
        self._closed = True
        self.stop_streams()
        self.read_ahead.drop()
        self._budget.forget(self._wake.set)
        self._sent.clear()
        self._release(self._unacked_bytes)
        await self._cursor.settled()
        if save:
            await self.save_cursor()

    async def save_cursor(self) -> None:
        await self._cursor.save()

    # -- what the holding stream calls ----------------------------------------------------------------

    def acknowledge(self, up_to: int | None, offsets: list[int]) -> int:
        """Cumulative (`up_to`: every offset up to it) and individual acks of sent offsets; how many
        offsets became acknowledged."""
        if self._closed:  # the cursor is another dispatcher's now (a seek), or it is being saved for good
            return 0
        done = self._cursor.acknowledge(up_to, offsets, self._next)
        low = self._cursor.low
        while self._sent and self._sent[0][0] < low:
            self._release(self._sent.popleft()[1])
        self._wake.set()
        return done

    async def next_records(self, window: int) -> tuple[Buffer, int, int] | None:
        """`next_chunks` as one buffer (a Records response's data: fast_wire.records_data)."""
        got = await self.next_chunks(window)
        return None if got is None else (records_data(cast("list[Buffer]", got[0])), got[1], got[2])

    async def next_chunks(self, window: int, spans: bool = False
                          ) -> tuple[list[Buffer | FileSpan], int, int] | None:
        """The next whole batches to send (chunks of them in order, first offset, last offset), once the
        window (at most [dispatch] window_bytes) and the broker's budget have room and the WAL has something
        committed past what was sent; starts a save of the cursor when one is due (Cursor.start_save). None
        once the dispatcher is stopped or closed: the stream must end. `spans`: batches read from a segment
        file may come as a FileSpan (the caller sends them with sendfile: storage/file_span.py)."""
        window = min(window, self._config.window_bytes)
        epoch = self._epoch
        while True:
            self._wake.clear()
            if self.stopped or self._epoch != epoch:
                return None
            if self._cursor.due(self._loop.time()):
                self._cursor.start_save(f"subscription {self._sub.name} on {self._sub.topic_name}",
                                        self._wake.set)
            waiting = self._unacked_bytes >= window or self._next >= self._wal.committed_offset
            if not waiting and self._unacked_bytes and self._budget.spent:
                self._budget.wait(self._wake.set)
                waiting = True
            if not waiting:
                position = self._position
                want = min(SPAN_BYTES if spans else READ_BYTES, window)
                try:
                    got = await self.read_ahead.take((epoch, position, self._next, want, spans))
                except OffsetOutOfRange:  # retention deleted what was not consumed
                    self._cursor.skip_to(self._wal.start_offset)
                    self._next = self._cursor.low
                    continue
                except DanubeError as e:
                    if not e.retriable:
                        raise
                    # A dead owner's offsets not recovered yet (storage/gaps.py), the object store away: the
                    # stream waits and reads again, as the per-message dispatcher does, instead of failing
                    # (which made the client subscribe again and take every unacknowledged batch again).
                    log.warning("subscription %s on %s: %s", self._sub.name, self._sub.topic_name, e)
                    await asyncio.sleep(RETRY_READ_S)  # not a wake: every publish sets it
                    continue
                if self._epoch != epoch:
                    return None  # the stream this read was for is gone (a cancel can arrive too late)
                if self._position != position:
                    continue  # a nack moved the position back while this read ran
                if got is not None:
                    data, next_offset = got
                    first = file_span.first_batch(data)[0]
                    chunks: list[Buffer | FileSpan] = [data]
                    size = len(data)
                    limit = min(READ_BYTES, window - self._unacked_bytes)
                    # The cache answers one group commit per read: join what more is committed and cached
                    # (no disk read here) so that one delivery carries up to READ_BYTES.
                    while size < limit and next_offset < self._wal.committed_offset:
                        more = self._wal.cached(next_offset, limit - size)
                        if more is None:
                            break
                        chunks.append(more[0])
                        size += len(more[0])
                        next_offset = more[1]
                    self._sent.append((next_offset - 1, size))
                    self._unacked_bytes += size
                    self._budget.take(size)
                    self._next = next_offset
                    # Whole batches go, from `first` (which may lie before what was asked for): count those.
                    self._sub.sent(records_between(self._wal, first, next_offset), size)
                    if next_offset < self._wal.committed_offset:  # behind the tail: read on while this goes
                        self.read_ahead.start((epoch, position, next_offset, want, spans))
                    return chunks, first, next_offset - 1
            # (a save under way wakes it when done, so a store that hangs does not make this spin)
            timeout = None if self._cursor.saving else max(0.001, self._cursor.next_save - self._loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

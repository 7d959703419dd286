"""A Reliable subscription served to one fast-API consumer stream: whole record batches straight from the
WAL, no per-message work, a window of unacknowledged bytes, cumulative and individual acks.

It keeps the same cursor (the contiguous ack floor, under the seed's cursor key) as the per-message
ReliableDispatcher, so a subscription can move between the two APIs: Topics swaps the dispatcher when a
consumer of the other kind subscribes while nobody of this kind is streaming.

The window the client names is capped at [dispatch] window_bytes, and the unacknowledged bytes count in the
broker's ByteBudget (budget.py): while it is spent, a stream with something unacknowledged waits for room.

Ownership: the Consume stream that holds it (`holder`) calls `next_records` and `acknowledge`; both run on
the event loop. Delivery is at least once: when the stream goes, delivery starts again at the floor, so
records acknowledged individually above the floor come again (a batch is delivered whole).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable

from danube_fast import frames
from danube_fast.broker.config import DispatchConfig
from danube_fast.broker.consumer import Consumer
from danube_fast.broker.dispatch.budget import ByteBudget
from danube_fast.broker.dispatch.members import Members
from danube_fast.errors import OffsetOutOfRange
from danube_fast.storage.tiered import ReadableLog

READ_BYTES = 1024 * 1024


class BatchDispatcher:
    def __init__(self, subscription: Members, wal: ReadableLog, config: DispatchConfig, start: int,
                 save_cursor: Callable[[int], Awaitable[None]], budget: ByteBudget | None = None) -> None:
        """`budget`: the broker's, shared by all its dispatchers; without one, a budget of its own."""
        self._sub = subscription
        self._budget = budget if budget is not None else ByteBudget(config.broker_bytes)
        self._wal = wal
        self._config = config
        self._save_cursor = save_cursor
        self._loop = asyncio.get_running_loop()
        self._low = start  # lowest offset not acknowledged
        self._next = start  # next offset to send
        self._acked: set[int] = set()  # acknowledged one by one, above the floor
        self._sent: deque[tuple[int, int]] = deque()  # (last offset, bytes) of what is out, in order
        self._unacked_bytes = 0
        self._saved = start - 1
        self._acks_since_save = 0
        self._next_save = self._loop.time() + config.cursor_flush_ms / 1000
        self._save_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self.holder = 0  # id of the fast consumer streaming from it (0: nobody)
        self._epoch = 0  # bumped when the stream goes: a read begun for the old stream is dropped
        self._position = 0  # bumped when a nack moves `_next` back: a read begun before is dropped
        self.stopped = False  # the broker is stopping: the holding stream ends
        self.redelivered = 0
        self.dead_lettered = 0

    # -- what Subscription and the Danube API call ----------------------------------------------------

    def notify(self) -> None:
        self._wake.set()

    def consumer_changed(self) -> None:
        self._wake.set()

    def consumer_lost(self, consumer: Consumer | None = None) -> None:
        """The stream went: deliver again from the floor."""
        self.redelivered += max(0, self._next - self._low - len(self._acked))
        self._epoch += 1
        self._next = self._low
        self._acked.clear()
        self._sent.clear()
        self._release(self._unacked_bytes)
        self._wake.set()

    def taken(self, size: int) -> None:
        """Consumer streams of the Danube API take nothing from a subscription served by batches."""

    def _release(self, size: int) -> None:
        self._unacked_bytes -= size
        self._budget.give(size)

    def ack(self, offset: int) -> bool:
        return self.acknowledge(None, [offset]) > 0

    def nack(self, offset: int, delay_ms: int | None) -> bool:
        """Deliver again from `offset` (whole batches from the one holding it), after `delay_ms`."""
        if not self._low <= offset < self._next:
            return False
        if delay_ms:
            self._loop.call_later(delay_ms / 1000, self._rewind, offset, self._epoch)
        else:
            self._rewind(offset, self._epoch)
        return True

    def _rewind(self, offset: int, epoch: int) -> None:
        if epoch != self._epoch or not self._low <= offset < self._next:
            return  # the stream went meanwhile (delivery restarted at the floor) or it was acknowledged
        self.redelivered += sum(1 for o in range(offset, self._next) if o not in self._acked)
        self._position += 1  # a read in progress for the old position is dropped
        while self._sent and self._sent[-1][0] >= offset:
            self._release(self._sent.pop()[1])
        self._next = offset if not self._sent else max(offset, self._sent[-1][0] + 1)
        self._wake.set()

    @property
    def cursor(self) -> int:
        return self._low - 1

    @property
    def backlog(self) -> int:
        return max(0, self._wal.committed_offset - self._low)

    @property
    def unacked(self) -> int:
        return max(0, self._next - self._low - len(self._acked))

    @property
    def held_bytes(self) -> int:
        """Bytes sent and not acknowledged."""
        return self._unacked_bytes

    def stop_streams(self) -> None:
        self.stopped = True
        self._wake.set()

    async def close(self, *, save: bool = True) -> None:
        self.stop_streams()
        self._budget.forget(self._wake.set)
        self._sent.clear()
        self._release(self._unacked_bytes)
        if save:
            await self.save_cursor()

    async def save_cursor(self) -> None:
        async with self._save_lock:
            floor = self._low - 1
            if floor > self._saved:
                await self._save_cursor(floor)
                self._saved = floor
            self._acks_since_save = 0
            self._next_save = self._loop.time() + self._config.cursor_flush_ms / 1000

    # -- what the holding stream calls ----------------------------------------------------------------

    def acknowledge(self, up_to: int | None, offsets: list[int]) -> int:
        """Cumulative (`up_to`: every offset up to it) and individual acks of sent offsets; how many
        offsets became acknowledged."""
        before = self._low + len(self._acked)
        if up_to is not None and up_to >= self._low:
            self._low = min(up_to + 1, self._next)
            self._acked = {o for o in self._acked if o >= self._low}
        for o in offsets:
            if self._low <= o < self._next:
                self._acked.add(o)
        while self._low in self._acked:
            self._acked.discard(self._low)
            self._low += 1
        while self._sent and self._sent[0][0] < self._low:
            self._release(self._sent.popleft()[1])
        done = self._low + len(self._acked) - before
        self._acks_since_save += done
        self._wake.set()
        return done

    async def next_records(self, window: int) -> tuple[bytes, int, int] | None:
        """The next whole batches to send (data, first offset, last offset), once the window (at most
        [dispatch] window_bytes) and the broker's budget have room and the WAL has something committed past
        what was sent; saves the cursor when it is due. None once the dispatcher is stopped or closed: the
        stream must end."""
        window = min(window, self._config.window_bytes)
        epoch = self._epoch
        while True:
            self._wake.clear()
            if self.stopped or self._epoch != epoch:
                return None
            if self._acks_since_save >= self._config.cursor_flush_acks or \
                    self._loop.time() >= self._next_save:
                await self.save_cursor()
            waiting = self._unacked_bytes >= window or self._next >= self._wal.committed_offset
            if not waiting and self._unacked_bytes and self._budget.spent:
                self._budget.wait(self._wake.set)
                waiting = True
            if not waiting:
                position = self._position
                try:
                    got = await self._wal.read(self._next, min(READ_BYTES, window))
                except OffsetOutOfRange:  # retention deleted what was not consumed
                    self._next = self._low = self._wal.start_offset
                    continue
                if self._epoch != epoch:
                    return None  # the stream this read was for is gone (a cancel can arrive too late)
                if self._position != position:
                    continue  # a nack moved the position back while this read ran
                if got is not None:
                    data, next_offset = got
                    first = frames.parse_header(data).base_offset
                    chunks = [data]
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
                    return b"".join(chunks), first, next_offset - 1
            timeout = max(0.001, self._next_save - self._loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

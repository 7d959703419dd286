"""A Reliable subscription's cursor: the contiguous ack floor, the acks above it, and when it is saved.

The subscription owns one Cursor for its whole life; whichever dispatcher serves it (per message,
dispatch/reliable.py, or whole batches to a fast-API stream, dispatch/batches.py) moves it, so switching
between the two keeps the position. What is persisted, under the subscription's cursor key
(docs/METADATA.md#topic-keys), is `floor`: every offset up to it is acknowledged, so a restart resumes at
`low` and never skips an unacknowledged record. Acks above the floor (`acked`) are kept in memory only:
after a restart they come again (at least once).

Flush policy: the floor is written after `cursor_flush_acks` acknowledgements or `cursor_flush_ms`, whichever
comes first (`due`; the dispatchers start such a save beside their work, `start_save`), and when the
dispatcher closes. Writes are serialised and only ever move the stored cursor forward, except an operator's
move (`move_to`: seek and skip, broker/positions.py).

Delayed records (Shared and Key-Shared, dispatch/delays.py) do not hold the floor back: a subscription with a
record due tomorrow acknowledges everything else meanwhile. What they need instead is saved with the floor, in
the same write: `Delayed`, from which offset the log must be read again after a restart for records whose
time is at or after `from_time`. The per-message dispatcher provides it (`delayed_source`); a dispatcher
that does not know about delays leaves the stored one as it is.

Ownership: the dispatcher that serves the subscription calls everything here, on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from danube_fast.broker.config import DispatchConfig
from danube_fast.errors import DanubeError

log = logging.getLogger("danube_fast.broker")


@dataclass(frozen=True)
class Delayed:
    """Delayed records not yet acknowledged are at offsets >= from_offset with times >= from_time."""

    from_offset: int
    from_time: int


class Keep:
    """Leave the stored delayed state as it is."""


KEEP = Keep()
Saver = Callable[[int, "Delayed | Keep | None"], Awaitable[None]]
WALK = 64  # offsets settle_below walks one by one before it jumps to the first held offset


class Cursor:
    def __init__(self, start: int, save: Saver, config: DispatchConfig, delayed: Delayed | None = None
                 ) -> None:
        """`start`: the first offset not acknowledged; `save(floor, delayed)` persists the floor and the
        delayed state (fenced, one write); `delayed`: the state stored."""
        self._save = save
        self.delayed = delayed  # as last stored
        self.delayed_source: Callable[[], Delayed | None] | None = None
        self._config = config
        self._loop = asyncio.get_running_loop()
        self.low = start  # the lowest offset not acknowledged
        self.acked: set[int] = set()  # acknowledged one by one, above the floor
        self._saved = start - 1
        self._acks_since_save = 0
        self._next_save = self._loop.time() + config.cursor_flush_ms / 1000
        self._lock = asyncio.Lock()
        self._saving: asyncio.Task[None] | None = None  # the save start_save began, while it runs

    @property
    def floor(self) -> int:
        """Every offset up to `floor` is acknowledged."""
        return self.low - 1

    # -- moving it -----------------------------------------------------------------------------------

    def acknowledge(self, up_to: int | None, offsets: list[int], limit: int) -> int:
        """Cumulative (`up_to`: every offset up to it) and individual acks of offsets below `limit` (what was
        sent); how many offsets became acknowledged."""
        before = self.low + len(self.acked)
        if up_to is not None and up_to >= self.low:
            self.low = min(up_to + 1, limit)
            self.acked = {o for o in self.acked if o >= self.low}
        for o in offsets:
            if self.low <= o < limit:
                self.acked.add(o)
        while self.low in self.acked:
            self.acked.discard(self.low)
            self.low += 1
        done = self.low + len(self.acked) - before
        self._acks_since_save += done
        return done

    def settle_below(self, limit: int, pending: Collection[int], waiting: Collection[int]) -> None:
        """Move the floor over every offset below `limit` that is neither `pending` nor `waiting` (the
        per-message dispatcher's rule: what it read and no longer holds is done: acknowledged,
        dead-lettered, or dropped for want of a consumer). Individual acks are not kept for it: their
        number would grow with the time the floor waits for one message's redelivery.

        A few offsets are walked one by one (an ack usually moves the floor by one); past WALK the floor
        jumps to the first offset still held. Offsets are not dense: a topic taken over after a crash goes
        on a whole reservation (10 million offsets) higher (docs/TOPIC_MOVE.md), and walking that gap once
        per ack held the event loop for seconds, long enough for the broker to lose its lease."""
        low = self.low
        stop = min(limit, low + WALK)
        while low < stop and low not in pending and low not in waiting:
            low += 1
        if low == stop < limit:
            low = min((o for held in (pending, waiting) for o in held if low <= o < limit), default=limit)
        self.low = low

    def counted(self, acks: int = 1) -> None:
        """`acks` acknowledgements the dispatcher settled itself (for the flush policy)."""
        self._acks_since_save += acks

    def skip_to(self, offset: int) -> None:
        """Retention deleted what was not consumed: the floor jumps to the first offset kept."""
        if offset > self.low:
            self.low = offset
            self.acked = {o for o in self.acked if o >= offset}

    async def move_to(self, offset: int) -> None:
        """An operator moved the subscription (seek, skip): `offset` is the next to deliver, backwards too.
        Persisted before it takes effect; the dispatcher that moves the cursor is stopped meanwhile (an ack
        landing during the write is overwritten). A failed write raises and changes nothing."""
        async with self._lock:
            await self._save(offset - 1, None)
            self._saved = offset - 1
            self.delayed = None
            self.low = offset
            self.acked.clear()
            self._acks_since_save = 0

    def forget_acks(self) -> int:
        """The stream that sent the acks above the floor went: they are delivered again. How many there
        were."""
        count = len(self.acked)
        self.acked.clear()
        return count

    # -- saving it -----------------------------------------------------------------------------------

    def due(self, now: float) -> bool:
        return self._acks_since_save >= self._config.cursor_flush_acks or now >= self._next_save

    @property
    def next_save(self) -> float:
        """Loop time at which the floor is due even without more acks."""
        return self._next_save

    @property
    def saving(self) -> bool:
        return self._saving is not None

    def start_save(self, whose: str, done: Callable[[], None]) -> None:
        """A save beside the dispatcher's work rather than in its way: a dispatcher that awaited each one
        stalled its deliveries for a store commit every `cursor_flush_acks` acks, which 1,000-record batches
        reach at every delivery (bench/RESULTS.md "Fast API"). At most one runs; `done` is called when it
        ends. A failed write is logged (`whose` cursor) and tried again when the next save is due."""
        if self._saving is None:
            self._saving = asyncio.create_task(self._save_beside(whose, done))

    async def _save_beside(self, whose: str, done: Callable[[], None]) -> None:
        try:
            await self.save()
        except DanubeError as e:  # ownership lost (an unload ends the dispatcher) or the store is away
            log.warning("%s: cursor not saved: %s", whose, e)
        finally:
            self._saving = None
            done()

    async def settled(self) -> None:
        """Once the save start_save began, if any, has ended."""
        if self._saving is not None:
            await asyncio.gather(self._saving, return_exceptions=True)

    async def save(self) -> None:
        """Write the floor if it moved, and the delayed state if it changed. A failed write raises, and is
        tried again when the next save is due, not at once (the floor stays in memory meanwhile)."""
        async with self._lock:
            floor = self.low - 1
            delayed = self.delayed_source() if self.delayed_source is not None else KEEP
            try:
                if floor > self._saved or (delayed is not KEEP and delayed != self.delayed):
                    await self._save(max(floor, self._saved), delayed)
                    self._saved = max(floor, self._saved)
                    if not isinstance(delayed, Keep):
                        self.delayed = delayed
            finally:
                self._acks_since_save = 0
                self._next_save = self._loop.time() + self._config.cursor_flush_ms / 1000

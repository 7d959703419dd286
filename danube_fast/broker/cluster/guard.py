"""What stands between a clustered topic and an acknowledgement it has no right to give.

Per topic, `TopicGuard` holds the broker's Ownership of the assignment (danube_fast.meta.fencing) and the
topic's offset Reservation (handoff.py):
- `admit(n)` before n records are appended: refuses once the topic is closing or its ownership is known
  lost, reads the assignment again (revalidates) after the broker's lease changed or the process was
  paused (see membership.py; a revalidation that cannot reach the store refuses), and keeps the
  reservation ahead of the offsets;
- `done()` when that append finished, whatever its outcome (`settle()` waits for every admitted append,
  so the sealed state covers all of them);
- `confirm()` before the append is acknowledged: the ownership checks again, since the fsync may have
  outlasted the lease (not the closing flag: an append admitted before the unload began is sealed with the
  topic, so acknowledging it is right). When the assignment was found gone meanwhile (an unload deletes it
  before this broker seals), `confirm` waits for the placement's decision: a seal covers the append, so it
  is acknowledged (refusing would make the client store it a second time at the next owner); a loss
  refuses it;
- `write(ops)`: every metadata write the owner makes (cursors, descriptors, reservations, the sealed state)
  is a transaction fenced on the assignment, or, while sealing after an unload, on the unload marker that
  names this broker; a write refused in between (the assignment is gone, the seal not begun) waits for the
  placement's decision the way `confirm` does, and is made again under the marker's fence.

Refusals are UNAVAILABLE: the official client backs off, looks the topic up again and goes to the new owner.
Owner: the topic (on the event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from danube_fast.broker.cluster.handoff import Reservation
from danube_fast.errors import ApiError, unavailable
from danube_fast.meta.fencing import Ownership, OwnershipLost
from danube_fast.meta.store import MetadataError, Op, TxnResult

log = logging.getLogger("danube_fast.cluster")

DECISION_WAIT = 5.0  # seconds `confirm` waits for the placement to seal or drop a topic whose assignment went


Write = Callable[[Sequence[Op]], Awaitable[TxnResult]]


class TopicGuard:
    def __init__(self, full_name: str, ownership: Ownership, epoch: Callable[[], tuple[int, int]],
                 paused: Callable[[], bool],
                 reservation: Callable[[Write], Reservation] | None = None) -> None:
        """`reservation`: builds the topic's offset reservation around this guard's `write`."""
        self.full = full_name
        self.ownership = ownership
        self._epoch = epoch  # (lease session, pause count) of the broker
        self._paused = paused
        self._validated = epoch()
        self.reservation = reservation(self.write) if reservation is not None else None
        self._next = 0  # the offset the next admitted record gets (Reliable)
        self._closing = asyncio.Event()
        self._pending = 0  # admitted appends not done yet
        self._idle = asyncio.Event()
        self._idle.set()
        self._extending: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one revalidation or reservation write at a time
        self._order = asyncio.Lock()  # admissions in arrival order (asyncio.Lock is FIFO)

    def start_at(self, offset: int) -> None:
        self._next = offset

    def stores_nothing(self) -> None:
        """A NonReliable topic: nothing is appended, so no offsets are reserved."""
        self.reservation = None

    def fence_on(self, ownership: Ownership) -> None:
        """From now on every check and write is fenced on `ownership` (an unload marker's: the seal)."""
        self.ownership = ownership

    @property
    def closing(self) -> bool:
        """The topic is being unloaded (sealed or dropped): no new appends."""
        return self._closing.is_set()

    def close(self) -> None:
        self._closing.set()

    def _refuse(self, why: str) -> ApiError:
        return unavailable(f"{self.full} is not served by this broker any more ({why}): redo the lookup")

    async def _check(self, admitting: bool) -> None:
        if admitting and self.closing:
            raise self._refuse("it is moving")
        try:
            reason = self.ownership.lost_reason
            if reason is not None:
                raise OwnershipLost(reason)
            if self._epoch() != self._validated or self._paused():
                async with self._lock:
                    if self._epoch() != self._validated or self._paused():
                        epoch = self._epoch()
                        await self.ownership.revalidate(check=False)
                        self._validated = epoch
                        log.info("%s: ownership revalidated (new lease or a pause)", self.full)
        except OwnershipLost as e:
            raise self._refuse(str(e)) from e
        except MetadataError as e:
            raise unavailable(f"{self.full}: cannot confirm ownership: {e}") from e

    async def admit(self, records: int) -> None:
        """Raises, or returns with the append counted as pending: the caller calls `done()` after it and
        appends right away (no await in between), so appends reach the WAL in the order they were admitted.
        Admissions are first come, first served: one that must wait (a revalidation, a reservation being
        written) holds back those after it, which would otherwise overtake it and reorder a producer's
        batches."""
        async with self._order:
            await self._check(True)
            reservation = self.reservation
            if reservation is not None:
                last = self._next + records - 1
                if reservation.needs(last):
                    async with self._lock:
                        if reservation.needs(last):
                            await self._extend(last)
                    if self.closing:  # the unload began while the reservation was written
                        raise self._refuse("it is moving")
                elif reservation.low(last) and self._extending is None:
                    self._extending = asyncio.create_task(self._extend_quietly(last))
                self._next += records
            self._pending += 1
            self._idle.clear()

    def done(self) -> None:
        self._pending -= 1
        if not self._pending:
            self._idle.set()

    async def confirm(self) -> None:
        ownership = self.ownership
        try:
            await self._check(False)
        except ApiError:
            if ownership.lost_reason is None or not await self._resealed(ownership):
                raise
            await self._check(False)

    async def _resealed(self, lost: Ownership) -> bool:
        """After `lost` failed a fence: wait (up to DECISION_WAIT) for the placement to decide, and say
        whether it seals the topic here, i.e. replaced `lost` with the unload marker's fence. An unload
        deletes the assignment before this broker seals, so what it writes or appends in between belongs
        to the seal; a loss leaves `lost` in place."""
        if not self.closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(DECISION_WAIT):
                    await self._closing.wait()
        return self.ownership is not lost

    async def _extend(self, last: int) -> None:
        assert self.reservation is not None
        try:
            await self.reservation.extend(last)
        except OwnershipLost as e:
            raise self._refuse(str(e)) from e
        except MetadataError as e:
            raise unavailable(f"{self.full}: cannot reserve offsets: {e}") from e

    async def _extend_quietly(self, last: int) -> None:
        try:
            async with self._lock:
                await self._extend(last)
        except ApiError as e:
            log.warning("%s: %s", self.full, e)
        finally:
            self._extending = None

    async def write(self, ops: Sequence[Op]) -> TxnResult:
        ownership = self.ownership
        try:
            return await ownership.write_fenced(ops)
        except OwnershipLost:
            if not await self._resealed(ownership):
                raise
            return await self.ownership.write_fenced(ops)

    async def settle(self) -> None:
        """After `closing` is set: wait for every admitted append and for a background reservation write, so
        that the seal covers every append and nothing is written after it."""
        await self._idle.wait()
        task = self._extending
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

"""The broker's byte budget for delivery ([dispatch] broker_bytes), shared by every dispatcher.

What counts, in bytes of records (their share of their batch in the WAL) or, NonReliable, of payloads:
- Reliable, Danube API: from the WAL read until the message is acknowledged, dead-lettered or dropped (no
  consumer's key filter accepts it), or the dispatcher closes. That covers read-ahead, messages queued for a
  stream, delivered and unacknowledged, and waiting for redelivery: all of it is held in memory.
- Reliable, fast API: what was sent and not acknowledged, released by acks, a nack (delivery goes back, the
  bytes are read again) and the stream's end; and the one read ahead of a subscription behind the tail
  (read_ahead.py: the size it asked) until its delivery takes it or it is dropped.
- NonReliable: messages queued for a consumer's stream until the stream takes them (or the stream goes).
- The offset reader (FastReader Read, the native READ): each read's next response, from before it is read
  until it left the connection's buffer (`ReadBudget`, below).

Beyond the budget, Reliable dispatch reads nothing more from the WAL (the data waits there) and NonReliable
dispatch drops, counted per subscription as when a consumer's buffer is full. A Reliable subscription that
holds nothing may still read once, and a NonReliable consumer whose buffer is empty may still take one
message, so that a few stalled consumers slow everybody else down instead of stopping them for as long as
they stall; the bound is then the budget plus one read per Reliable subscription and one message per
NonReliable consumer.

Ownership: the event loop. Dispatchers `take` and `give`; one blocked on the budget asks to be woken by
`wait` and is, once bytes were given back and the budget has room again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class ByteBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held = 0
        self._waiting: dict[Callable[[], None], None] = {}  # wake-ups, in the order they asked

    @property
    def held(self) -> int:
        return self._held

    @property
    def spent(self) -> bool:
        return self._held >= self.limit

    def room_for(self, size: int) -> bool:
        return self._held + size <= self.limit

    def take(self, size: int) -> None:
        self._held += size

    def give(self, size: int) -> None:
        self._held -= size
        if self._waiting and self._held < self.limit:
            waiting, self._waiting = self._waiting, {}
            for wake in waiting:
                wake()

    def wait(self, wake: Callable[[], None]) -> None:
        """Call `wake` (once) the next time bytes are given back and the budget has room."""
        self._waiting[wake] = None

    def forget(self, wake: Callable[[], None]) -> None:
        self._waiting.pop(wake, None)


class ReadBudget:
    """The offset reader's share of the broker's ByteBudget (FastReader Read and the native transport's
    READ: docs/TRANSPORT.md, "Limits"). A read reserves its next response's bytes before reading them and
    gives them back once the response left its connection's buffer, so that the responses of every read
    in flight, on every connection, are held within the budget the dispatchers share.

    Beyond the budget a read waits for room, but one read at a time may go over it: dispatchers of stalled
    consumers may hold the whole budget for as long as they stall, and reads must not stop for them (as a
    Reliable subscription that holds nothing may still read once). The bound is the budget plus one
    response (at most MAX_READ_BYTES, or one batch when a single batch is larger).

    Ownership: the event loop; one per broker (BrokerContext.reads).
    """

    def __init__(self, budget: ByteBudget) -> None:
        self._budget = budget
        self._over = False  # a read holds bytes past the budget now
        self._waiting: dict[Callable[[], None], None] = {}  # reads waiting for the one over it to end

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def reserve(self, size: int) -> Reservation:
        """`size` bytes for a response: at once when the budget has room or no read is over it, else once
        one of the two is so."""
        budget = self._budget
        while not budget.room_for(size) and self._over:
            woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def wake(done: asyncio.Future[None] = woken) -> None:
                if not done.done():
                    done.set_result(None)

            budget.wait(wake)
            self._waiting[wake] = None
            try:
                await woken
            finally:
                budget.forget(wake)
                self._waiting.pop(wake, None)
        over = not budget.room_for(size)
        if over:
            self._over = True
        budget.take(size)
        return Reservation(self, size, over)

    def _release(self, reservation: Reservation) -> None:
        self._budget.give(reservation.size)
        if reservation.over:
            self._over = False
            waiting, self._waiting = self._waiting, {}
            for wake in waiting:
                wake()


class Reservation:
    """Bytes a read holds for one response; `grow` when the response is larger (a single batch over the
    size asked), `release` once it was sent (or the read ended). Release is idempotent."""

    def __init__(self, owner: ReadBudget, size: int, over: bool) -> None:
        self._owner = owner
        self.size = size
        self.over = over
        self._released = False

    def grow(self, size: int) -> None:
        if size > self.size and not self._released:
            self._owner._budget.take(size - self.size)
            self.size = size

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._owner._release(self)

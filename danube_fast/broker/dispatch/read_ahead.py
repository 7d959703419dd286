"""One read ahead for a dispatcher that reads a topic's log in order: the next read starts while the
previous delivery is on its way to the consumer, so the disk (or the object store) and the network work at
the same time instead of in turns.

Why: a fast consumer catching up gets one read per delivery, and the Consume stream sends a delivery only
after the read it comes from. With 64 KiB records, a 1 MiB read from the device took about 0.7 ms and
sending it about as long, one after the other (docs/ARCHITECTURE.md, "Read ahead").

Owner: the dispatcher that made it, on the event loop. The bytes of the read in progress or done and not yet
taken count in the broker's ByteBudget (budget.py) from the start of the read until `take` or `drop`, and a
read ahead starts only when the budget has room for it, so read-ahead never takes memory the budget does not
allow. A read ahead is keyed by what the dispatcher would ask (offset, size) and by its own state (the
stream's epoch, the position a nack moves); `take` with any other key drops it and reads anew.
"""

from __future__ import annotations

import asyncio
import contextlib

from danube_fast.broker.dispatch.budget import ByteBudget
from danube_fast.storage.file_span import FileSpan
from danube_fast.storage.objects.format import Buffer
from danube_fast.storage.tiered import ReadableLog

Got = tuple[Buffer | FileSpan, int] | None  # what ReadableLog.read(_span) returns: (batches, next offset)
Key = tuple[int, int, int, int, bool]  # (epoch, position, offset, size, spans: ReadableLog.read_span)


class ReadAhead:
    def __init__(self, log: ReadableLog, budget: ByteBudget) -> None:
        self._log = log
        self._budget = budget
        self._task: asyncio.Future[Got] | None = None
        self._key: Key | None = None
        self.held = 0  # bytes taken from the budget for the read ahead (its size asked: an upper bound)
        self.started = 0
        self.used = 0

    def start(self, key: Key) -> None:
        """Read (offset, size) of `key` now, unless the budget has no room for it."""
        self.drop()
        size = key[3]
        if not self._budget.room_for(size):
            return
        self._budget.take(size)
        self.held = size
        self._key = key
        self._task = asyncio.ensure_future(self._read(key))
        self._task.add_done_callback(_retrieve)
        self.started += 1

    async def take(self, key: Key) -> Got:
        """The read of `key`: the one started ahead when it was for the same key, else a new read."""
        task, same = self._task, self._key == key
        if task is not None and same:
            self._task = self._key = None
            self._release()
            self.used += 1
            return await task
        self.drop()
        return await self._read(key)

    async def _read(self, key: Key) -> Got:
        return await (self._log.read_span if key[4] else self._log.read)(key[2], key[3])

    def drop(self) -> None:
        """Forget the read ahead (the position moved, the stream went, the dispatcher closes)."""
        if self._task is not None:
            self._task.cancel()  # a read already in the executor runs on; its result is dropped
            self._task = self._key = None
        self._release()

    def _release(self) -> None:
        if self.held:
            self._budget.give(self.held)
            self.held = 0


def _retrieve(task: asyncio.Future[Got]) -> None:
    """A dropped read ahead that failed (the log closed, retention) is not an error: the next real read
    meets the same failure and handles it."""
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.exception()

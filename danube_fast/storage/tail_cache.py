"""Recently committed WAL data kept in memory, so readers at the tail never touch the disk."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Buffer


@dataclass(frozen=True)
class CachedGroup:
    """One group commit: `data` holds records first..next_offset-1 as whole batches. `starts[i]` is the
    first offset of the appended buffer that begins at byte `positions[i]` of `data`."""

    first: int
    next_offset: int
    data: Buffer  # the group as the WAL stamped it (AppendResult.data)
    starts: list[int]
    positions: list[int]

    def from_offset(self, offset: int, max_bytes: int) -> tuple[memoryview, int]:
        """Whole appended buffers of this group from the one that holds `offset`, about max_bytes of them
        (at least one), and the offset after the last record returned."""
        i = max(bisect.bisect_right(self.starts, offset) - 1, 0)
        start = self.positions[i]
        # Buffers i..j-1 go out: j is the last buffer start within max_bytes, so j-1 ends inside it.
        j = max(bisect.bisect_right(self.positions, start + max_bytes, lo=i + 1) - 1, i + 1)
        if j >= len(self.positions):
            return memoryview(self.data)[start:], self.next_offset
        return memoryview(self.data)[start : self.positions[j]], self.starts[j]


class CacheBudget:
    """What every tail cache of a broker holds together: at most `max_bytes` ([wal] cache_total_bytes). When a
    group added anywhere takes the total over it, the oldest groups go first, whichever topic holds them.

    Why: with a bound per topic alone, the caches of many busy topics held their bound each, and a single busy
    topic was held to a bound sized for many, while memory sat unused: a consumer catching up on what was just
    written read it back from the disk, where the peers' brokers read it from the page cache. Direct appends
    keep recent data out of the page cache, so this cache is the only copy in memory (docs/ARCHITECTURE.md,
    "Tail cache").

    Owned by the event loop thread, as the caches are. `_order` lists every group added, oldest first, as
    (cache, its number in that cache); a group its cache dropped since (its own bound, retention, idle
    release, close) stays listed until it comes to the front or the list is compacted."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, not {max_bytes}")
        self.max_bytes = max_bytes
        self.nbytes = 0  # held by every cache together
        self._groups = 0  # ... in this many groups
        self._order: deque[tuple[BatchCache, int]] = deque()

    def _added(self, cache: BatchCache, number: int, size: int) -> None:
        self._order.append((cache, number))
        self.nbytes += size
        self._groups += 1
        while self.nbytes > self.max_bytes and self._order:
            oldest, n = self._order.popleft()
            oldest._evict(n)
        if len(self._order) > 2 * self._groups + 1024:
            self._order = deque(entry for entry in self._order if entry[0]._holds(entry[1]))

    def _dropped(self, groups: int, size: int) -> None:
        self._groups -= groups
        self.nbytes -= size


class BatchCache:
    """A FIFO of CachedGroups bounded in bytes (`max_bytes`: at least the newest group stays), and by the
    broker's CacheBudget when it has one. Owned by the event loop thread."""

    def __init__(self, max_bytes: int, budget: CacheBudget | None = None) -> None:
        self._max_bytes = max_bytes
        self._budget = budget
        self._bytes = 0
        self._groups: deque[CachedGroup] = deque()
        self._firsts: deque[int] = deque()
        self._numbers: deque[int] = deque()  # each group's number, in the order added
        self._count = 0  # groups ever added: the next one's number

    def add(self, group: CachedGroup) -> None:
        size = memoryview(group.data).nbytes
        self._count += 1
        self._groups.append(group)
        self._firsts.append(group.first)
        self._numbers.append(self._count)
        self._bytes += size
        while self._bytes > self._max_bytes and len(self._groups) > 1:
            self._drop_oldest()
        if self._budget is not None:
            self._budget._added(self, self._count, size)

    def _drop_oldest(self) -> None:
        old = self._groups.popleft()
        self._firsts.popleft()
        self._numbers.popleft()
        size = memoryview(old.data).nbytes
        self._bytes -= size
        if self._budget is not None:
            self._budget._dropped(1, size)

    def _evict(self, number: int) -> None:
        """The budget's eviction: drop group `number` if it is still here (then it is the oldest)."""
        if self._numbers and self._numbers[0] == number:
            self._drop_oldest()

    def _holds(self, number: int) -> bool:
        return bool(self._numbers) and number >= self._numbers[0]

    def find(self, offset: int) -> CachedGroup | None:
        """The cached group holding `offset`, or None if it is older than the cache (or not written)."""
        if not self._groups or offset < self._firsts[0] or offset >= self._groups[-1].next_offset:
            return None
        return self._groups[bisect.bisect_right(self._firsts, offset) - 1]

    def clear(self) -> None:
        if self._budget is not None:
            self._budget._dropped(len(self._groups), self._bytes)
        self._groups.clear()
        self._firsts.clear()
        self._numbers.clear()
        self._bytes = 0

    def drop_before(self, offset: int) -> None:
        while self._groups and self._groups[0].next_offset <= offset:
            self._drop_oldest()

    @property
    def nbytes(self) -> int:
        return self._bytes

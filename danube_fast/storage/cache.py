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


class BatchCache:
    """A FIFO of CachedGroups bounded in bytes. Owned by the event loop thread."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._groups: deque[CachedGroup] = deque()
        self._firsts: deque[int] = deque()

    def add(self, group: CachedGroup) -> None:
        self._groups.append(group)
        self._firsts.append(group.first)
        self._bytes += memoryview(group.data).nbytes
        while self._bytes > self._max_bytes and len(self._groups) > 1:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        old = self._groups.popleft()
        self._firsts.popleft()
        self._bytes -= memoryview(old.data).nbytes

    def find(self, offset: int) -> CachedGroup | None:
        """The cached group holding `offset`, or None if it is older than the cache (or not written)."""
        if not self._groups or offset < self._firsts[0] or offset >= self._groups[-1].next_offset:
            return None
        return self._groups[bisect.bisect_right(self._firsts, offset) - 1]

    def clear(self) -> None:
        self._groups.clear()
        self._firsts.clear()
        self._bytes = 0

    def drop_before(self, offset: int) -> None:
        while self._groups and self._groups[0].next_offset <= offset:
            self._drop_oldest()

    @property
    def nbytes(self) -> int:
        return self._bytes

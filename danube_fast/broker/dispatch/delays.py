"""A Shared or Key-Shared subscription's delayed records, by time, bounded in memory (docs/SUBSCRIPTIONS.md,
"Delayed delivery").

No Python object per record: entries live in `array('q')` buckets. Far ones in coarse buckets of COARSE_MS
as (time, offset) pairs, 16 bytes each; the earliest coarse bucket is split into fine buckets of FINE_MS
holding offsets only. A fine bucket is released whole once its end has passed, so a record is delivered no
earlier than its time and at most FINE_MS after it (Pulsar's tracker has a tick of a second the same way).

At most `limit` entries are held. Beyond it the buckets with the latest times go (down to 90% of the
limit), and `cut` says from which time on the index is incomplete: a record at or after `cut` is not held,
and `spill_from` is the lowest offset of one left out. The dispatcher reads those records again from the
log (they carry their time) once the index has room or their time comes: the log is the spill file.

Ownership: the ReliableDispatcher of one subscription, on the event loop.
"""

from __future__ import annotations

import heapq
from array import array

COARSE_MS = 60_000
FINE_MS = 100
EVICT_TO = 0.9  # of the limit, once it is passed: evictions come in batches, not one per record


class DelayIndex:
    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._coarse: dict[int, array[int]] = {}  # coarse id -> time, offset, time, offset, ...
        self._coarse_ids: list[int] = []  # a heap; an id whose bucket went is skipped when popped
        self._front = -1  # the coarse id split into fine buckets: entries up to it go there
        self._fine: dict[int, array[int]] = {}  # fine id -> offsets
        self._fine_ids: list[int] = []  # a heap, as _coarse_ids
        self._count = 0
        self.cut: int | None = None  # entries at or after this time (ms) are not held
        self.spill_from: int | None = None  # the lowest offset of an entry not held

    def __len__(self) -> int:
        return self._count

    def add(self, at: int, offset: int) -> None:
        """Deliver `offset` once time `at` (ms) has passed."""
        if self.cut is not None and at >= self.cut:
            self._left_out(offset)
            return
        if at // COARSE_MS <= self._front:
            self._put(self._fine, self._fine_ids, at // FINE_MS).append(offset)
        else:
            bucket = self._put(self._coarse, self._coarse_ids, at // COARSE_MS)
            bucket.append(at)
            bucket.append(offset)
        self._count += 1
        if self._count > self._limit:
            self._evict()

    def due(self, now: int, limit: int) -> list[int]:
        """Up to `limit` offsets whose fine bucket had ended by `now` (ms), taken out, in offset order."""
        out: list[int] = []
        while len(out) < limit:
            self._split_next()
            if not self._fine_ids or (self._fine_ids[0] + 1) * FINE_MS > now:
                break
            key = self._fine_ids[0]
            bucket = self._fine.get(key)
            room = limit - len(out)
            if bucket is None or len(bucket) <= room:
                heapq.heappop(self._fine_ids)
                self._fine.pop(key, None)
                out.extend(bucket or ())
            else:
                out.extend(bucket[:room])
                del bucket[:room]
        self._count -= len(out)
        out.sort()
        return out

    def next_release(self) -> int | None:
        """When (ms) the next fine bucket is released; None when nothing is held."""
        self._split_next()
        return (self._fine_ids[0] + 1) * FINE_MS if self._fine_ids else None

    def earliest(self) -> int | None:
        """A time (ms) at or before every held entry's."""
        self._split_next()
        if self._fine_ids:
            return self._fine_ids[0] * FINE_MS
        return None

    def lowest_offset(self) -> int | None:
        """The lowest offset held (a pass over the buckets: called when the cursor is saved)."""
        lows = [min(b) for b in self._fine.values() if b]
        lows += [min(b[1::2]) for b in self._coarse.values() if b]
        return min(lows, default=None)

    def take_spill(self) -> tuple[int, int] | None:
        """(spill_from, cut) when entries were left out, and forget them: the caller reads them again."""
        if self.cut is None or self.spill_from is None:
            self.cut = self.spill_from = None
            return None
        spilled = (self.spill_from, self.cut)
        self.cut = self.spill_from = None
        return spilled

    # -- inside ---------------------------------------------------------------------------------------

    @staticmethod
    def _put(buckets: dict[int, array[int]], ids: list[int], key: int) -> array[int]:
        bucket = buckets.get(key)
        if bucket is None:
            bucket = buckets[key] = array("q")
            heapq.heappush(ids, key)
        return bucket

    def _split_next(self) -> None:
        """With no fine bucket left, split the earliest coarse one."""
        while not self._fine_ids and self._coarse_ids:
            key = heapq.heappop(self._coarse_ids)
            bucket = self._coarse.pop(key, None)
            if bucket is None:
                continue
            self._front = key
            for i in range(0, len(bucket), 2):
                self._put(self._fine, self._fine_ids, bucket[i] // FINE_MS).append(bucket[i + 1])

    def _left_out(self, offset: int) -> None:
        if self.spill_from is None or offset < self.spill_from:
            self.spill_from = offset

    def _evict(self) -> None:
        """Drop the latest buckets until EVICT_TO of the limit is left; `cut` becomes the earliest time
        dropped, so that no held entry is at or after it."""
        target = int(self._limit * EVICT_TO)
        for kind, width, pairs in ((self._coarse, COARSE_MS, True), (self._fine, FINE_MS, False)):
            for key in sorted(kind, reverse=True):
                if self._count <= target:
                    return
                bucket = kind.pop(key)
                offsets = bucket[1::2] if pairs else bucket
                self._count -= len(offsets)
                if offsets:
                    self._left_out(min(offsets))
                self.cut = key * width

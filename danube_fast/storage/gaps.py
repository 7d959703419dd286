"""Gaps in a topic's offsets and the tiered reader that waits at them.

A gap is a range of offsets a dead owner's WAL holds (its offset reservation outran what reached the object
tier before it died; broker/cluster/handoff.py records gaps in the topic's state key). Until that broker
has recovered the range into the object tier, a reader that reaches it waits (RecoveryPending, which the
dispatchers retry) rather than skip records it would never see again; after the wait it reads past the
range like any hole, with a warning. A reader in a hole before a gap waits at the gap too, rather than skip
to what lies after it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from danube_fast.errors import StorageError
from danube_fast.meta.resources_storage import ObjectDescriptor
from danube_fast.storage import file_span
from danube_fast.storage.file_span import FileSpan
from danube_fast.storage.tiered import CloudReader, TopicLog
from danube_fast.storage.wal import Buffer, Wal

log = logging.getLogger("danube_fast.tier")

Gap = tuple[int, int, int]  # first, last offset, the broker whose WAL holds them


def open_gaps(gaps: Sequence[Gap], found: Sequence[ObjectDescriptor]) -> list[Gap]:
    """The gaps not yet covered end to end by descriptors."""
    still = []
    for first, last, broker in gaps:
        covered = first
        for d in found:
            if d.start_offset <= covered <= d.end_offset:
                covered = d.end_offset + 1
        if covered <= last:
            still.append((covered, last, broker))
    return still


def uncovered(first: int, last: int, found: Sequence[ObjectDescriptor]) -> list[tuple[int, int]]:
    """Every run of offsets in first..last that no descriptor covers (open_gaps stops at the first)."""
    runs = []
    at = first
    for d in sorted(found, key=lambda d: d.start_offset):
        if d.end_offset < at or d.start_offset > last:
            continue
        if d.start_offset > at:
            runs.append((at, d.start_offset - 1))
        at = max(at, d.end_offset + 1)
    if at <= last:
        runs.append((at, last))
    return runs


def gaps_from(gaps: Sequence[Gap], floor: int) -> list[Gap]:
    """`gaps` cut at `floor`, below which retention deleted everything (nothing there is pending)."""
    return [(max(first, floor), last, broker) for first, last, broker in gaps if last >= floor]


class RecoveryPending(StorageError):
    """The offsets asked for are in a dead owner's WAL, not yet recovered into the object tier."""

    retriable = True
    grpc_code = "UNAVAILABLE"


class GapAwareLog(TopicLog):
    """A TopicLog that waits at an open gap (see the module docstring) instead of skipping it."""

    def __init__(self, wal: Wal, cloud: CloudReader, wait: float) -> None:
        super().__init__(wal, cloud)
        self._wait = wait
        self._since = time.monotonic()

    def set_gaps(self, gaps: Sequence[Gap]) -> None:
        self.gaps = list(gaps)
        self._since = time.monotonic()

    def drop_below(self, floor: int) -> None:
        """Retention deleted every offset below `floor`: a gap there is no longer waited for (the others'
        wait goes on from when it began)."""
        self.gaps = gaps_from(self.gaps, floor)

    @property
    def start_offset(self) -> int:
        """A subscription resuming before a gap starts there, not past it."""
        return min([super().start_offset, *(g[0] for g in self.gaps)])

    async def _read(self, offset: int, max_bytes: int, span: bool) -> tuple[Buffer | FileSpan, int] | None:
        gap = next((g for g in self.gaps if g[0] <= offset <= g[1]), None)
        if gap is not None and offset < self.wal.start_offset and self.cloud is not None:
            await self.cloud.refresh()
            still = open_gaps([(offset, gap[1], gap[2])], self.cloud.descriptors)
            if still and still[0][0] == offset:
                if time.monotonic() - self._since < self._wait:
                    raise RecoveryPending(f"offsets {offset}..{gap[1]} of {self.cloud.namespace}/"
                                          f"{self.cloud.topic} wait for broker {gap[2]} to recover them")
                log.warning("%s/%s: broker %d did not recover offsets %d..%d in time; reading past them",
                            self.cloud.namespace, self.cloud.topic, gap[2], offset, gap[1])
                self.gaps.remove(gap)
        got = await super()._read(offset, max_bytes, span)
        if got is not None:
            # A read from a hole before a gap skips to the next offset anything holds: it must not leap over
            # the gap (the chaos campaign caught a Failover reader jumping a dead owner's acknowledged record
            # that way). Read at the gap instead, which waits while it is open.
            first = file_span.first_batch(got[0])[0]
            ahead = [g for g in self.gaps if offset < g[0] <= first]
            if ahead:
                return await self._read(min(ahead)[0], max_bytes, span)
        return got

"""A log's segments: the layout of their files, how they are made and sealed, and the list of them in memory.

Both the log (storage/segmented_log.py), which writes segments, and its recovery (storage/log_loader.py),
which reads them back at open, work from this. On disk, per topic, a folder of segments:
  {base_offset:020d}.log   the 8-byte header of a `.dnb1` object, then record batches back to back
                           (docs/FORMAT.md), base offsets stamped; at roll the object's footer and trailer
                           follow the last batch, so a sealed segment is an object as the object tier
                           stores it (docs/FORMAT.md, "Sealed segments"), which the folder store links
                           instead of copying. A segment written before segments had the header (batches
                           from byte 0, no footer) is read as it is, and uploaded by copying.
  {base_offset:020d}.idx   sparse index, fixed 8-byte entries (relative offset u32, file position u32, LE),
                           one every `index_interval_bytes` of log; entry 0 is the first batch's. The
                           active segment's index is a sparse file of `index_max_bytes`, mmap'd; its disk
                           blocks are reserved (posix_fallocate) before entries go into them, so that a full
                           disk is an error from append, not a SIGBUS from the mapping
                           (_wal_common.index_reservation).
                           At roll it is cut to its entries and fsync'd. Kafka's OffsetIndex is the model.

`SegmentFiles` does what changes a log's segment files as a whole, with the log's settings: a new active
segment, an fdatasync, the seal at a roll, a deletion; what each of its syncs makes durable of a segment goes
to the sync ledger (storage/sync_ledger.py).
`Segments` is the list in offset order, the last one active, with the base offsets it is searched by and
the footers of the sealed segments that are whole objects (Kafka's LogSegments is the model). Neither has a
lock: the log's writer makes, seals and deletes segments, and its `_lock` guards every use of the list
once the loader has handed it over.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import logging
import os
import time
from typing import TYPE_CHECKING

from danube_fast import latency
from danube_fast.errors import WalWriteError
from danube_fast.storage import sync_ledger
from danube_fast.storage.objects import format as object_format

if TYPE_CHECKING:
    from danube_fast.storage._wal import Segment

__all__ = ["FILE_HEADER", "FOOTER_INDEX_INTERVAL", "CleanClose", "SegmentFiles", "Segments", "headless",
           "sealed_footer"]

log = logging.getLogger("danube_fast.wal")

FILE_HEADER = object_format.HEADER  # a segment starts as a .dnb1 object does
FOOTER_INDEX_INTERVAL = object_format.DEFAULT_INDEX_INTERVAL  # the footer's index, as an uploaded object's


def headless(seg: Segment) -> None:
    """Make `seg` an empty active segment: its batches will start after the file header, which its first
    append writes (so a roll needs no disk space for the next segment, and a full disk refuses an append
    cleanly instead of failing a roll half done)."""
    seg.start = seg.size = len(FILE_HEADER)


def sealed_footer(seg: Segment) -> object_format.Footer:
    """The footer that makes the active segment an object: its figures, kept up by stamp, and the entries
    of its index at least FOOTER_INDEX_INTERVAL bytes apart (picked natively: the writer holds the GIL
    while it rolls, and a 128 MiB segment has 32,768 entries)."""
    index = tuple((seg.base + rel, pos) for rel, pos in seg.entries_every(FOOTER_INDEX_INTERVAL))
    return object_format.Footer(seg.base, seg.next_offset - 1, seg.min_time, seg.max_time, seg.size,
                                seg.batches, index)


CLEAN = "clean"  # the clean-close mark's file name (SegmentFiles.write_clean)


@dataclasses.dataclass(frozen=True)
class CleanClose:
    """The active segment as a clean close left it: where it starts and ends, its index and footer figures."""

    base: int
    size: int
    mtime_ns: int  # of the .log file: one written since (a tool, a test) is scanned
    next_offset: int
    entries: int
    capacity: int
    batches: int
    min_time: int
    max_time: int


class SegmentFiles:
    """The segment files of the log in `directory`, over the primitives' `segment` class: new active
    segments get an index of `index_max_bytes`, O_DIRECT appends if `direct`, O_DIRECT reads of every
    segment if `direct_reads`."""

    def __init__(self, directory: str, segment: type[Segment], *, index_max_bytes: int, direct: bool,
                 direct_reads: bool) -> None:
        self.directory = directory
        self.segment = segment
        self.index_max_bytes = index_max_bytes
        self.direct = direct
        self.direct_reads = direct_reads

    def fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- the clean-close mark: the active segment as a clean close left it ---------------------------------
    # Opening a log verifies every batch of its active segment (log_loader.py): up to segment_bytes of CRCs,
    # some 40 ms per 128 MiB here, paid at every restart and every topic move (a replicated topic's move
    # opens the log twice). After a close made the segment's data and index durable, `write_clean` records
    # it; the next open reads the mark (deleted durably before anything is appended) and trusts the
    # segment if the mark describes it as found (size and mtime). A crash leaves no mark (Kafka's
    # clean-shutdown file). Like Kafka's, it trusts the disk: bit rot after a clean close is not looked for.

    def clean_index(self, seg: Segment) -> Segment | None:
        """At a close, the data durable: the active segment's index too; the segment, or None if that
        failed (no mark then: best effort, the next open scans)."""
        try:
            seg.sync_index()
            return seg
        except OSError as e:
            log.warning("WAL %s: no clean-close mark (%s); the next open scans the last segment",
                        self.directory, e)
            return None

    def write_clean(self, seg: Segment | None) -> None:
        """After `clean_index` and the files closed: the mark, durably; none when the file is not as the
        segment says (a direct append's padding the close could not cut), or without a segment."""
        if seg is None:
            return
        try:
            st = os.stat(seg.log_path)
            if st.st_size != seg.size:
                return
            mark = CleanClose(seg.base, seg.size, st.st_mtime_ns, seg.next_offset, seg.idx_count,
                              seg.idx_capacity, seg.batches, seg.min_time, seg.max_time)
            path = os.path.join(self.directory, CLEAN)
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                json.dump(dataclasses.asdict(mark), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(path + ".tmp", path)
            self.fsync_dir()
        except OSError as e:
            log.warning("WAL %s: no clean-close mark (%s); the next open scans the last segment",
                        self.directory, e)

    def read_clean(self) -> CleanClose | None:
        """The mark of the last clean close, if it is one (`drop_clean` deletes it)."""
        try:
            with open(os.path.join(self.directory, CLEAN), encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(raw, dict) or set(raw) != {f.name for f in dataclasses.fields(CleanClose)} or \
                not all(type(v) is int and v >= 0 for v in raw.values()):
            return None
        return CleanClose(**raw)

    def drop_clean(self) -> None:
        """Delete the mark (and a torn one), durably: once the log is open again it no longer holds."""
        path = os.path.join(self.directory, CLEAN)
        gone = False
        for name in (path, path + ".tmp"):
            try:
                os.unlink(name)
                gone = True
            except FileNotFoundError:
                pass
        if gone:
            self.fsync_dir()

    def create(self, base: int) -> Segment:
        """An empty active segment whose index is mapped and unreserved (appends reserve what their entries
        need, so on a full disk it is the append after a roll that is refused), durable in the directory."""
        seg = self.segment(self.directory, base)
        try:
            seg.create(self.index_max_bytes)
            headless(seg)
            if self.direct:
                seg.direct(True)
            if self.direct_reads:
                seg.direct_reads(True)
            self.fsync_dir()
            sync_ledger.record(seg.log_path, 0)
        except BaseException:
            seg.close()
            raise
        seg.opened = time.monotonic()
        return seg

    @staticmethod
    def datasync(seg: Segment, size: int) -> None:
        """fdatasync a segment whose first `size` bytes are written."""
        started = time.perf_counter()
        seg.datasync()
        latency.FSYNC_SECONDS.observe(time.perf_counter() - started)
        sync_ledger.record(seg.log_path, size)

    def seal(self, seg: Segment) -> object_format.Footer | None:
        """Seal the active segment: its padding cut, the footer and trailer after the last batch (past `size`:
        readers never see them), the data fdatasync'd, the index cut to its entries and fsync'd. Returns the
        footer; None for a segment written before segments had a header, which gets none. If the footer
        cannot be written (a full disk) the segment stays the active one, unchanged, and WalWriteError refuses
        the append that rolls; any other OSError is left to the log, which fails."""
        seg.direct(False)  # its padding cut, made durable by the datasync
        footer = sealed_footer(seg) if seg.start else None
        tail = b"" if footer is None else object_format.encode_footer(footer)
        try:
            seg.write(tail, seg.size)
        except OSError as e:
            seg.cut(seg.size)  # an OSError here fails the log
            if self.direct:
                seg.direct(True)
            raise WalWriteError(f"sealing segment {seg.log_path} failed: {e.strerror or e}; nothing of this "
                                "append was kept") from e
        seg.datasync()
        sync_ledger.record(seg.log_path, seg.size + len(tail))
        seg.seal_index()
        return footer

    @staticmethod
    def delete(seg: Segment) -> None:
        """Unlink a sealed segment's files, the index first: a crash in between leaves a log without index,
        which opening rebuilds. A reader still holding the segment keeps its descriptor open."""
        if os.path.exists(seg.idx_path):
            os.unlink(seg.idx_path)
        os.unlink(seg.log_path)


class Segments:
    """The segments of one log in offset order (the last one active) and the footers of the sealed ones
    that are whole objects."""

    def __init__(self, segments: list[Segment], footers: dict[int, object_format.Footer]) -> None:
        self._segments = segments
        self._bases = [seg.base for seg in segments]
        self._footers = footers

    def __len__(self) -> int:
        return len(self._segments)

    @property
    def first(self) -> Segment:
        return self._segments[0]

    @property
    def active(self) -> Segment:
        return self._segments[-1]

    @property
    def nbytes(self) -> int:
        """The bytes written to the segment files (headers and batches)."""
        return sum(seg.size for seg in self._segments)

    @property
    def bases(self) -> list[int]:
        """The base offsets, oldest first (a copy)."""
        return list(self._bases)

    def for_offset(self, offset: int) -> Segment:
        """The segment that holds `offset` (the first one for an offset below it)."""
        return self._segments[max(bisect.bisect_right(self._bases, offset) - 1, 0)]

    def roll(self, new: Segment, footer: object_format.Footer | None) -> None:
        """The active segment is sealed (a whole object if `footer` is given) and `new` is the active one."""
        if footer is not None:
            self._footers[self.active.base] = footer
        self._segments.append(new)
        self._bases.append(new.base)

    def sealed_object(self, base: int) -> tuple[str, object_format.Footer] | None:
        """(path, footer) of the sealed segment starting at `base` if it is a whole object, else None."""
        footer = self._footers.get(base)
        if footer is None or len(self._segments) < 2:  # none, or the log is closed
            return None
        seg = self.for_offset(base)
        if seg.base != base or seg is self._segments[-1]:
            return None
        return seg.log_path, footer

    def expired(self, offset: int) -> Segment | None:
        """The oldest segment if it is sealed and every record of it is below `offset` (retention's next)."""
        if len(self._segments) <= 1 or self._segments[0].next_offset > offset:
            return None
        return self._segments[0]

    def drop_oldest(self) -> None:
        seg = self._segments.pop(0)
        self._bases.pop(0)
        self._footers.pop(seg.base, None)

    def close_files(self) -> None:
        for seg in self._segments:
            seg.close()

    def reopen_files(self) -> None:
        """Reopen the files `close_files` closed; on a failure close them all again."""
        try:
            for seg in self._segments:
                seg.reopen(seg is self._segments[-1])
        except OSError:
            self.close_files()
            raise

    def clear(self) -> list[Segment]:
        """Empty the list (the log is closed); returns the segments it held, for closing."""
        segments, self._segments, self._bases = self._segments, [], []
        self._footers = {}
        return segments

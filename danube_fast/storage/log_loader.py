"""Recovery of a log's directory at open: what a SegmentedLog (storage/segmented_log.py) continues from.

Kafka's LogLoader is the model: the log class reads as append, read, roll and retention, and everything that
decides what a directory left by an earlier process (or a crash) holds is here, run once, before the log
takes the segments over. It lists the segment files (removing indexes whose log is gone and temp files),
reads each segment's file header and footer (storage/segments.py has the layout), and:
- trusts sealed segments (they were fsync'd before the roll) but sanity checks their index and rebuilds it
  when damaged or missing; a sealed segment whose footer is missing or damaged is read up to its last
  whole batch;
- scans the last segment batch by batch with CRCs and offset continuity, cuts it at the first torn or
  corrupt batch, and rebuilds its index. A footer after its last batch (sealed, then a crash before the next
  segment was made) and the zero padding of a direct append are cut without calling them damage. After a
  clean close (segments.py `write_clean`: the segment and its index were durable and the mark says how far)
  the last segment is trusted as the mark describes it, and not scanned.
A cut is logged and reported (`RecoveryReport`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from danube_fast.codec import frames
from danube_fast.errors import ObjectCorrupt, WalCorrupt, WalWriteError
from danube_fast.storage import open_logs
from danube_fast.storage._wal_common import INDEX_ENTRY_BYTES, INDEX_SUFFIX, LOG_SUFFIX
from danube_fast.storage.objects import format as object_format
from danube_fast.storage.segments import FILE_HEADER, CleanClose, SegmentFiles, Segments, headless

if TYPE_CHECKING:
    from danube_fast.storage._wal import Segment

__all__ = ["LoadedLog", "LogLoader", "RecoveryReport"]

log = logging.getLogger("danube_fast.wal")

ENTRY = INDEX_ENTRY_BYTES
HEADER_BYTES = frames.HEADER_SIZE  # a batch is at least its header (docs/FORMAT.md)
PAD_BLOCK = 4096  # direct appends write whole blocks of this size (Segment.direct)


@dataclass
class RecoveryReport:
    """What opening the log found and did. A cut is also logged as a warning."""

    segments: int = 0
    next_offset: int = 0
    scanned_bytes: int = 0
    truncated_segment: int | None = None
    truncated_from: int | None = None
    truncated_bytes: int = 0
    cut_reason: str | None = None
    # zeros after the last batch, within its 4 KiB block: the padding of a direct append (not damage)
    padding_bytes: int = 0
    rebuilt_indexes: list[int] = field(default_factory=list)


@dataclass
class LoadedLog:
    """What the log continues from: its segments (the last one active, its files open), the active segment
    if its file header is still to be written by the first append, the next offset, and the report."""

    segments: Segments
    header_due: Segment | None
    next_offset: int
    report: RecoveryReport


class LogLoader:
    """Opens and recovers the segments of one log, once, with the log's settings: `files` (its directory,
    primitives, index size and I/O mode; it also makes the first segment of an empty directory) and the
    interval of index entries that rebuilt indexes get."""

    def __init__(self, files: SegmentFiles, index_interval_bytes: int) -> None:
        self._files = files
        self._directory = files.directory
        self._index_interval_bytes = index_interval_bytes
        self._segments: list[Segment] = []
        self._footers: dict[int, object_format.Footer] = {}  # sealed segments that are whole objects
        self._header_due: Segment | None = None

    def load(self, initial_offset: int, owner: object) -> LoadedLog:
        """Create the directory if it is missing and recover what it holds; on any failure the segments
        opened so far are closed. `initial_offset`: the first offset of a log with no segment yet; `owner`:
        the log that holds the directory from now until its close (storage/open_logs.py)."""
        open_logs.claim(self._directory, owner)  # before recovery: no other open recovers it at once
        try:
            os.makedirs(self._directory, exist_ok=True)
            return self._recover(initial_offset)
        except BaseException as e:
            open_logs.leave(self._directory, owner)
            for seg in self._segments:
                seg.close()
            if isinstance(e, OSError):
                raise WalWriteError(f"cannot open the WAL in {self._directory}: {e.strerror or e}") from e
            raise

    def _recover(self, initial_offset: int) -> LoadedLog:
        report = RecoveryReport()
        clean = self._files.read_clean()
        names = os.listdir(self._directory)
        bases = sorted(int(name[:-len(LOG_SUFFIX)]) for name in names
                       if name.endswith(LOG_SUFFIX) and name[:-len(LOG_SUFFIX)].isdigit())
        for name in names:  # indexes whose log is gone, and temp files
            stem = name[:-len(INDEX_SUFFIX)]
            if (name.endswith(INDEX_SUFFIX) and stem.isdigit() and int(stem) not in bases) or \
                    name.endswith(INDEX_SUFFIX + ".tmp"):
                os.unlink(os.path.join(self._directory, name))
        report.segments = len(bases)
        for i, base in enumerate(bases):
            seg = self._files.segment(self._directory, base)
            self._segments.append(seg)  # first, so that a failure below closes it
            seg.open()
            self._read_start(seg, last=i + 1 == len(bases))
            if self._files.direct_reads:  # sealed segments too: written directly, they are not cached
                seg.direct_reads(True)
            if i + 1 < len(bases):
                self._open_sealed(seg, report)
                if seg.next_offset != bases[i + 1]:
                    raise WalCorrupt(f"segment {seg.log_path} ends at offset {seg.next_offset} but the next "
                                     f"segment starts at {bases[i + 1]}")
            elif not self._resume_clean(seg, clean):
                self._scan_active(seg, report)
        if not self._segments:
            seg = self._files.create(initial_offset)
            self._segments.append(seg)
            self._header_due = seg
        active = self._segments[-1]
        active.opened = time.monotonic()
        if self._files.direct:
            active.direct(True)
        report.next_offset = active.next_offset
        self._files.drop_clean()  # recovered: the directory is no longer as the close left it
        segments = Segments(self._segments, self._footers)
        return LoadedLog(segments, self._header_due, active.next_offset, report)

    def _read_start(self, seg: Segment, last: bool) -> None:
        """Set `start` of a segment opened from disk: after the file header, or 0 for a segment written
        before segments had one (its first 8 bytes are its first batch's base offset, the file name's). The
        last segment, empty or holding a torn header only (no append yet, or a power loss before the first
        fdatasync), is empty: its first append writes the header."""
        with open(seg.log_path, "rb") as f:
            head = f.read(len(FILE_HEADER))
        if last and seg.size < len(FILE_HEADER) and FILE_HEADER.startswith(head):
            if seg.size:
                seg.cut(0)
                seg.fsync()
            headless(seg)
            self._header_due = seg
            return
        if head != FILE_HEADER:
            return
        if int.from_bytes(head, "little") == seg.base:  # ambiguous: an old segment of exactly this base
            first = seg.peek(len(FILE_HEADER))
            if first is None or first[0] != seg.base:
                return
        seg.start = len(FILE_HEADER)

    def _open_sealed(self, seg: Segment, report: RecoveryReport) -> None:
        """A sealed segment: trust the data, check the index, rebuild it if it is missing or damaged. Its
        footer says where the batches end; one that is missing or damaged is logged, and the segment is
        read up to its last whole batch (and uploaded by copying)."""
        if seg.start:
            footer = self._read_footer(seg)
            if footer is not None:
                self._footers[seg.base] = footer
                seg.size = footer.body_end
            else:
                log.warning("sealed segment %s has no valid footer: reading it up to its last batch",
                            seg.log_path)
                seg.size = self._body_end(seg)
        ok = False
        if os.path.exists(seg.idx_path):
            size = os.stat(seg.idx_path).st_size
            if size % ENTRY == 0 and size > 0:
                seg.load_index(size // ENTRY)
                ok = self._index_sane(seg)
        if not ok:
            log.warning("rebuilding the damaged or missing index %s", seg.idx_path)
            report.rebuilt_indexes.append(seg.base)
            self._rebuild_sealed_index(seg)
        rel, pos = seg.entry(seg.idx_count - 1)
        seg.next_offset = seg.walk(pos, seg.base + rel)

    @staticmethod
    def _read_footer(seg: Segment) -> object_format.Footer | None:
        """The footer at the end of a sealed segment's file, if it is a valid one of this segment."""
        with open(seg.log_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            guess = min(size, object_format.FOOTER_GUESS)
            tail = os.pread(f.fileno(), guess, size - guess)
            try:
                need = object_format.footer_length(tail)
                if need > len(tail) and need <= size:
                    tail = os.pread(f.fileno(), need, size - need)
                footer = object_format.parse_footer(tail)
            except ObjectCorrupt:
                return None
        if footer.min_offset != seg.base or footer.object_size != size:
            return None
        return footer

    @staticmethod
    def _body_end(seg: Segment) -> int:
        """The end of the last whole batch, walking the headers from the first one (a damaged footer)."""
        pos, offset = seg.start, seg.base
        while (head := seg.peek(pos)) is not None:
            base, length, count = head
            if base != offset or length < HEADER_BYTES or count < 1 or pos + length > seg.size:
                break
            pos, offset = pos + length, base + count
        return pos

    @staticmethod
    def _index_sane(seg: Segment) -> bool:
        """Entry 0 is (0, start); offsets and positions strictly increase; the last entry points at a batch
        header with its base offset (only the last is read, like Kafka's sanityCheck, plus the monotony
        scan)."""
        if seg.entry(0) != (0, seg.start) or not seg.entries_increasing():
            return False
        rel, pos = seg.entry(seg.idx_count - 1)
        if pos + HEADER_BYTES > seg.size:
            return False
        head = seg.peek(pos)
        return head is not None and head[0] == seg.base + rel

    def _rebuild_sealed_index(self, seg: Segment) -> None:
        """Write a fresh, exact-size index from the sealed segment's headers (atomic replace)."""
        entries = seg.build_index(self._index_interval_bytes)
        if not entries:
            raise WalCorrupt(f"sealed segment {seg.log_path} is empty")
        tmp = seg.idx_path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(entries)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, seg.idx_path)
        self._files.fsync_dir()
        seg.load_index(len(entries) // ENTRY)

    def _resume_clean(self, seg: Segment, clean: CleanClose | None) -> bool:
        """Take the last segment as the clean close left it, when the mark describes it as found: the same
        file size and base, an index file of the mapped capacity whose entries increase within the file."""
        if clean is None or clean.base != seg.base or clean.size != seg.size or seg.size <= seg.start or \
                clean.entries > clean.capacity or clean.next_offset <= seg.base:
            return False
        try:
            if os.stat(seg.idx_path).st_size != clean.capacity * ENTRY or \
                    os.stat(seg.log_path).st_mtime_ns != clean.mtime_ns:
                return False
        except FileNotFoundError:
            return False
        seg.resume_index(clean.entries, clean.capacity)
        if not seg.entries_increasing() or (clean.entries and seg.entry(clean.entries - 1)[1] >= seg.size) \
                or (clean.entries and seg.entry(0) != (0, seg.start)):
            return False  # the scan builds it afresh
        seg.next_offset = clean.next_offset
        seg.batches, seg.min_time, seg.max_time = clean.batches, clean.min_time, clean.max_time
        return True

    def _scan_active(self, seg: Segment, report: RecoveryReport) -> None:
        """Verify every batch of the last segment, cut at the first bad one, rebuild its index."""
        seg.fresh_index(self._files.index_max_bytes)
        pos, expected, reason = seg.scan(self._index_interval_bytes)
        report.scanned_bytes += pos
        seg.next_offset = expected
        if pos < seg.size and seg.start and self._footer_at(seg, pos):
            # Sealed, then a crash before the next segment was created: it is the active segment again,
            # and its next roll writes the footer anew.
            log.info("WAL %s: segment %d is the last one again; its footer is cut", self._directory,
                     seg.base)
            seg.cut(pos)
            seg.fsync()
            seg.size = pos
        elif pos < seg.size and self._padding(seg, pos):
            # A direct append's zero padding after a crash (a clean close cuts it): not damage.
            report.padding_bytes = seg.size - pos
            seg.cut(pos)
            seg.fsync()
            seg.size = pos
        elif pos < seg.size:
            report.truncated_segment = seg.base
            report.truncated_from = pos
            report.truncated_bytes = seg.size - pos
            report.cut_reason = reason
            log.warning("WAL %s: cutting %d bytes from byte %d of segment %d (%s); next offset %d",
                        self._directory, seg.size - pos, pos, seg.base, reason, expected)
            seg.cut(pos)
            seg.fsync()
            seg.size = pos

    def _footer_at(self, seg: Segment, pos: int) -> bool:
        """Whether the bytes from `pos` to the end of the file are this segment's footer and trailer."""
        footer = self._read_footer(seg)
        return footer is not None and footer.body_end == pos

    @staticmethod
    def _padding(seg: Segment, pos: int) -> bool:
        """Whether the bytes from `pos` to the end of the file are the zeros that complete the 4 KiB block
        of a direct append (Segment.direct)."""
        if seg.size % PAD_BLOCK or seg.size - pos >= PAD_BLOCK:
            return False
        with open(seg.log_path, "rb") as f:
            f.seek(pos)
            return not f.read(seg.size - pos).strip(b"\0")

"""The per-topic write-ahead log engine: segment policy, written once over the native or pure primitives.

On disk, per topic, a folder of segments:
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

The primitives (`Segment`, `check_buffers`) come from `_wal.pyx`, or its twin `_wal_py.py` when
DANUBE_FAST_PURE=1 (storage/wal_engine.py): stamping, copying, CRCs, header walks, the index mapping, the
syscalls. Everything that decides is here: recovery, when to roll, retention, index checks, failure and
closing.

Who may call what (correct without leaning on the GIL):
- One writer at a time: append, roll, delete_before and close take `_writer`. In the broker that is the
  WAL's write task (storage/wal.py), so the lock is never contended there.
- sync may run beside the writer (storage/wal.py pipelines fsyncs with writes): it captures the active
  segment and the next offset under `_lock`, fdatasyncs outside it and returns that offset as what it covered.
- Readers (read, lookup) run in any thread, for offsets below the limit the owner published.
- `_lock` guards everything readers look at: the segment list, each segment's size, next offset and index
  mapping, the log's next offset and counters. It is held only to change or read those, never across a
  syscall that moves data; a reader picks its segment and start position under it and then preads outside.
- A read or a sync in progress counts in `_busy`; close marks the log closed, waits until `_busy` is zero,
  then closes the files. A read that starts later gets WalClosed, never an error of a closed descriptor.
  Retention unlinks a segment a reader may hold: its descriptor closes when the last reference goes.
- `release` (an idle topic, storage/wal.py) closes every descriptor and index mapping the same way, keeping
  what is known of each segment; the next append, sync, roll, read or lookup reopens them under `_lock`
  (no recovery: this process wrote them).

Recovery on open: sealed segments are trusted (they were fsync'd before the roll) but their index is sanity
checked and rebuilt when damaged or missing; the last segment is scanned batch by batch with CRCs and offset
continuity, cut at the first torn or corrupt batch, and its index rebuilt. The cut is logged and reported.
"""

from __future__ import annotations

import bisect
import logging
import operator
import os
import threading
import time
from types import ModuleType
from typing import TYPE_CHECKING, NoReturn

from danube_fast import latency
from danube_fast.codec import frames
from danube_fast.errors import ObjectCorrupt, OffsetOutOfRange, WalClosed, WalCorrupt, WalWriteError
from danube_fast.storage import sync_ledger, wal_engine
from danube_fast.storage._wal_common import (
    INDEX_ENTRY_BYTES,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    AppendResult,
    RecoveryReport,
)
from danube_fast.storage.objects import format as object_format

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from danube_fast.storage._wal import Segment

__all__ = ["SegmentedLog"]

log = logging.getLogger("danube_fast.wal")

ENTRY = INDEX_ENTRY_BYTES
HEADER_BYTES = frames.HEADER_SIZE  # a batch is at least its header (docs/FORMAT.md)
PAD_BLOCK = 4096  # direct appends write whole blocks of this size (Segment.direct)
FILE_HEADER = object_format.HEADER  # a segment starts as a .dnb1 object does
FOOTER_INDEX_INTERVAL = object_format.DEFAULT_INDEX_INTERVAL  # the footer's index, as an uploaded object's


class SegmentedLog:
    """One topic's segmented log. `segments`: the primitives module (default: the one wal_engine selects;
    the tests pass both)."""

    def __init__(self, directory: str, *, segment_bytes: int = 128 * 1024 * 1024, segment_ms: int = 0,
                 index_interval_bytes: int = 4096, index_max_bytes: int = 1024 * 1024,
                 initial_offset: int = 0, direct_io: bool = False, direct_reads: bool = False,
                 segments: ModuleType | None = None) -> None:
        if not isinstance(directory, str):
            raise TypeError(f"directory must be a str, not {type(directory).__name__}")
        impl = segments or wal_engine.segments
        segment_bytes = operator.index(segment_bytes)
        segment_ms = operator.index(segment_ms)
        index_interval_bytes = operator.index(index_interval_bytes)
        index_max_bytes = operator.index(index_max_bytes)
        initial_offset = operator.index(initial_offset)
        if not 0 < segment_bytes <= impl.MAX_SEGMENT:
            raise ValueError(f"segment_bytes must be in 1..{impl.MAX_SEGMENT}, not {segment_bytes}")
        if index_interval_bytes < 0 or segment_ms < 0:
            raise ValueError("index_interval_bytes and segment_ms must not be negative")
        if index_max_bytes < ENTRY * 2 or index_max_bytes % ENTRY:
            raise ValueError(f"index_max_bytes must be a multiple of {ENTRY}, at least {2 * ENTRY}")
        if not 0 <= initial_offset < 1 << 64:
            raise OverflowError(f"initial_offset {initial_offset} is not a u64")
        self._impl = impl
        self._segment: type[Segment] = impl.Segment
        self._directory = os.path.abspath(directory)
        self._segment_bytes = segment_bytes
        self._segment_ms = segment_ms
        self._index_interval_bytes = index_interval_bytes
        self._index_max_bytes = index_max_bytes
        self._direct = direct_io  # O_DIRECT appends to the active segment (Segment.direct)
        self._direct_reads = direct_io and direct_reads  # and O_DIRECT reads of every segment (direct_reads)
        self._writer = threading.Lock()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when the last busy call leaves
        self._busy = 0  # reads and syncs running outside _lock
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._footers: dict[int, object_format.Footer] = {}  # sealed segments that are whole objects
        self._header_due: Segment | None = None  # the active segment, while its file header is not written
        self._next_offset = 0
        self._written = 0  # bytes appended since open
        self._synced = 0  # of those, bytes an fdatasync covered
        self._failed: OSError | None = None
        self._closed = False
        self._released = False  # files closed while the log is idle; the next use reopens them (release)
        try:
            os.makedirs(self._directory, exist_ok=True)
            self._recover(initial_offset)
        except BaseException as e:
            for seg in self._segments:
                seg.close()
            self._segments = []
            self._bases = []
            if isinstance(e, OSError):
                raise WalWriteError(f"cannot open the WAL in {self._directory}: {e.strerror or e}") from e
            raise

    # -- properties ------------------------------------------------------------------------------------

    @property
    def directory(self) -> str:
        return self._directory

    @property
    def segment_bytes(self) -> int:
        return self._segment_bytes

    @property
    def segment_ms(self) -> int:
        return self._segment_ms

    @property
    def index_interval_bytes(self) -> int:
        return self._index_interval_bytes

    @property
    def index_max_bytes(self) -> int:
        return self._index_max_bytes

    @property
    def recovery(self) -> RecoveryReport:
        return self._recovery

    @property
    def next_offset(self) -> int:
        return self._next_offset

    @property
    def start_offset(self) -> int:
        with self._lock:
            return self._start_offset()

    @property
    def segment_bases(self) -> list[int]:
        with self._lock:
            return list(self._bases)

    @property
    def unsynced_bytes(self) -> int:
        with self._lock:
            return self._written - self._synced

    def _start_offset(self) -> int:
        return self._segments[0].base if self._segments else self._next_offset

    # -- opening and recovery --------------------------------------------------------------------------

    def _fsync_dir(self) -> None:
        fd = os.open(self._directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _new_segment(self, base: int) -> Segment:
        """An empty active segment whose index is mapped and unreserved (appends reserve what their entries
        need, so on a full disk it is the append after a roll that is refused), durable in the directory."""
        seg = self._segment(self._directory, base)
        try:
            seg.create(self._index_max_bytes)
            self._headless(seg)
            if self._direct:
                seg.direct(True)
            if self._direct_reads:
                seg.direct_reads(True)
            self._fsync_dir()
            sync_ledger.record(seg.log_path, 0)
        except BaseException:
            seg.close()
            raise
        seg.opened = time.monotonic()
        return seg

    def _headless(self, seg: Segment) -> None:
        """An empty active segment: its batches will start after the file header, which its first append
        writes (so a roll needs no disk space for the next segment, and a full disk refuses an append
        cleanly instead of failing a roll half done)."""
        seg.start = seg.size = len(FILE_HEADER)
        self._header_due = seg

    def _write_header(self, seg: Segment) -> None:
        """The file header of the active segment before its first batch; on failure nothing is kept."""
        try:
            seg.write(FILE_HEADER, 0)
        except OSError as e:
            try:
                seg.cut(0)
            except OSError:
                self._fail(f"writing the header of {seg.log_path}", e)
            raise WalWriteError(f"writing the header of {seg.log_path} failed: {e.strerror or e}; nothing of "
                                "this append was kept") from e
        self._header_due = None

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
            self._headless(seg)
            return
        if head != FILE_HEADER:
            return
        if int.from_bytes(head, "little") == seg.base:  # ambiguous: an old segment of exactly this base
            first = seg.peek(len(FILE_HEADER))
            if first is None or first[0] != seg.base:
                return
        seg.start = len(FILE_HEADER)

    def _recover(self, initial_offset: int) -> None:
        report = RecoveryReport()
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
            seg = self._segment(self._directory, base)
            self._segments.append(seg)  # first, so that a failure below closes it
            self._bases.append(base)
            seg.open()
            self._read_start(seg, last=i + 1 == len(bases))
            if self._direct_reads:  # sealed segments too: they were written directly, so they are not cached
                seg.direct_reads(True)
            if i + 1 < len(bases):
                self._open_sealed(seg, report)
                if seg.next_offset != bases[i + 1]:
                    raise WalCorrupt(f"segment {seg.log_path} ends at offset {seg.next_offset} but the next "
                                     f"segment starts at {bases[i + 1]}")
            else:
                self._scan_active(seg, report)
        if not self._segments:
            seg = self._new_segment(initial_offset)
            self._segments.append(seg)
            self._bases.append(seg.base)
        self._segments[-1].opened = time.monotonic()
        if self._direct:
            self._segments[-1].direct(True)
        self._next_offset = self._segments[-1].next_offset
        report.next_offset = self._next_offset
        self._recovery = report

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

    def _read_footer(self, seg: Segment) -> object_format.Footer | None:
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

    def _index_sane(self, seg: Segment) -> bool:
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
        self._fsync_dir()
        seg.load_index(len(entries) // ENTRY)

    def _scan_active(self, seg: Segment, report: RecoveryReport) -> None:
        """Verify every batch of the last segment, cut at the first bad one, rebuild its index."""
        seg.fresh_index(self._index_max_bytes)
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

    # -- writing ---------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise WalClosed(f"the WAL in {self._directory} is closed")
        if self._failed is not None:
            raise WalWriteError(f"the WAL in {self._directory} failed earlier ({self._failed}); "
                                "reopen it to recover") from self._failed

    def _fail(self, what: str, err: OSError) -> NoReturn:
        self._failed = err
        raise WalWriteError(f"{what} in {self._directory} failed: {err.strerror or err}") from err

    def append(self, buffers: list[Buffer]) -> AppendResult:
        """Validate each buffer (whole batches, structure and CRC) and write the valid ones in one write,
        stamping contiguous base offsets. ranges[i] is (first, last) for buffers[i], or the FrameCorrupt
        that rejected it (nothing of that buffer was written). A failed write is cut back and raises
        WalWriteError (if even the cut fails, the log refuses appends until reopened); so does an index that
        cannot get disk space for its entries, before anything is written."""
        if not isinstance(buffers, list):
            raise TypeError(f"buffers must be a list, not {type(buffers).__name__}")
        with self._writer:
            self._check_open()
            ranges, views, counts, total = self._impl.check_buffers(buffers)
            first = self._next_offset
            if total == 0:
                return AppendResult(ranges, None, first, first)
            with self._lock:
                self._reopen()
            self._maybe_roll(total)
            seg = self._segments[-1]
            if self._header_due is seg:
                self._write_header(seg)
            counted = (seg.batches, seg.min_time, seg.max_time)
            data, end, marks = seg.stamp(views, counts, ranges, first, self._index_interval_bytes)
            at = seg.size
            try:
                seg.reserve_index(seg.idx_count + len(marks) // ENTRY)
            except OSError as e:
                seg.batches, seg.min_time, seg.max_time = counted
                raise WalWriteError(f"appending {total} bytes to {seg.log_path} failed: {e.strerror or e}; "
                                    "nothing of this append was kept") from e
            try:
                seg.write(data, at)
            except OSError as e:
                seg.batches, seg.min_time, seg.max_time = counted
                # Cut the partial write back so the file still ends on a whole batch. If even that fails,
                # stop appending: recovery on reopen will cut the torn tail.
                try:
                    seg.cut(at)
                except OSError:
                    self._fail(f"writing {total} bytes to {seg.log_path}", e)
                raise WalWriteError(f"writing {total} bytes to {seg.log_path} failed: {e.strerror or e}; "
                                    "nothing of this append was kept") from e
            with self._lock:
                # Index entries only after the bytes they point at are in the file.
                seg.add_entries(marks)
                if at == seg.start:
                    seg.opened = time.monotonic()
                seg.size = at + total
                seg.next_offset = end
                self._next_offset = end
                self._written += total
            return AppendResult(ranges, data, first, end)

    def _maybe_roll(self, incoming: int) -> None:
        seg = self._segments[-1]
        if seg.size <= seg.start:
            return
        if (seg.size + incoming > self._segment_bytes
                or seg.idx_count >= seg.idx_capacity
                or (self._segment_ms > 0 and (time.monotonic() - seg.opened) * 1000 >= self._segment_ms)):
            self._roll()

    def sync(self) -> int:
        """fdatasync the active segment. Returns the next offset it covered: every record below it that was
        appended before the call is durable. (Segments before the active one were synced when they rolled.)"""
        with self._lock:
            self._check_open()
            self._reopen()
            seg, covered, written = self._segments[-1], self._next_offset, self._written
            size = seg.size
            self._busy += 1
        started = time.perf_counter()
        try:
            seg.datasync()
            latency.FSYNC_SECONDS.observe(time.perf_counter() - started)
            sync_ledger.record(seg.log_path, size)
        except OSError as e:
            # After a failed fsync the kernel may have dropped the dirty pages: nothing written since the last
            # good sync can be trusted, so refuse to go on (PostgreSQL's "fsyncgate" lesson).
            self._fail(f"fdatasync of {seg.log_path}", e)
        finally:
            self._leave()
        with self._lock:
            self._synced = max(self._synced, written)
        return covered

    def roll(self) -> None:
        """Seal the active segment (fsync data, cut and fsync its index) and start a new one."""
        with self._writer:
            self._check_open()
            with self._lock:
                self._reopen()
            self._roll()

    def _roll(self) -> None:
        seg = self._segments[-1]
        if seg.size <= seg.start:
            return
        try:
            seg.direct(False)  # its padding cut, made durable by the datasync
            footer = self._footer(seg) if seg.start else None
            tail = b"" if footer is None else object_format.encode_footer(footer)
            self._write_footer(seg, tail)
            seg.datasync()
            sync_ledger.record(seg.log_path, seg.size + len(tail))
            seg.seal_index()
            with self._lock:  # readers may be searching the mapping that is replaced
                seg.load_index(seg.idx_count)
            written = self._written
            new = self._new_segment(self._next_offset)
        except OSError as e:
            self._fail("rolling a segment", e)
        with self._lock:
            self._synced = max(self._synced, written)
            self._segments.append(new)
            self._bases.append(new.base)
            if footer is not None:
                self._footers[seg.base] = footer

    def _write_footer(self, seg: Segment, tail: bytes) -> None:
        """The footer and trailer after the last batch (past `size`: readers never see them). On a failure
        (a full disk) the segment stays the active one, unchanged, and the append that rolls is refused."""
        try:
            seg.write(tail, seg.size)
        except OSError as e:
            seg.cut(seg.size)  # an OSError here fails the log (_roll)
            if self._direct:
                seg.direct(True)
            raise WalWriteError(f"sealing segment {seg.log_path} failed: {e.strerror or e}; nothing of this "
                                "append was kept") from e

    def _footer(self, seg: Segment) -> object_format.Footer:
        """The footer that makes the active segment an object: its figures, kept up by stamp, and the entries
        of its index at least FOOTER_INDEX_INTERVAL bytes apart (picked natively: the writer holds the GIL
        while it rolls, and a 128 MiB segment has 32,768 entries)."""
        index = tuple((seg.base + rel, pos) for rel, pos in seg.entries_every(FOOTER_INDEX_INTERVAL))
        return object_format.Footer(seg.base, seg.next_offset - 1, seg.min_time, seg.max_time, seg.size,
                                    seg.batches, index)

    def sealed_object(self, base: int) -> tuple[str, object_format.Footer] | None:
        """(path, footer) of the sealed segment starting at `base` if its file is a whole `.dnb1` object (a
        header and a valid footer), None otherwise. The file never changes again; retention may unlink it."""
        with self._lock:
            footer = self._footers.get(base)
            if footer is None or len(self._segments) < 2:  # none, or the log is closed
                return None
            seg = self._segment_for(base)
            if seg.base != base or seg is self._segments[-1]:
                return None
            return seg.log_path, footer

    def delete_before(self, offset: int) -> int:
        """Retention: delete whole sealed segments whose every record is below `offset`."""
        with self._writer:
            self._check_open()
            deleted = 0
            try:
                while True:
                    with self._lock:
                        if len(self._segments) <= 1 or self._segments[0].next_offset > offset:
                            break
                        seg = self._segments[0]
                    # The index first: a crash in between leaves a log without index, which opening rebuilds.
                    # A reader still holding the segment keeps its descriptor open.
                    if os.path.exists(seg.idx_path):
                        os.unlink(seg.idx_path)
                    os.unlink(seg.log_path)
                    with self._lock:
                        self._segments.pop(0)
                        self._bases.pop(0)
                        self._footers.pop(seg.base, None)
                    deleted += 1
                if deleted:
                    self._fsync_dir()
            except OSError as e:
                raise WalWriteError(f"retention in {self._directory} failed: {e.strerror or e}") from e
            return deleted

    def close(self) -> None:
        """fdatasync what is unsynced, then close the files once no read or sync is running."""
        with self._writer:
            if self._closed:
                return
            try:
                if self._failed is None and self._written > self._synced:
                    self.sync()
            finally:
                with self._lock:
                    self._closed = True
                    while self._busy:
                        self._idle.wait()
                    segments, self._segments, self._bases = self._segments, [], []
                for seg in segments:
                    seg.close()

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Close the files and index mappings of an idle log (fdatasync'd first); its next use reopens them.
        Waits for reads and syncs in progress, as close does."""
        with self._writer:
            self._check_open()
            if self._released:
                return
            if self._written > self._synced:
                self.sync()
            with self._lock:
                while self._busy:
                    self._idle.wait()
                for seg in self._segments:
                    seg.close()
                self._released = True

    def _reopen(self) -> None:
        """Under _lock: bring back the files `release` closed."""
        if not self._released:
            return
        try:
            for seg in self._segments:
                seg.reopen(seg is self._segments[-1])
        except OSError as e:
            for seg in self._segments:
                seg.close()
            raise WalWriteError(f"reopening the WAL in {self._directory} failed: {e.strerror or e}") from e
        self._released = False

    def _leave(self) -> None:
        with self._lock:
            self._busy -= 1
            if not self._busy:  # close or release may be waiting for it
                self._idle.notify_all()

    # -- reading ---------------------------------------------------------------------------------------

    def _segment_for(self, offset: int) -> Segment:
        return self._segments[max(bisect.bisect_right(self._bases, offset) - 1, 0)]

    def _check_readable(self, offset: int) -> None:
        if self._closed:
            raise WalClosed(f"the WAL in {self._directory} is closed")
        if offset < self._start_offset():
            raise OffsetOutOfRange(f"offset {offset} is below the first stored offset {self._start_offset()}")

    def lookup(self, offset: int) -> tuple[int, int]:
        """(segment base offset, byte position of the indexed batch at or before offset)."""
        with self._lock:
            self._check_readable(offset)
            self._reopen()
            seg = self._segment_for(offset)
            return seg.base, seg.find(offset)

    def read(self, offset: int, max_bytes: int, limit: int) -> bytes | memoryview | None:
        """Whole batches from the one holding `offset`: at most max_bytes, at least one batch, all below
        `limit` (the committed next offset); None when offset >= limit. Raises OffsetOutOfRange below
        start_offset. Runs in any thread."""
        with self._lock:
            if self._closed:
                raise WalClosed(f"the WAL in {self._directory} is closed")
            if offset >= limit:
                return None
            self._check_readable(offset)
            self._reopen()
            seg = self._segment_for(offset)
            size, pos = seg.size, seg.find(offset)
            self._busy += 1
        try:
            return seg.read(pos, size, offset, max_bytes, limit)
        finally:
            self._leave()

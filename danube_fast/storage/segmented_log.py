"""The per-topic write-ahead log engine: segment policy, written once over the native or pure primitives.

On disk, per topic, a folder of segments:
  {base_offset:020d}.log   record batches back to back (docs/FORMAT.md), base offsets stamped
  {base_offset:020d}.idx   sparse index, fixed 8-byte entries (relative offset u32, file position u32, LE),
                           one every `index_interval_bytes` of log; entry 0 is (0, 0). The active segment's
                           index is a sparse file of `index_max_bytes`, mmap'd; its disk blocks are
                           reserved (posix_fallocate) before entries go into them, so that a full disk is an
                           error from append, not a SIGBUS from the mapping (_wal_common.index_reservation).
                           At roll it is cut to its entries and fsync'd. Kafka's OffsetIndex is the model.

The primitives (`Segment`, `check_buffers`) come from `_wal.pyx`, or its twin `_wal_py.py` when
DANUBE_FAST_PURE=1 (danube_fast.wal_engine): stamping, copying, CRCs, header walks, the index mapping, the
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

from danube_fast import frames, latency, wal_engine
from danube_fast._wal_common import INDEX_ENTRY_BYTES, INDEX_SUFFIX, LOG_SUFFIX, AppendResult, RecoveryReport
from danube_fast.errors import OffsetOutOfRange, WalClosed, WalCorrupt, WalWriteError
from danube_fast.storage import sync_ledger

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from danube_fast._wal import Segment

__all__ = ["SegmentedLog"]

log = logging.getLogger("danube_fast.wal")

ENTRY = INDEX_ENTRY_BYTES
HEADER_BYTES = frames.HEADER_SIZE  # a batch is at least its header (docs/FORMAT.md)
PAD_BLOCK = 4096  # direct appends write whole blocks of this size (Segment.direct)


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
        """A sealed segment: trust the data, check the index, rebuild it if it is missing or damaged."""
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

    def _index_sane(self, seg: Segment) -> bool:
        """Entry 0 is (0, 0); offsets and positions strictly increase; the last entry points at a batch header
        with its base offset (only the last is read, like Kafka's sanityCheck, plus the monotony scan)."""
        if seg.entry(0) != (0, 0) or not seg.entries_increasing():
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
        if pos < seg.size and self._padding(seg, pos):
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
            data, end, marks = seg.stamp(views, counts, ranges, first, self._index_interval_bytes)
            at = seg.size
            try:
                seg.reserve_index(seg.idx_count + len(marks) // ENTRY)
            except OSError as e:
                raise WalWriteError(f"appending {total} bytes to {seg.log_path} failed: {e.strerror or e}; "
                                    "nothing of this append was kept") from e
            try:
                seg.write(data, at)
            except OSError as e:
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
                if at == 0:
                    seg.opened = time.monotonic()
                seg.size = at + total
                seg.next_offset = end
                self._next_offset = end
                self._written += total
            return AppendResult(ranges, data, first, end)

    def _maybe_roll(self, incoming: int) -> None:
        seg = self._segments[-1]
        if seg.size == 0:
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
        if seg.size == 0:
            return
        try:
            seg.direct(False)  # its padding cut, made durable by the datasync
            seg.datasync()
            sync_ledger.record(seg.log_path, seg.size)
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

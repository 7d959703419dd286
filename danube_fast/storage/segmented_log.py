"""The per-topic write-ahead log engine: segment policy, written once over the native or pure primitives.

A folder of segment files per topic (their layout and the list of them in memory: storage/segments.py),
recovered at open by storage/log_loader.py; this class continues from what the loader hands over.

The primitives (`Segment`, `check_buffers`) come from `_wal.pyx`, or its twin `_wal_py.py` when
DANUBE_FAST_PURE=1 (storage/wal_engine.py): stamping, copying, CRCs, header walks, the index mapping, the
syscalls. What decides after open is here: when to roll, what retention deletes, failure and closing.

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
"""

from __future__ import annotations

import operator
import os
import threading
import time
from types import ModuleType
from typing import TYPE_CHECKING, Literal, NoReturn, overload

from danube_fast.errors import OffsetOutOfRange, WalClosed, WalWriteError
from danube_fast.storage import file_span, open_logs, wal_engine
from danube_fast.storage._wal_common import INDEX_ENTRY_BYTES, AppendResult
from danube_fast.storage.log_loader import LogLoader, RecoveryReport
from danube_fast.storage.objects import format as object_format
from danube_fast.storage.segments import FILE_HEADER, SegmentFiles

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from danube_fast.storage._wal import Segment

ENTRY = INDEX_ENTRY_BYTES


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
        self._directory = os.path.abspath(directory)
        self.segment_bytes = segment_bytes  # (read-only, as every setting here)
        self.segment_ms = segment_ms
        self.index_interval_bytes = index_interval_bytes
        self._files = SegmentFiles(self._directory, impl.Segment, index_max_bytes=index_max_bytes,
                                   direct=direct_io, direct_reads=direct_io and direct_reads)
        self._writer = threading.Lock()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when the last busy call leaves
        self._busy = 0  # reads and syncs running outside _lock
        self._written = 0  # bytes appended since open
        self._synced = 0  # of those, bytes an fdatasync covered
        self._failed: OSError | None = None
        self._closed = False
        self._released = False  # files closed while the log is idle; the next use reopens them (release)
        loaded = LogLoader(self._files, index_interval_bytes).load(initial_offset, owner=self)
        self._segments = loaded.segments
        self._header_due = loaded.header_due  # the active segment, while its file header is not written
        self._next_offset = loaded.next_offset
        self._recovery = loaded.report

    # -- properties ------------------------------------------------------------------------------------

    @property
    def directory(self) -> str:
        return self._directory

    @property
    def index_max_bytes(self) -> int:
        return self._files.index_max_bytes

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
            return self._segments.bases

    @property
    def disk_bytes(self) -> int:
        with self._lock:
            return self._segments.nbytes if self._segments else 0

    @property
    def unsynced_bytes(self) -> int:
        with self._lock:
            return self._written - self._synced

    def _start_offset(self) -> int:
        return self._segments.first.base if self._segments else self._next_offset

    # -- writing ---------------------------------------------------------------------------------------

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
            seg = self._segments.active
            if self._header_due is seg:
                self._write_header(seg)
            counted = (seg.batches, seg.min_time, seg.max_time)
            data, end, marks = seg.stamp(views, counts, ranges, first, self.index_interval_bytes)
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
                seg.add_entries(marks)  # index entries only after the bytes they point at are in the file
                if at == seg.start:
                    seg.opened = time.monotonic()
                seg.size = at + total
                seg.next_offset = end
                self._next_offset = end
                self._written += total
            return AppendResult(ranges, data, first, end)

    def _maybe_roll(self, incoming: int) -> None:
        seg = self._segments.active
        if seg.size <= seg.start:
            return
        if (seg.size + incoming > self.segment_bytes
                or seg.idx_count >= seg.idx_capacity
                or (self.segment_ms > 0 and (time.monotonic() - seg.opened) * 1000 >= self.segment_ms)):
            self._roll()

    def sync(self) -> int:
        """fdatasync the active segment. Returns the next offset it covered: every record below it that was
        appended before the call is durable. (Segments before the active one were synced when they rolled.)"""
        with self._lock:
            self._check_open()
            self._reopen()
            seg, covered, written = self._segments.active, self._next_offset, self._written
            size = seg.size
            self._busy += 1
        try:
            self._files.datasync(seg, size)
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
        seg = self._segments.active
        if seg.size <= seg.start:
            return
        try:
            footer = self._files.seal(seg)
            with self._lock:  # readers may be searching the mapping that is replaced
                seg.load_index(seg.idx_count)
            written = self._written
            new = self._files.create(self._next_offset)
        except OSError as e:
            self._fail("rolling a segment", e)
        with self._lock:
            self._synced = max(self._synced, written)
            self._segments.roll(new, footer)
        self._header_due = new

    def sealed_object(self, base: int) -> tuple[str, object_format.Footer] | None:
        """(path, footer) of the sealed segment starting at `base` if its file is a whole `.dnb1` object (a
        header and a valid footer), None otherwise. The file never changes again; retention may unlink it."""
        with self._lock:
            return self._segments.sealed_object(base)

    def delete_before(self, offset: int) -> int:
        """Retention: delete whole sealed segments whose every record is below `offset`."""
        with self._writer:
            self._check_open()
            deleted = 0
            try:
                while True:
                    with self._lock:
                        seg = self._segments.expired(offset)
                    if seg is None:
                        break
                    self._files.delete(seg)
                    with self._lock:
                        self._segments.drop_oldest()
                    deleted += 1
                if deleted:
                    self._files.fsync_dir()
            except OSError as e:
                raise WalWriteError(f"retention in {self._directory} failed: {e.strerror or e}") from e
            return deleted

    def close(self) -> None:
        """fdatasync, close the files once no read or sync runs, leave the clean-close mark (segments.py)."""
        with self._writer:
            if self._closed:
                return
            clean = None
            try:
                if self._failed is None and self._written > self._synced:
                    self.sync()
                if self._failed is None and not self._released:  # (released: the next open scans)
                    clean = self._files.clean_index(self._segments.active)
            finally:
                with self._lock:
                    self._closed = True
                    while self._busy:
                        self._idle.wait()
                    segments = self._segments.clear()
                for seg in segments:
                    seg.close()
                self._files.write_clean(clean)  # the files closed: a direct append's padding is cut
                open_logs.leave(self._directory, self)  # (write_clean raises nothing)

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
                self._segments.close_files()
                self._released = True

    def _reopen(self) -> None:
        """Under _lock: bring back the files `release` closed."""
        if not self._released:
            return
        try:
            self._segments.reopen_files()
        except OSError as e:
            raise WalWriteError(f"reopening the WAL in {self._directory} failed: {e.strerror or e}") from e
        self._released = False

    def _leave(self) -> None:
        with self._lock:
            self._busy -= 1
            if not self._busy:  # close or release may be waiting for it
                self._idle.notify_all()

    # -- reading ---------------------------------------------------------------------------------------

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
            seg = self._segments.for_offset(offset)
            return seg.base, seg.find(offset)

    @overload
    def read(self, offset: int, max_bytes: int, limit: int) -> bytes | memoryview | None: ...
    @overload
    def read(self, offset: int, max_bytes: int, limit: int, *, span: Literal[True]
             ) -> tuple[file_span.FileSpan, int] | bytes | memoryview | None: ...

    def read(self, offset: int, max_bytes: int, limit: int, *, span: bool = False
             ) -> bytes | memoryview | tuple[file_span.FileSpan, int] | None:
        """Whole batches from the one holding `offset`: at most max_bytes, at least one batch, all below
        `limit` (the committed next offset); None when offset >= limit. Raises OffsetOutOfRange below
        start_offset. Runs in any thread. `span`: named in their file with the next offset, read if small."""
        with self._lock:
            self._check_readable(offset)  # (closed; below start_offset, which is never above `limit`)
            if offset >= limit:
                return None
            self._reopen()
            seg = self._segments.for_offset(offset)
            size, pos = seg.size, seg.find(offset)
            self._busy += 1
        try:
            spanned = file_span.find(seg.fileno(), pos, size, offset, max_bytes, limit, seg.log_path) \
                if span else None
            return spanned or seg.read(pos, size, offset, max_bytes, limit)
        finally:
            self._leave()

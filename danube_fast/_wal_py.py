"""Segmented write-ahead log: the pure-Python twin of the native engine `_wal.pyx`.

`danube_fast.wal_engine` selects this module instead of `danube_fast._wal` when DANUBE_FAST_PURE=1. Both write
the same files, return the same results and raise the same errors; the design (segment and index files,
ownership, recovery) is described once, in the module docstring of `_wal.pyx`, and not repeated here.

One difference in mechanism: the native engine keeps readers from seeing half an update by holding the GIL
between its syscalls. Pure Python may switch threads between any two bytecodes, so here every change to state
that readers look at (the segment list, a segment's size and index, the next offset) is made under
`SegmentedLog._lock`, and readers take it to pick their segment and position. The syscalls that move data
(pwrite, pread, fdatasync) run outside it.

Batches are validated with the pure codec `_frames_py`, never the native one, so this module runs on hosts
where the extensions are not built.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import mmap
import operator
import os
import struct
import threading
import time
from typing import TYPE_CHECKING, NoReturn

from danube_fast import _frames_py
from danube_fast._wal_common import (
    INDEX_ENTRY_BYTES,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    AppendResult,
    RecoveryReport,
    index_reservation,
    segment_name,
)
from danube_fast.errors import FrameCorrupt, OffsetOutOfRange, WalClosed, WalCorrupt, WalWriteError

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["SegmentedLog"]

log = logging.getLogger("danube_fast.wal")

ENTRY = INDEX_ENTRY_BYTES
HEADER_BYTES = _frames_py.HEADER_SIZE
MAX_SEGMENT = 1 << 30  # positions are u32: a 1 GiB segment plus one big group stays inside

_ENTRY = struct.Struct("<II")  # index entry: offset relative to the segment base, file position
# The header fields needed to walk a log without decoding it: base_offset (byte 0), batch_length (12) and
# record_count (20); the pad bytes skip crc and magic/version/flags. Layout: docs/FORMAT.md.
_PEEK = struct.Struct("<Q4xI4xI")
PEEK = _PEEK.size
_BASE_OFFSET = struct.Struct("<Q")


def _os_error(what: str, path: str, err: OSError) -> OSError:
    return OSError(err.errno, f"{what} {path}: {err.strerror or err}")


def _write_all(fd: int, data: bytes, pos: int) -> None:
    """pwrite until done (os.pwrite retries EINTR itself); raises OSError."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        written = os.pwrite(fd, view[done:], pos + done)
        if written == 0:
            raise OSError(28, "no progress writing (disk full?)")
        done += written


def _read_at(fd: int, n: int, pos: int) -> bytes:
    """pread up to n bytes (fewer only at end of file)."""
    data = os.pread(fd, n, pos)
    while 0 < len(data) < n:
        more = os.pread(fd, n - len(data), pos + len(data))
        if not more:
            break
        data += more
    return data


def _peek(fd: int, pos: int) -> tuple[int, int, int] | None:
    """(base_offset, batch_length, record_count) of the batch header at `pos`, None past the end."""
    head = _read_at(fd, PEEK, pos)
    if len(head) != PEEK:
        return None
    base, length, count = _PEEK.unpack(head)
    return base, length, count


class _Segment:
    """One .log file and its .idx. Owned by SegmentedLog; readers may hold a reference. The descriptor closes
    with the last reference, so retention can unlink a segment that a reader is still reading."""

    fd = -1
    idx: mmap.mmap | None = None

    def __init__(self, directory: str, base: int) -> None:
        self.base = base
        self.log_path = os.path.join(directory, segment_name(base, LOG_SUFFIX))
        self.idx_path = os.path.join(directory, segment_name(base, INDEX_SUFFIX))
        self.size = 0  # bytes of whole, written batches
        self.next_offset = base  # offset after this segment's last record
        self.idx_capacity = 0  # entries the mapping holds
        self.idx_count = 0  # valid entries
        self.idx_reserved = 0  # bytes from the index file's start that have disk blocks (active only)
        self.last_indexed = 0  # file position of the newest entry
        self.opened = 0.0  # monotonic seconds when the first batch went in (age roll)

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        self.unmap()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def unmap(self) -> None:
        if self.idx is not None:
            self.idx.close()
            self.idx = None

    def map_index(self, capacity: int, writable: bool) -> None:
        """Map `capacity` entries of the .idx file (which must be at least that long)."""
        self.unmap()
        self.idx_capacity = capacity
        if capacity == 0:
            return
        try:
            fd = os.open(self.idx_path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
        except OSError as e:
            raise _os_error("cannot open index", self.idx_path, e) from e
        try:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            self.idx = mmap.mmap(fd, capacity * ENTRY, mmap.MAP_SHARED, prot)
        except OSError as e:
            raise _os_error("cannot mmap index", self.idx_path, e) from e
        finally:
            os.close(fd)

    def reserve_index(self, entries: int) -> None:
        """Give the first `entries` entries of the writable index disk blocks before they are stored, so that
        a full disk raises OSError (ENOSPC) here instead of SIGBUS in the store (see index_reservation)."""
        needed = min(entries, self.idx_capacity) * ENTRY
        if needed <= self.idx_reserved:
            return
        end = index_reservation(self.idx_reserved, needed, self.idx_capacity * ENTRY)
        try:
            fd = os.open(self.idx_path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise _os_error("cannot open index", self.idx_path, e) from e
        try:
            os.posix_fallocate(fd, self.idx_reserved, end - self.idx_reserved)
        except OSError as e:
            raise _os_error("cannot reserve index space in", self.idx_path, e) from e
        finally:
            os.close(fd)
        self.idx_reserved = end

    def entry(self, i: int) -> tuple[int, int]:
        """(relative offset, file position) of entry i."""
        assert self.idx is not None
        rel, pos = _ENTRY.unpack_from(self.idx, i * ENTRY)
        return rel, pos

    def entries(self) -> list[tuple[int, int]]:
        assert self.idx is not None
        return list(_ENTRY.iter_unpack(self.idx[:self.idx_count * ENTRY]))

    def add_entry(self, offset: int, position: int) -> bool:
        if self.idx_count >= self.idx_capacity:
            return False
        assert self.idx is not None
        _ENTRY.pack_into(self.idx, self.idx_count * ENTRY, offset - self.base, position)
        self.idx_count += 1
        self.last_indexed = position
        return True

    def find(self, offset: int) -> int:
        """Position of the last indexed batch whose first offset is <= offset (0 without entries)."""
        if self.idx_count == 0:
            return 0
        rel = (offset - self.base) & 0xFFFFFFFF
        lo, hi = 0, self.idx_count - 1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if self.entry(mid)[0] <= rel:
                lo = mid
            else:
                hi = mid - 1
        return self.entry(lo)[1]


class SegmentedLog:
    """The per-topic write-ahead log engine. See `_wal.pyx` for ownership and recovery."""

    def __init__(self, directory: str, *, segment_bytes: int = 128 * 1024 * 1024, segment_ms: int = 0,
                 index_interval_bytes: int = 4096, index_max_bytes: int = 1024 * 1024,
                 initial_offset: int = 0) -> None:
        if not isinstance(directory, str):
            raise TypeError(f"directory must be a str, not {type(directory).__name__}")
        segment_bytes = operator.index(segment_bytes)
        segment_ms = operator.index(segment_ms)
        index_interval_bytes = operator.index(index_interval_bytes)
        index_max_bytes = operator.index(index_max_bytes)
        initial_offset = operator.index(initial_offset)
        if not 0 < segment_bytes <= MAX_SEGMENT:
            raise ValueError(f"segment_bytes must be in 1..{MAX_SEGMENT}, not {segment_bytes}")
        if index_interval_bytes < 0 or segment_ms < 0:
            raise ValueError("index_interval_bytes and segment_ms must not be negative")
        if index_max_bytes < ENTRY * 2 or index_max_bytes % ENTRY:
            raise ValueError(f"index_max_bytes must be a multiple of {ENTRY}, at least {2 * ENTRY}")
        if not 0 <= initial_offset < 1 << 64:
            raise OverflowError(f"initial_offset {initial_offset} is not a u64")
        self._directory = os.path.abspath(directory)
        self._segment_bytes = segment_bytes
        self._segment_ms = segment_ms
        self._index_interval_bytes = index_interval_bytes
        self._index_max_bytes = index_max_bytes
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []
        self._bases: list[int] = []
        self._next_offset = 0
        self._written = 0  # bytes appended since open
        self._synced = 0  # of those, bytes an fdatasync covered
        self._failed: OSError | None = None
        self._closed = False
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
        return self._segments[0].base if self._segments else self._next_offset

    @property
    def segment_bases(self) -> list[int]:
        return list(self._bases)

    @property
    def unsynced_bytes(self) -> int:
        return self._written - self._synced

    # -- opening and recovery --------------------------------------------------------------------------

    def _fsync_dir(self) -> None:
        fd = os.open(self._directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _new_segment(self, base: int) -> _Segment:
        """Create an empty active segment with a mapped, sparse index (see _wal.pyx), durable in the
        directory."""
        seg = _Segment(self._directory, base)
        try:
            seg.fd = os.open(seg.log_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise _os_error("cannot create segment", seg.log_path, e) from e
        try:
            self._fresh_index(seg)
            self._fsync_dir()
        except BaseException:
            seg.close()
            raise
        seg.opened = time.monotonic()
        return seg

    def _fresh_index(self, seg: _Segment) -> None:
        with open(seg.idx_path, "wb") as f:
            f.truncate(self._index_max_bytes)
        seg.idx_count = 0
        seg.idx_reserved = 0
        seg.last_indexed = 0
        seg.map_index(self._index_max_bytes // ENTRY, writable=True)

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
            seg = _Segment(self._directory, base)
            try:
                seg.fd = os.open(seg.log_path, os.O_RDWR | os.O_CLOEXEC)
            except OSError as e:
                raise _os_error("cannot open segment", seg.log_path, e) from e
            self._segments.append(seg)  # first, so that a failure below closes it
            self._bases.append(base)
            seg.size = os.fstat(seg.fd).st_size
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
        self._active = self._segments[-1]
        self._active.opened = time.monotonic()
        self._next_offset = self._active.next_offset
        report.next_offset = self._next_offset
        self._recovery = report

    def _open_sealed(self, seg: _Segment, report: RecoveryReport) -> None:
        """A sealed segment: trust the data, check the index, rebuild it if it is missing or damaged."""
        ok = False
        if os.path.exists(seg.idx_path):
            size = os.stat(seg.idx_path).st_size
            count = size // ENTRY
            if size % ENTRY == 0 and count > 0:
                seg.map_index(count, writable=False)
                seg.idx_count = count
                ok = self._index_sane(seg)
        if not ok:
            log.warning("rebuilding the damaged or missing index %s", seg.idx_path)
            report.rebuilt_indexes.append(seg.base)
            self._rebuild_sealed_index(seg)
        rel, pos = seg.entry(seg.idx_count - 1)
        seg.next_offset = self._walk_to_end(seg, pos, seg.base + rel)

    def _index_sane(self, seg: _Segment) -> bool:
        """Entry 0 is (0, 0); offsets and positions strictly increase; the last entry points at a batch header
        with its base offset (only the last is read, like Kafka's sanityCheck, plus the monotony scan)."""
        entries = seg.entries()
        if entries[0] != (0, 0):
            return False
        for (rel0, pos0), (rel1, pos1) in itertools.pairwise(entries):
            if rel1 <= rel0 or pos1 <= pos0:
                return False
        rel, pos = entries[-1]
        if pos + HEADER_BYTES > seg.size:
            return False
        head = _peek(seg.fd, pos)
        return head is not None and head[0] == seg.base + rel

    def _rebuild_sealed_index(self, seg: _Segment) -> None:
        """Walk the sealed segment's batch headers (structure only) and write a fresh, exact-size index."""
        entries = bytearray()
        pos, last, expected = 0, -1, seg.base
        while pos < seg.size:
            head = _peek(seg.fd, pos)
            # A length below the header size would never move on (count 0 as well: an endless loop).
            if head is None or head[0] != expected or head[1] < HEADER_BYTES:
                raise WalCorrupt(f"sealed segment {seg.log_path} is damaged at byte {pos}; it is not the "
                                 "tail, so recovery will not cut it")
            if last < 0 or pos - last >= self._index_interval_bytes:
                entries += _ENTRY.pack(expected - seg.base, pos)
                last = pos
            expected += head[2]
            pos += head[1]
        if not entries:
            raise WalCorrupt(f"sealed segment {seg.log_path} is empty")
        tmp = seg.idx_path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(entries)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, seg.idx_path)
        self._fsync_dir()
        seg.map_index(len(entries) // ENTRY, writable=False)
        seg.idx_count = len(entries) // ENTRY

    def _walk_to_end(self, seg: _Segment, pos: int, offset: int) -> int:
        """Offset after the last record, walking headers from an indexed batch to the end of the file."""
        while pos < seg.size:
            head = _peek(seg.fd, pos)
            if head is None:
                raise WalCorrupt(f"sealed segment {seg.log_path} ends inside a batch at byte {pos}")
            base, length, count = head
            if length < HEADER_BYTES:
                raise WalCorrupt(f"sealed segment {seg.log_path} is damaged at byte {pos}: batch_length "
                                 f"{length}")
            offset = base + count
            pos += length
        if pos != seg.size:
            raise WalCorrupt(f"sealed segment {seg.log_path} ends inside a batch")
        return offset

    def _scan_active(self, seg: _Segment, report: RecoveryReport) -> None:
        """Verify every batch of the last segment, cut at the first bad one, rebuild its index."""
        self._fresh_index(seg)
        pos, expected, reason = 0, seg.base, None
        if seg.size > 0:
            try:
                data = mmap.mmap(seg.fd, seg.size, mmap.MAP_SHARED, mmap.PROT_READ)
            except OSError as e:
                raise _os_error("cannot mmap segment", seg.log_path, e) from e
            with data:
                pos, expected, reason = self._verify_batches(seg, data)
        report.scanned_bytes += pos
        seg.next_offset = expected
        if pos < seg.size:
            report.truncated_segment = seg.base
            report.truncated_from = pos
            report.truncated_bytes = seg.size - pos
            report.cut_reason = reason
            log.warning("WAL %s: cutting %d bytes from byte %d of segment %d (%s); next offset %d",
                        self._directory, seg.size - pos, pos, seg.base, reason, expected)
            try:
                os.ftruncate(seg.fd, pos)
            except OSError as e:
                raise _os_error("cannot truncate", seg.log_path, e) from e
            try:
                os.fsync(seg.fd)
            except OSError as e:
                raise _os_error("cannot fsync", seg.log_path, e) from e
            seg.size = pos

    def _verify_batches(self, seg: _Segment, data: mmap.mmap) -> tuple[int, int, str | None]:
        """Walk `data` (the segment's bytes) batch by batch with CRCs and offset continuity, indexing it.
        Returns the end of the good prefix, the offset after it and why it stopped (None at the end)."""
        pos, expected = 0, seg.base
        while pos < seg.size:
            try:
                header = _frames_py.verify_batch(data, pos)
            except FrameCorrupt as e:
                return pos, expected, str(e)
            if header.base_offset != expected:
                return pos, expected, (f"batch at byte {pos} has base offset {header.base_offset}, "
                                       f"expected {expected}")
            if pos == 0 or pos - seg.last_indexed >= self._index_interval_bytes:
                seg.reserve_index(seg.idx_count + 1)
                seg.add_entry(expected, pos)
            expected += header.record_count
            pos += header.length
        return pos, expected, None

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
        if not isinstance(buffers, list):
            raise TypeError(f"buffers must be a list, not {type(buffers).__name__}")
        self._check_open()
        ranges: list[tuple[int, int] | Exception] = []
        accepted: list[tuple[int, memoryview, int]] = []  # (index into buffers, bytes, record count)
        try:
            for i, buf in enumerate(buffers):
                view = memoryview(buf).cast("B")
                try:
                    records = _validate(view)
                except FrameCorrupt as e:
                    view.release()
                    ranges.append(e)
                    continue
                ranges.append((0, 0))  # placeholder, set once offsets are assigned
                accepted.append((i, view, records))
            return self._append_valid(ranges, accepted)
        finally:
            for _, view, _ in accepted:
                view.release()

    def _append_valid(self, ranges: list[tuple[int, int] | Exception],
                      accepted: list[tuple[int, memoryview, int]]) -> AppendResult:
        first = self._next_offset
        total = sum(len(view) for _, view, _ in accepted)
        if total == 0:
            return AppendResult(ranges, None, first, first)
        self._maybe_roll(total)
        seg = self._active
        out = bytearray(total)
        marks: list[tuple[int, int]] = []  # (offset, file position) of the batches that get index entries
        offset, p, last_indexed = first, 0, seg.last_indexed
        # Copy each buffer, stamping base offsets; note where new index entries go.
        for i, view, records in accepted:
            ranges[i] = (offset, offset + records - 1)
            out[p:p + len(view)] = view
            end = p + len(view)
            while p < end:
                at = seg.size + p
                _BASE_OFFSET.pack_into(out, p, offset)
                _, length, count = _PEEK.unpack_from(out, p)
                if at == 0 or at - last_indexed >= self._index_interval_bytes:
                    marks.append((offset, at))
                    last_indexed = at
                offset += count
                p += length
        data = bytes(out)
        written_from = seg.size
        # Disk blocks for the new entries before anything is written: a full disk refuses this append and
        # leaves the log as it was.
        try:
            seg.reserve_index(seg.idx_count + len(marks))
        except OSError as e:
            raise WalWriteError(f"appending {total} bytes to {seg.log_path} failed: {e.strerror or e}; "
                                "nothing of this append was kept") from e
        try:
            _write_all(seg.fd, data, written_from)
        except OSError as e:
            # Cut the partial write back so the file still ends on a whole batch. If even that fails, stop
            # appending: recovery on reopen will cut the torn tail.
            try:
                os.ftruncate(seg.fd, written_from)
            except OSError:
                self._fail(f"writing {total} bytes to {seg.log_path}", e)
            raise WalWriteError(f"writing {total} bytes to {seg.log_path} failed: {e.strerror or e}; "
                                "nothing of this append was kept") from e
        if seg.size == 0:
            seg.opened = time.monotonic()
        with self._lock:
            # Index entries only after the bytes they point at are in the file.
            for mark_offset, position in marks:
                if not seg.add_entry(mark_offset, position):
                    break
            seg.size += total
            seg.next_offset = offset
            self._next_offset = offset
            self._written += total
        return AppendResult(ranges, data, first, offset)

    def _maybe_roll(self, incoming: int) -> None:
        seg = self._active
        if seg.size == 0:
            return
        if (seg.size + incoming > self._segment_bytes
                or seg.idx_count >= seg.idx_capacity
                or (self._segment_ms > 0 and (time.monotonic() - seg.opened) * 1000 >= self._segment_ms)):
            self.roll()

    def sync(self) -> int:
        """fdatasync the active segment; returns the next offset it covered (see _wal.pyx)."""
        self._check_open()
        with self._lock:
            seg, covered, written = self._active, self._next_offset, self._written
        try:
            os.fdatasync(seg.fd)
        except OSError as e:
            # After a failed fsync the kernel may have dropped the dirty pages: nothing written since the last
            # good sync can be trusted, so refuse to go on (PostgreSQL's "fsyncgate" lesson).
            self._fail(f"fdatasync of {seg.log_path}", e)
        with self._lock:
            self._synced = max(self._synced, written)
        return covered

    def roll(self) -> None:
        """Seal the active segment (fsync data, cut and fsync its index) and start a new one."""
        self._check_open()
        seg = self._active
        if seg.size == 0:
            return
        try:
            self._seal(seg)
            self._synced = self._written
            new = self._new_segment(self._next_offset)
        except OSError as e:
            self._fail("rolling a segment", e)
        with self._lock:
            self._segments.append(new)
            self._bases.append(new.base)
            self._active = new

    def _seal(self, seg: _Segment) -> None:
        try:
            os.fdatasync(seg.fd)
        except OSError as e:
            raise _os_error("cannot fsync", seg.log_path, e) from e
        assert seg.idx is not None
        try:
            seg.idx.flush()
        except OSError as e:
            raise _os_error("cannot msync", seg.idx_path, e) from e
        count = seg.idx_count
        # The mapping stays valid for the entries kept; the cut gives back the reservation past them.
        with open(seg.idx_path, "r+b") as f:
            f.truncate(count * ENTRY)
            os.fsync(f.fileno())
        with self._lock:  # readers may be searching the mapping that is replaced
            seg.map_index(count, writable=False)
            seg.idx_count = count

    def delete_before(self, offset: int) -> int:
        """Retention: delete whole sealed segments whose every record is below `offset`."""
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
        if self._closed:
            return
        try:
            if self._failed is None and self._written > self._synced:
                self.sync()
        finally:
            with self._lock:
                self._closed = True
                for seg in self._segments:
                    seg.close()
                self._segments = []
                self._bases = []

    # -- reading ---------------------------------------------------------------------------------------

    def _segment_for(self, offset: int) -> _Segment:
        return self._segments[max(bisect.bisect_right(self._bases, offset) - 1, 0)]

    def _check_readable(self, offset: int) -> None:
        if offset < self.start_offset:
            raise OffsetOutOfRange(f"offset {offset} is below the first stored offset {self.start_offset}")

    def lookup(self, offset: int) -> tuple[int, int]:
        with self._lock:
            if self._closed:
                raise WalClosed(f"the WAL in {self._directory} is closed")
            self._check_readable(offset)
            seg = self._segment_for(offset)
            return seg.base, seg.find(offset)

    def read(self, offset: int, max_bytes: int, limit: int) -> bytes | memoryview | None:
        """Whole batches from the one holding `offset`: at most max_bytes, at least one batch, all below
        `limit`. Runs in any thread."""
        max_bytes = operator.index(max_bytes)
        with self._lock:
            if self._closed:
                raise WalClosed(f"the WAL in {self._directory} is closed")
            if offset >= limit:
                return None
            self._check_readable(offset)
            seg = self._segment_for(offset)
            size = seg.size
            pos = seg.find(offset)
        # Walk headers from the indexed batch to the one holding `offset`.
        while True:
            head = _peek(seg.fd, pos) if pos + PEEK <= size else None
            if head is None:
                return None
            base, length, count = head
            if base >= limit:
                return None
            if base + count > offset:
                break
            if length < HEADER_BYTES:  # only a damaged sealed segment; would never move on
                raise WalCorrupt(f"segment {seg.log_path} is damaged at byte {pos}: batch_length {length}")
            pos += length
        data = _read_at(seg.fd, min(max(max_bytes, length), size - pos), pos)
        return _whole_batches_below(data, limit)


def _validate(view: memoryview) -> int:
    """Check that `view` holds whole, valid batches; returns their record count. Raises FrameCorrupt."""
    if len(view) == 0:
        raise FrameCorrupt("empty buffer: nothing to append", 0)
    pos = records = 0
    while pos < len(view):
        header = _frames_py.verify_batch(view, pos)
        records += header.record_count
        pos += header.length
    return records


def _whole_batches_below(data: bytes, limit: int) -> bytes | memoryview | None:
    """The leading whole batches of `data` whose base offset is below `limit`."""
    cut = 0
    while cut + HEADER_BYTES <= len(data):
        base, length, _ = _PEEK.unpack_from(data, cut)
        if base >= limit or cut + length > len(data) or length < HEADER_BYTES:
            break
        cut += length
    if cut == 0:
        return None
    # A view, not a slice: slicing bytes would copy the whole read again.
    return data if cut == len(data) else memoryview(data)[:cut]

"""Segment primitives of the write-ahead log: the pure-Python twin of the native `_wal.pyx`.

`storage/wal_engine.py` selects this module instead of `_wal` when DANUBE_FAST_PURE=1. Both give the policy in
storage/segmented_log.py the same `Segment` and `check_buffers`: same files, same results, same errors. What a
Segment does and who may call what is described once, in `_wal.pyx`; the suite runs the policy over both and
compares them (tests/unit/test_wal_engine.py), so this module is the native one's differential oracle.

Batches are validated with the pure codec `_frames_py`, never the native one, so this module runs on hosts
where the extensions are not built.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import struct
import threading
from typing import TYPE_CHECKING

from danube_fast.codec import _frames_py
from danube_fast.errors import FrameCorrupt, WalCorrupt
from danube_fast.storage._wal_common import (
    INDEX_ENTRY_BYTES,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    PEEK_HEADER,
    advise_ahead,
    index_reservation,
    plausible,
    segment_name,
)

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["MAX_SEGMENT", "Segment", "check_buffers"]

ENTRY = INDEX_ENTRY_BYTES
HEADER_BYTES = _frames_py.HEADER_SIZE
MAX_SEGMENT = 1 << 30  # positions are u32: a 1 GiB segment plus one big group stays inside

BLOCK = 4096  # O_DIRECT alignment (see _wal.pyx)
FILE_CHUNK = 4 << 20  # bytes per O_DIRECT write of write_direct
_ENTRY = struct.Struct("<II")  # index entry: offset relative to the segment base, file position
_PEEK = PEEK_HEADER
PEEK = _PEEK.size
_BASE_OFFSET = struct.Struct("<Q")
_TIMES, _TIMES_AT = struct.Struct("<QQ"), 24  # base_timestamp and max_timestamp, at byte 24 of a header


def _os_error(what: str, path: str, err: OSError) -> OSError:
    return OSError(err.errno, f"{what} {path}: {err.strerror or err}")


def _write_all(fd: int, data: Buffer, pos: int, dfd: int = -1) -> None:
    """pwrite until done (os.pwrite retries EINTR itself); raises OSError. With `dfd`, whole aligned blocks
    go to the O_DIRECT descriptor and what it refuses or leaves unaligned to `fd` (see _wal.pyx)."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        use = dfd if dfd >= 0 and (pos + done) % BLOCK == 0 else fd
        try:
            written = os.pwrite(use, view[done:], pos + done)
        except OSError as e:
            if e.errno != errno.EINVAL or use != dfd:
                raise
            dfd = -1
            continue
        if written == 0:
            raise OSError(28, "no progress writing (disk full?)")
        done += written


_stages = threading.local()


def _stage(n: int) -> mmap.mmap:
    """This thread's page-aligned buffer of at least n bytes (anonymous maps are page-aligned), kept, as
    _wal.pyx keeps its own: never closed while a view of it may live on in a traceback."""
    buf: mmap.mmap | None = getattr(_stages, "buf", None)
    if buf is None or len(buf) < n:
        buf = mmap.mmap(-1, -(-n // (1 << 20)) * (1 << 20))
        _stages.buf = buf
    return buf


def write_direct(fd: int, dfd: int, parts: list[Buffer]) -> int:
    """The concatenation of `parts` from the start of the empty file `fd`, through its O_DIRECT descriptor
    `dfd` in whole blocks, the last block's padding cut; the bytes written (see _wal.pyx)."""
    buf = _stage(FILE_CHUNK)
    fill = pos = total = 0
    for part in parts:
        view = memoryview(part).cast("B")
        off = 0
        while off < len(view):
            take = min(len(view) - off, FILE_CHUNK - fill)
            buf[fill : fill + take] = view[off : off + take]
            fill += take
            off += take
            if fill == FILE_CHUNK:
                _write_all(fd, memoryview(buf)[:fill], pos, dfd)
                pos += fill
                fill = 0
        total += len(view)
    if fill:
        padded = -(-fill // BLOCK) * BLOCK
        buf[fill:padded] = bytes(padded - fill)
        _write_all(fd, memoryview(buf)[:padded], pos, dfd)
        if padded != fill:
            os.ftruncate(fd, total)
    return total


def _read_at(fd: int, n: int, pos: int) -> bytes:
    """pread up to n bytes (fewer only at end of file)."""
    data = os.pread(fd, n, pos)
    while 0 < len(data) < n:
        more = os.pread(fd, n - len(data), pos + len(data))
        if not more:
            break
        data += more
    return data


def _read_direct_at(rfd: int, n: int, pos: int) -> bytes:
    """`_read_at` through an O_DIRECT descriptor: the whole blocks around [pos, pos + n) into a page-aligned
    buffer, then the bytes asked for (fewer only at end of file)."""
    start = pos - pos % BLOCK
    end = (pos + n + BLOCK - 1) // BLOCK * BLOCK
    with mmap.mmap(-1, end - start) as buf:
        got = 0
        while start + got < end:
            with memoryview(buf) as view:
                r = os.preadv(rfd, [view[got:]], start + got)
            if r == 0:
                break
            got += r
        return buf[pos - start:min(pos - start + n, got)]


class Segment:
    """One .log file and its .idx (see `_wal.pyx`)."""

    fd = -1
    _dfd = -1  # O_DIRECT descriptor for appends (see _wal.pyx, Segment.direct)
    _want_direct = False
    _rfd = -1  # O_DIRECT descriptor for reads (see _wal.pyx, Segment.direct_reads)
    _want_direct_reads = False
    _tail = b""  # the file's last partial block as written, ending at _tail_end (-1: read it back)
    _tail_end = -1
    _file_end = 0  # the file's length, with the zero padding after `size`
    _idx: mmap.mmap | None = None

    def __init__(self, directory: str, base: int) -> None:
        if not 0 <= base < 1 << 64:
            raise OverflowError(f"segment base {base} is not a u64")
        self.base = base
        self.log_path = os.path.join(directory, segment_name(base, LOG_SUFFIX))
        self.idx_path = os.path.join(directory, segment_name(base, INDEX_SUFFIX))
        self.start = 0  # file position of the first batch: after the file header (an older segment: 0)
        self.size = 0  # end of the whole, written batches (the footer of a sealed segment lies past it)
        self.batches = self.min_time = self.max_time = 0  # for the footer: kept up by stamp and scan
        self.next_offset = base  # offset after this segment's last record
        self.opened = 0.0  # monotonic seconds when the first batch went in (age roll)
        self.idx_capacity = 0  # entries the mapping holds
        self.idx_count = 0  # valid entries
        self._idx_reserved = 0  # bytes from the index file's start that have disk blocks (active only)
        self.last_indexed = 0  # file position of the newest entry

    def __del__(self) -> None:
        self.close()

    # -- files -----------------------------------------------------------------------------------------

    def create(self, index_max_bytes: int) -> None:
        try:
            self.fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise _os_error("cannot create segment", self.log_path, e) from e
        self.fresh_index(index_max_bytes)

    def open(self) -> None:
        try:
            self.fd = os.open(self.log_path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise _os_error("cannot open segment", self.log_path, e) from e
        self.size = os.fstat(self.fd).st_size

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        self._unmap()
        self._close_direct()
        if self._rfd >= 0:
            os.close(self._rfd)
            self._rfd = -1
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _close_direct(self) -> None:
        if self._dfd >= 0:
            if self._file_end > self.size and self.fd >= 0:
                try:
                    os.ftruncate(self.fd, self.size)
                    self._file_end = self.size
                except OSError:
                    pass  # recovery cuts the padding too
            os.close(self._dfd)
            self._dfd = -1
        self._tail, self._tail_end = b"", -1

    def reopen(self, active: bool) -> None:
        try:
            self.fd = os.open(self.log_path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise _os_error("cannot open segment", self.log_path, e) from e
        self._map(self.idx_capacity if active else self.idx_count, writable=active)
        if active and self._want_direct:
            self.direct(True)
        if self._want_direct_reads:
            self.direct_reads(True)

    def direct_reads(self, on: bool) -> bool:
        """See `_wal.pyx`. Here only the data read goes direct (the header walk stays buffered); the
        result is the same."""
        self._want_direct_reads = on
        if not on:
            if self._rfd >= 0:
                os.close(self._rfd)
                self._rfd = -1
            return False
        if self._rfd >= 0:
            return True
        self._rfd = self._open_direct(os.O_RDONLY, "reads")
        if self._rfd < 0:
            self._want_direct_reads = False
            return False
        return True

    def _open_direct(self, mode: int, what: str) -> int:
        """See `_wal.pyx`: a second O_DIRECT descriptor, or -1 where the file system has no O_DIRECT."""
        try:
            return os.open(self.log_path, mode | os.O_DIRECT | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.EINVAL:
                return -1
            raise _os_error(f"cannot open segment for direct {what}", self.log_path, e) from e

    def direct(self, on: bool) -> bool:
        self._want_direct = on
        if not on:
            if self._dfd >= 0:
                if self._file_end > self.size:
                    self.cut(self.size)
                self._close_direct()
            return False
        if self._dfd >= 0:
            return True
        self._dfd = self._open_direct(os.O_WRONLY, "writes")
        if self._dfd < 0:
            self._want_direct = False
            return False
        self._tail, self._tail_end = b"", -1
        self._file_end = os.fstat(self.fd).st_size
        return True

    def _write_direct(self, data: Buffer, pos: int) -> None:
        view = memoryview(data).cast("B")
        start = pos - pos % BLOCK
        head = pos - start
        total = head + len(view)
        padded = -(-total // BLOCK) * BLOCK
        buf = _stage(padded)
        if head:
            tail = self._tail if self._tail_end == pos else os.pread(self.fd, head, start)
            if len(tail) != head:
                raise OSError(errno.EIO, f"cannot read back the last block of {self.log_path}")
            buf[:head] = tail
        buf[head:total] = view
        buf[total:padded] = bytes(padded - total)
        _write_all(self.fd, memoryview(buf)[:padded], start, self._dfd)
        end = pos + len(view)
        keep = end % BLOCK
        self._tail = buf[end - keep - start:end - start]
        self._tail_end = end
        self._file_end = max(self._file_end, start + padded)

    def write(self, data: Buffer, pos: int) -> None:
        try:
            if self._dfd >= 0:
                self._write_direct(data, pos)
            else:
                _write_all(self.fd, data, pos)
        except OSError as e:
            raise OSError(e.errno, f"cannot write to {self.log_path}: {e.strerror}") from None

    def cut(self, pos: int) -> None:
        try:
            os.ftruncate(self.fd, pos)
        except OSError as e:
            raise _os_error("cannot truncate", self.log_path, e) from e
        self._file_end = pos
        if self._tail_end > pos:
            self._tail_end = -1

    def datasync(self) -> None:
        try:
            os.fdatasync(self.fd)
        except OSError as e:
            raise _os_error("cannot fsync", self.log_path, e) from e

    def fsync(self) -> None:
        try:
            os.fsync(self.fd)
        except OSError as e:
            raise _os_error("cannot fsync", self.log_path, e) from e

    # -- the index -------------------------------------------------------------------------------------

    def _unmap(self) -> None:
        if self._idx is not None:
            self._idx.close()
            self._idx = None

    def _map(self, capacity: int, writable: bool) -> None:
        self._unmap()
        self.idx_capacity = capacity
        if capacity == 0:
            return
        try:
            fd = os.open(self.idx_path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
        except OSError as e:
            raise _os_error("cannot open index", self.idx_path, e) from e
        try:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            self._idx = mmap.mmap(fd, capacity * ENTRY, mmap.MAP_SHARED, prot)
        except OSError as e:
            raise _os_error("cannot mmap index", self.idx_path, e) from e
        finally:
            os.close(fd)

    def fresh_index(self, index_max_bytes: int) -> None:
        with open(self.idx_path, "wb") as f:
            f.truncate(index_max_bytes)
        self.idx_count = 0
        self._idx_reserved = 0
        self.last_indexed = 0
        self._map(index_max_bytes // ENTRY, writable=True)

    def load_index(self, count: int) -> None:
        self._map(count, writable=False)
        self.idx_count = count
        self.last_indexed = self.entry(count - 1)[1] if count else 0

    def resume_index(self, count: int, capacity: int) -> None:
        self._map(capacity, writable=True)
        self.idx_count = count
        self._idx_reserved = 0
        self.last_indexed = self.entry(count - 1)[1] if count else 0

    def sync_index(self) -> None:
        if self._idx is not None:
            try:
                self._idx.flush()
            except OSError as e:
                raise _os_error("cannot msync", self.idx_path, e) from e

    def seal_index(self) -> None:
        self.sync_index()
        with open(self.idx_path, "r+b") as f:
            f.truncate(self.idx_count * ENTRY)
            os.fsync(f.fileno())

    def reserve_index(self, entries: int) -> None:
        needed = min(entries, self.idx_capacity) * ENTRY
        if needed <= self._idx_reserved:
            return
        end = index_reservation(self._idx_reserved, needed, self.idx_capacity * ENTRY)
        try:
            fd = os.open(self.idx_path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise _os_error("cannot open index", self.idx_path, e) from e
        try:
            os.posix_fallocate(fd, self._idx_reserved, end - self._idx_reserved)
        except OSError as e:
            raise _os_error("cannot reserve index space in", self.idx_path, e) from e
        finally:
            os.close(fd)
        self._idx_reserved = end

    def entry(self, i: int) -> tuple[int, int]:
        if not 0 <= i < self.idx_count:
            raise IndexError(f"index entry {i} of {self.idx_count}")
        assert self._idx is not None
        rel, pos = _ENTRY.unpack_from(self._idx, i * ENTRY)
        return rel, pos

    def entries_every(self, interval: int) -> list[tuple[int, int]]:
        out, last = [], -interval
        for i in range(self.idx_count):
            rel, pos = self.entry(i)
            if pos - last >= interval:
                out.append((rel, pos))
                last = pos
        return out

    def entries_increasing(self) -> bool:
        entries = _ENTRY.iter_unpack(self._idx[:self.idx_count * ENTRY]) if self._idx is not None else ()
        return all(r1 > r0 and p1 > p0 for (r0, p0), (r1, p1) in itertools.pairwise(entries))

    def add_entries(self, marks: Buffer) -> None:
        n = min(len(memoryview(marks)) // ENTRY, self.idx_capacity - self.idx_count)
        if n <= 0:
            return
        assert self._idx is not None
        self._idx[self.idx_count * ENTRY:(self.idx_count + n) * ENTRY] = memoryview(marks)[:n * ENTRY]
        self.idx_count += n
        self.last_indexed = self.entry(self.idx_count - 1)[1]

    def _add_entry(self, offset: int, position: int) -> None:
        if self.idx_count < self.idx_capacity:
            self.reserve_index(self.idx_count + 1)
            self.add_entries(_ENTRY.pack(offset - self.base, position))

    def find(self, offset: int) -> int:
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

    # -- walking and verifying -------------------------------------------------------------------------

    def _head(self, pos: int) -> tuple[int, int, int, bool] | None:
        """(base offset, length, count, plausible) of the header at `pos`; None past the end."""
        head = _read_at(self.fd, PEEK, pos)
        if len(head) != PEEK:
            return None
        base, length, magic, version, count = _PEEK.unpack(head)
        return base, length, count, plausible(magic, version, length, count)

    def peek(self, pos: int) -> tuple[int, int, int] | None:
        head = self._head(pos)
        return None if head is None else head[:3]

    def walk(self, pos: int, offset: int) -> int:
        while pos < self.size:
            head = self._head(pos)
            if head is None or not head[3]:
                raise WalCorrupt(f"sealed segment {self.log_path} is damaged at byte {pos}")
            base, length, count, _ = head
            offset = base + count
            pos += length
        if pos != self.size:
            raise WalCorrupt(f"sealed segment {self.log_path} ends inside a batch")
        return offset

    def build_index(self, interval: int) -> bytes:
        entries = bytearray()
        pos, last, expected = self.start, -1, self.base
        while pos < self.size:
            head = self._head(pos)
            if head is None or not head[3] or head[0] != expected:
                raise WalCorrupt(f"sealed segment {self.log_path} is damaged at byte {pos}; it is not the "
                                 "tail, so recovery will not cut it")
            if last < 0 or pos - last >= interval:
                entries += _ENTRY.pack(expected - self.base, pos)
                last = pos
            expected += head[2]
            pos += head[1]
        return bytes(entries)

    def scan(self, interval: int) -> tuple[int, int, str | None]:
        pos, expected = self.start, self.base
        self.batches = 0
        if self.size <= pos:
            return pos, expected, None
        try:
            data = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ)
        except OSError as e:
            raise _os_error("cannot mmap segment", self.log_path, e) from e
        with data:
            while pos < self.size:
                try:
                    header = _frames_py.verify_batch(data, pos)
                except FrameCorrupt as e:
                    return pos, expected, str(e)
                if header.base_offset != expected:
                    return pos, expected, (f"batch at byte {pos} has base offset {header.base_offset}, "
                                           f"expected {expected}")
                if pos == self.start or pos - self.last_indexed >= interval:
                    self._add_entry(expected, pos)
                self._count(data, pos)
                expected += header.record_count
                pos += header.length
        return pos, expected, None

    def _count(self, data: Buffer, pos: int) -> None:
        """Count the batch whose header is at `pos` of `data` in the footer's figures."""
        lo, hi = _TIMES.unpack_from(data, pos + _TIMES_AT)
        if not self.batches:
            self.min_time, self.max_time = lo, hi
        self.min_time, self.max_time = min(self.min_time, lo), max(self.max_time, hi)
        self.batches += 1

    # -- appending -------------------------------------------------------------------------------------

    def stamp(self, views: list[memoryview | None], counts: list[int], ranges: list[object], first: int,
              interval: int) -> tuple[bytes, int, bytes]:
        out = bytearray(sum(len(v) for v in views if v is not None))
        marks = bytearray()
        offset, p, last_indexed = first, 0, self.last_indexed
        for i, view in enumerate(views):
            if view is None:
                continue
            ranges[i] = (offset, offset + counts[i] - 1)
            out[p:p + len(view)] = view
            end = p + len(view)
            while p < end:
                at = self.size + p
                _BASE_OFFSET.pack_into(out, p, offset)
                _, length, _, _, count = _PEEK.unpack_from(out, p)
                self._count(out, p)
                if at == self.start or at - last_indexed >= interval:
                    marks += _ENTRY.pack(offset - self.base, at)
                    last_indexed = at
                offset += count
                p += length
        return bytes(out), offset, bytes(marks)

    # -- reading ---------------------------------------------------------------------------------------

    def read(self, pos: int, size: int, offset: int, max_bytes: int, limit: int) -> bytes | memoryview | None:
        # Walk headers from the indexed batch to the one holding `offset`.
        while True:
            head = self._head(pos) if pos + PEEK <= size else None
            if head is None:
                return None
            base, length, count, looks_whole = head
            if not looks_whole:
                raise WalCorrupt(f"segment {self.log_path} is damaged at byte {pos}")
            if base >= limit:
                return None
            if base + count > offset:
                break
            pos += length
        n = min(max(max_bytes, length), size - pos)
        if self._rfd >= 0:
            data = _read_direct_at(self._rfd, n, pos)
        else:
            data = _read_at(self.fd, n, pos)
            advise_ahead(self.fd, pos, pos + len(data), size)
        # Keep whole batches below the limit.
        cut = 0
        while cut + HEADER_BYTES <= len(data):
            base, length, magic, version, count = _PEEK.unpack_from(data, cut)
            if not plausible(magic, version, length, count):
                raise WalCorrupt(f"segment {self.log_path} is damaged at byte {pos + cut}")
            if base >= limit or cut + length > len(data):
                break
            cut += length
        if cut == 0:
            return None
        # A view, not a slice: slicing bytes would copy the whole read again.
        return data if cut == len(data) else memoryview(data)[:cut]


def check_buffers(buffers: list[Buffer]) -> tuple[list[object], list[memoryview | None], list[int], int]:
    """See `_wal.pyx`."""
    ranges: list[object] = [None] * len(buffers)
    views: list[memoryview | None] = [None] * len(buffers)
    counts = [0] * len(buffers)
    total = 0
    for i, buf in enumerate(buffers):
        view = memoryview(buf).cast("B")
        try:
            counts[i] = _validate(view)
        except FrameCorrupt as e:
            ranges[i] = e
            continue
        views[i] = view
        total += len(view)
    return ranges, views, counts, total


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

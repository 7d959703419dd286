# cython: language_level=3
# Release directives (no bounds or wraparound checks, C division) come from setup.py, which turns them on
# for the DANUBE_FAST_DEBUG build; a directive here would override both.
"""Segmented write-ahead log: the native storage engine (twin: _wal_py.py, selected by DANUBE_FAST_PURE=1).

On disk, per topic, a folder of segments:
  {base_offset:020d}.log   record batches back to back (format: _frames.pyx), base offsets stamped
  {base_offset:020d}.idx   sparse index, fixed 8-byte entries (relative offset u32, file position u32, LE),
                           one every `index_interval_bytes` of log; entry 0 is (0, 0). The active segment's
                           index is a sparse file of `index_max_bytes`, mmap'd; its disk blocks are
                           reserved (posix_fallocate) before entries go into them, so that a full disk is an
                           error from append, not a SIGBUS from the mapping (_wal_common.index_reservation).
                           At roll it is cut to its entries and fsync'd. Kafka's OffsetIndex is the model.

Ownership: one thread (the storage facade's writer) calls append, roll, delete_before and close. sync may
run on a second thread alongside append (the facade's syncer pipelines fsyncs with writes): it captures
the segment and the next offset before its fdatasync, and returns that offset as what it covered.
Readers in other threads call read and lookup for offsets below the limit the writer published. All of them
hold the GIL whenever they touch this object's state; only the syscalls, copies and the CRC run without it,
so nobody sees half an update. A reader keeps the _Segment it reads alive, so retention may unlink a segment
under it; the descriptor closes when the last reference goes.

Recovery on open: sealed segments are trusted (they were fsync'd before the roll) but their index is sanity
checked and rebuilt when damaged or missing; the last segment is scanned batch by batch with CRCs and offset
continuity, cut at the first torn or corrupt batch, and its index rebuilt. The cut is logged and reported.
"""

import logging
import os
import time

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.errno cimport EINTR, errno
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from posix.fcntl cimport (
    O_CLOEXEC, O_CREAT, O_DIRECTORY, O_EXCL, O_RDONLY, O_RDWR, open as c_open, posix_fallocate,
)
from posix.mman cimport MAP_FAILED, MAP_SHARED, MS_SYNC, PROT_READ, PROT_WRITE, mmap, msync, munmap
from posix.unistd cimport close as c_close, fdatasync, fsync, ftruncate, pread, pwrite

from danube_fast._frames cimport (
    BATCH_MAGIC, BATCH_VERSION, BatchInfo, HEADER_BYTES, OFF_BASE_OFFSET, OFF_COUNT, OFF_LENGTH, OFF_MAGIC,
    NOGIL_MIN_BYTES, OFF_VERSION, check_batch, load_u32, load_u64, store_u32, store_u64,
)

from danube_fast._wal_common import (
    INDEX_ENTRY_BYTES, INDEX_SUFFIX, LOG_SUFFIX, AppendResult, RecoveryReport, index_reservation,
    segment_name,
)
from danube_fast.errors import FrameCorrupt, OffsetOutOfRange, WalClosed, WalCorrupt, WalWriteError

log = logging.getLogger("danube_fast.wal")

cdef enum:
    ENTRY = 8                      # INDEX_ENTRY_BYTES
    PEEK = 24                      # header bytes needed to walk: base_offset, crc, length, magic.., count
    MAX_SEGMENT = 1 << 30          # positions are u32: a 1 GiB segment plus one big group stays inside


cdef object _os_error(str what, str path):
    cdef int err = errno
    return OSError(err, f"{what} {path}: {os.strerror(err)}")


cdef int _write_all(int fd, const unsigned char* p, size_t n, Py_ssize_t pos) except -1:
    """pwrite until done; raises OSError (the caller turns it into WalWriteError)."""
    cdef ssize_t w
    cdef int err = 0
    # A small write into the page cache returns in microseconds: keeping the GIL is cheaper than a handoff
    # (see NOGIL_MIN_BYTES). A large one may wait on writeback, so it lets the event loop run.
    while n > 0:
        if n >= NOGIL_MIN_BYTES:
            with nogil:
                w = pwrite(fd, p, n, pos)
                if w < 0:
                    err = errno
        else:
            w = pwrite(fd, p, n, pos)
            if w < 0:
                err = errno
        if w < 0:
            if err == EINTR:
                continue
            raise OSError(err, os.strerror(err))
        if w == 0:
            raise OSError(28, "no progress writing (disk full?)")
        p += w
        n -= w
        pos += w
    return 0


cdef Py_ssize_t _read_at(int fd, unsigned char* p, size_t n, Py_ssize_t pos) except -1:
    """pread up to n bytes (fewer only at end of file)."""
    cdef ssize_t r
    cdef size_t done = 0
    cdef int err = 0
    while done < n:
        with nogil:
            r = pread(fd, p + done, n - done, pos + done)
            if r < 0:
                err = errno
        if r < 0:
            if err == EINTR:
                continue
            raise OSError(err, os.strerror(err))
        if r == 0:
            break
        done += r
    return done


cdef inline bint _plausible(const unsigned char* head) noexcept nogil:
    """A header walked without its CRC (sealed data, already verified once) must at least look like one;
    a zero length would otherwise walk in place forever."""
    return (head[OFF_MAGIC] == BATCH_MAGIC and head[OFF_VERSION] == BATCH_VERSION
            and load_u32(head + OFF_LENGTH) >= HEADER_BYTES and load_u32(head + OFF_COUNT) > 0)


cdef class _Segment:
    """One .log file and its .idx. Owned by SegmentedLog; readers may hold a reference."""

    cdef readonly uint64_t base
    cdef readonly str log_path
    cdef readonly str idx_path
    cdef int fd
    cdef Py_ssize_t size              # bytes of whole, written batches
    cdef uint64_t next_offset         # offset after this segment's last record
    cdef unsigned char* idx           # mmap'd entries
    cdef Py_ssize_t idx_capacity      # entries the mapping holds
    cdef Py_ssize_t idx_count         # valid entries
    cdef Py_ssize_t idx_reserved      # bytes from the index file's start that have disk blocks (active only)
    cdef bint idx_writable
    cdef Py_ssize_t last_indexed      # file position of the newest entry
    cdef double opened                # monotonic seconds when the first batch went in (age roll)

    def __cinit__(self):
        self.fd = -1
        self.idx = NULL

    def __dealloc__(self):
        self._unmap()
        if self.fd >= 0:
            c_close(self.fd)

    cdef void _unmap(self) noexcept:
        if self.idx != NULL:
            munmap(self.idx, self.idx_capacity * ENTRY)
            self.idx = NULL

    cdef int map_index(self, Py_ssize_t capacity, bint writable) except -1:
        """Map `capacity` entries of the .idx file (which must be at least that long)."""
        cdef int flags = O_RDWR if writable else O_RDONLY
        cdef int fd
        cdef void* m
        self._unmap()
        self.idx_capacity = capacity
        self.idx_writable = writable
        if capacity == 0:
            return 0
        fd = c_open(os.fsencode(self.idx_path), flags | O_CLOEXEC)
        if fd < 0:
            raise _os_error("cannot open index", self.idx_path)
        m = mmap(NULL, capacity * ENTRY, PROT_READ | (PROT_WRITE if writable else 0), MAP_SHARED, fd, 0)
        c_close(fd)
        if m == MAP_FAILED:
            raise _os_error("cannot mmap index", self.idx_path)
        self.idx = <unsigned char*>m
        return 0

    cdef int reserve_index(self, Py_ssize_t entries) except -1:
        """Give the first `entries` entries of the writable index disk blocks before they are stored, so that
        a full disk raises OSError (ENOSPC) here instead of SIGBUS in the store (see index_reservation)."""
        cdef Py_ssize_t needed = min(entries, self.idx_capacity) * ENTRY
        cdef Py_ssize_t start = self.idx_reserved, end
        cdef int fd, rc
        if needed <= start:
            return 0
        end = index_reservation(start, needed, self.idx_capacity * ENTRY)
        fd = c_open(os.fsencode(self.idx_path), O_RDWR | O_CLOEXEC)
        if fd < 0:
            raise _os_error("cannot open index", self.idx_path)
        # posix_fallocate returns the error number; it does not set errno.
        while True:
            with nogil:
                rc = posix_fallocate(fd, start, end - start)
            if rc != EINTR:
                break
        c_close(fd)
        if rc != 0:
            raise OSError(rc, f"cannot reserve index space in {self.idx_path}: {os.strerror(rc)}")
        self.idx_reserved = end
        return 0

    cdef inline uint32_t entry_rel(self, Py_ssize_t i) noexcept nogil:
        return load_u32(self.idx + i * ENTRY)

    cdef inline uint32_t entry_pos(self, Py_ssize_t i) noexcept nogil:
        return load_u32(self.idx + i * ENTRY + 4)

    cdef bint add_entry(self, uint64_t offset, Py_ssize_t position) noexcept:
        if self.idx_count >= self.idx_capacity:
            return False
        store_u32(self.idx + self.idx_count * ENTRY, <uint32_t>(offset - self.base))
        store_u32(self.idx + self.idx_count * ENTRY + 4, <uint32_t>position)
        self.idx_count += 1
        self.last_indexed = position
        return True

    cdef Py_ssize_t find(self, uint64_t offset) noexcept:
        """Position of the last indexed batch whose first offset is <= offset (0 without entries)."""
        cdef Py_ssize_t lo = 0, hi = self.idx_count - 1, mid
        cdef uint32_t rel = <uint32_t>(offset - self.base)
        if self.idx_count == 0:
            return 0
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if self.entry_rel(mid) <= rel:
                lo = mid
            else:
                hi = mid - 1
        return self.entry_pos(lo)


cdef class SegmentedLog:
    """The per-topic write-ahead log engine. See the module docstring for ownership and recovery."""

    cdef readonly str directory
    cdef readonly Py_ssize_t segment_bytes
    cdef readonly long long segment_ms
    cdef readonly Py_ssize_t index_interval_bytes
    cdef readonly Py_ssize_t index_max_bytes
    cdef readonly object recovery
    cdef list _segments
    cdef list _bases
    cdef _Segment _active
    cdef uint64_t _next_offset
    cdef uint64_t _written         # bytes appended since open (monotonic)
    cdef uint64_t _synced          # of those, bytes covered by an fdatasync
    cdef object _failed
    cdef bint _closed

    def __init__(self, str directory, *, Py_ssize_t segment_bytes=128 * 1024 * 1024, long long segment_ms=0,
                 Py_ssize_t index_interval_bytes=4096, Py_ssize_t index_max_bytes=1024 * 1024,
                 initial_offset=0):
        if not 0 < segment_bytes <= MAX_SEGMENT:
            raise ValueError(f"segment_bytes must be in 1..{MAX_SEGMENT}, not {segment_bytes}")
        if index_interval_bytes < 0 or segment_ms < 0:
            raise ValueError("index_interval_bytes and segment_ms must not be negative")
        if index_max_bytes < ENTRY * 2 or index_max_bytes % ENTRY:
            raise ValueError(f"index_max_bytes must be a multiple of {ENTRY}, at least {2 * ENTRY}")
        self.directory = os.path.abspath(directory)
        self.segment_bytes = segment_bytes
        self.segment_ms = segment_ms
        self.index_interval_bytes = index_interval_bytes
        self.index_max_bytes = index_max_bytes
        self._segments = []
        self._bases = []
        self._failed = None
        try:
            os.makedirs(self.directory, exist_ok=True)
            self._recover(int(initial_offset))
        except OSError as e:
            raise WalWriteError(f"cannot open the WAL in {self.directory}: {e.strerror or e}") from e

    # -- properties ------------------------------------------------------------------------------------

    @property
    def next_offset(self):
        return self._next_offset

    @property
    def start_offset(self):
        return self._segments[0].base if self._segments else self._next_offset

    @property
    def segment_bases(self):
        return list(self._bases)

    @property
    def unsynced_bytes(self):
        return self._written - self._synced

    # -- opening and recovery --------------------------------------------------------------------------

    cdef str _path(self, uint64_t base, str suffix):
        return os.path.join(self.directory, segment_name(base, suffix))

    cdef void _fsync_dir(self) except *:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    cdef _Segment _new_segment(self, uint64_t base):
        """Create an empty active segment with a mapped, sparse index, durable in the directory. None of the
        index is reserved yet: appends reserve what their entries need, so on a full disk it is the append
        after a roll that is refused."""
        cdef _Segment seg = _Segment.__new__(_Segment)
        seg.base = base
        seg.log_path = self._path(base, LOG_SUFFIX)
        seg.idx_path = self._path(base, INDEX_SUFFIX)
        seg.next_offset = base
        seg.fd = c_open(os.fsencode(seg.log_path), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        if seg.fd < 0:
            raise _os_error("cannot create segment", seg.log_path)
        self._fresh_index(seg)
        self._fsync_dir()
        seg.opened = time.monotonic()
        return seg

    cdef void _fresh_index(self, _Segment seg) except *:
        with open(seg.idx_path, "wb") as f:
            f.truncate(self.index_max_bytes)
        seg.idx_count = 0
        seg.idx_reserved = 0
        seg.last_indexed = 0
        seg.map_index(self.index_max_bytes // ENTRY, True)

    cdef void _recover(self, uint64_t initial_offset) except *:
        report = RecoveryReport()
        bases = sorted(int(n[:-len(LOG_SUFFIX)]) for n in os.listdir(self.directory)
                       if n.endswith(LOG_SUFFIX) and n[:-len(LOG_SUFFIX)].isdigit())
        for name in os.listdir(self.directory):   # indexes whose log is gone, and temp files
            stem = name[:-len(INDEX_SUFFIX)]
            if (name.endswith(INDEX_SUFFIX) and stem.isdigit() and int(stem) not in bases) or \
                    name.endswith(INDEX_SUFFIX + ".tmp"):
                os.unlink(os.path.join(self.directory, name))
        report.segments = len(bases)
        cdef _Segment seg
        cdef Py_ssize_t i
        for i, base in enumerate(bases):
            seg = _Segment.__new__(_Segment)
            seg.base = base
            seg.log_path = self._path(base, LOG_SUFFIX)
            seg.idx_path = self._path(base, INDEX_SUFFIX)
            seg.fd = c_open(os.fsencode(seg.log_path), O_RDWR | O_CLOEXEC)
            if seg.fd < 0:
                raise _os_error("cannot open segment", seg.log_path)
            seg.size = os.fstat(seg.fd).st_size
            if i + 1 < len(bases):
                self._open_sealed(seg, report)
                if seg.next_offset != bases[i + 1]:
                    raise WalCorrupt(f"segment {seg.log_path} ends at offset {seg.next_offset} but the next "
                                     f"segment starts at {bases[i + 1]}")
            else:
                self._scan_active(seg, report)
            self._segments.append(seg)
            self._bases.append(base)
        if not self._segments:
            seg = self._new_segment(initial_offset)
            self._segments.append(seg)
            self._bases.append(seg.base)
        self._active = self._segments[len(self._segments) - 1]
        self._active.opened = time.monotonic()
        self._next_offset = self._active.next_offset
        report.next_offset = self._next_offset
        self.recovery = report

    cdef void _open_sealed(self, _Segment seg, object report) except *:
        """A sealed segment: trust the data, check the index, rebuild it if it is missing or damaged."""
        cdef Py_ssize_t count
        cdef bint ok = False
        if os.path.exists(seg.idx_path):
            st = os.stat(seg.idx_path)
            count = st.st_size // ENTRY
            if st.st_size % ENTRY == 0 and count > 0:
                seg.map_index(count, False)
                seg.idx_count = count
                ok = self._index_sane(seg)
        if not ok:
            log.warning("rebuilding the damaged or missing index %s", seg.idx_path)
            report.rebuilt_indexes.append(seg.base)
            self._rebuild_sealed_index(seg)
        seg.next_offset = self._walk_to_end(seg, seg.entry_pos(seg.idx_count - 1),
                                            seg.base + seg.entry_rel(seg.idx_count - 1))

    cdef bint _index_sane(self, _Segment seg) except -1:
        """Entry 0 is (0, 0); offsets and positions strictly increase; each entry points at a batch header
        with that base offset (only the last is read, like Kafka's sanityCheck, plus the monotony scan)."""
        cdef Py_ssize_t i
        cdef unsigned char head[PEEK]
        if seg.entry_rel(0) != 0 or seg.entry_pos(0) != 0:
            return False
        for i in range(1, seg.idx_count):
            if seg.entry_rel(i) <= seg.entry_rel(i - 1) or seg.entry_pos(i) <= seg.entry_pos(i - 1):
                return False
        i = seg.idx_count - 1
        if seg.entry_pos(i) + HEADER_BYTES > seg.size:
            return False
        if _read_at(seg.fd, head, PEEK, seg.entry_pos(i)) != PEEK:
            return False
        return load_u64(head + OFF_BASE_OFFSET) == seg.base + seg.entry_rel(i)

    cdef void _rebuild_sealed_index(self, _Segment seg) except *:
        """Walk the sealed segment's batch headers (structure only) and write a fresh, exact-size index."""
        entries = bytearray()
        cdef Py_ssize_t pos = 0, last = -1
        cdef uint64_t expected = seg.base
        cdef unsigned char head[PEEK]
        while pos < seg.size:
            if (_read_at(seg.fd, head, PEEK, pos) != PEEK or not _plausible(head)
                    or load_u64(head + OFF_BASE_OFFSET) != expected):
                raise WalCorrupt(f"sealed segment {seg.log_path} is damaged at byte {pos}; it is not the tail, "
                                 "so recovery will not cut it")
            if last < 0 or pos - last >= self.index_interval_bytes:
                entries += (expected - seg.base).to_bytes(4, "little") + pos.to_bytes(4, "little")
                last = pos
            expected += load_u32(head + OFF_COUNT)
            pos += load_u32(head + OFF_LENGTH)
        if not entries:
            raise WalCorrupt(f"sealed segment {seg.log_path} is empty")
        tmp = seg.idx_path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(entries)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, seg.idx_path)
        self._fsync_dir()
        seg.map_index(len(entries) // ENTRY, False)
        seg.idx_count = len(entries) // ENTRY

    cdef uint64_t _walk_to_end(self, _Segment seg, Py_ssize_t pos, uint64_t offset) except? 0:
        """Offset after the last record, walking headers from an indexed batch to the end of the file."""
        cdef unsigned char head[PEEK]
        while pos < seg.size:
            if _read_at(seg.fd, head, PEEK, pos) != PEEK or not _plausible(head):
                raise WalCorrupt(f"sealed segment {seg.log_path} is damaged at byte {pos}")
            offset = load_u64(head + OFF_BASE_OFFSET) + load_u32(head + OFF_COUNT)
            pos += load_u32(head + OFF_LENGTH)
        if pos != seg.size:
            raise WalCorrupt(f"sealed segment {seg.log_path} ends inside a batch")
        return offset

    cdef void _scan_active(self, _Segment seg, object report) except *:
        """Verify every batch of the last segment, cut at the first bad one, rebuild its index."""
        cdef const unsigned char* data = NULL
        cdef void* m = NULL
        cdef Py_ssize_t pos = 0
        cdef uint64_t expected = seg.base
        cdef BatchInfo info
        cdef str reason = None
        self._fresh_index(seg)
        if seg.size > 0:
            m = mmap(NULL, seg.size, PROT_READ, MAP_SHARED, seg.fd, 0)
            if m == MAP_FAILED:
                raise _os_error("cannot mmap segment", seg.log_path)
            data = <const unsigned char*>m
        try:
            while pos < seg.size:
                try:
                    check_batch(data, seg.size, pos, &info, True)
                except FrameCorrupt as e:
                    reason = str(e)
                    break
                if info.base_offset != expected:
                    reason = f"batch at byte {pos} has base offset {info.base_offset}, expected {expected}"
                    break
                if pos == 0 or pos - seg.last_indexed >= self.index_interval_bytes:
                    seg.reserve_index(seg.idx_count + 1)
                    seg.add_entry(expected, pos)
                expected += info.count
                pos += info.length
        finally:
            if m != NULL:
                munmap(m, seg.size)
        report.scanned_bytes += pos
        seg.next_offset = expected
        if pos < seg.size:
            report.truncated_segment = seg.base
            report.truncated_from = pos
            report.truncated_bytes = seg.size - pos
            report.cut_reason = reason
            log.warning("WAL %s: cutting %d bytes from byte %d of segment %d (%s); next offset %d",
                        self.directory, seg.size - pos, pos, seg.base, reason, expected)
            if ftruncate(seg.fd, pos) != 0:
                raise _os_error("cannot truncate", seg.log_path)
            if fsync(seg.fd) != 0:
                raise _os_error("cannot fsync", seg.log_path)
            seg.size = pos

    # -- writing ---------------------------------------------------------------------------------------

    cdef void _check_open(self) except *:
        if self._closed:
            raise WalClosed(f"the WAL in {self.directory} is closed")
        if self._failed is not None:
            raise WalWriteError(f"the WAL in {self.directory} failed earlier ({self._failed}); "
                                "reopen it to recover") from self._failed

    cdef void _fail(self, str what, object err) except *:
        self._failed = err
        raise WalWriteError(f"{what} in {self.directory} failed: {err.strerror or err}") from err

    def append(self, list buffers):
        self._check_open()
        cdef Py_ssize_t n = len(buffers), i, total = 0, pos, blen, written_from
        cdef const unsigned char[::1] view
        cdef BatchInfo info
        cdef list ranges = [None] * n
        cdef list views = [None] * n
        cdef list counts = [0] * n
        cdef uint64_t records
        for i in range(n):
            try:
                view = memoryview(buffers[i]).cast("B")
                blen = view.shape[0]
                if blen == 0:
                    raise FrameCorrupt("empty buffer: nothing to append", 0)
                pos = 0
                records = 0
                while pos < blen:
                    check_batch(&view[0], blen, pos, &info, True)
                    records += info.count
                    pos += info.length
            except FrameCorrupt as e:
                ranges[i] = e
                continue
            views[i] = view
            counts[i] = records
            total += blen
        cdef uint64_t first = self._next_offset
        if total == 0:
            return AppendResult(ranges, None, first, first)
        self._maybe_roll(total)
        seg = self._active
        data = PyBytes_FromStringAndSize(NULL, total)
        cdef unsigned char* out = <unsigned char*>PyBytes_AS_STRING(data)
        cdef unsigned char* p = out
        cdef uint64_t offset = first
        cdef Py_ssize_t* marks = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * 2 * (total // HEADER_BYTES + 1))
        cdef Py_ssize_t nmarks = 0, last_indexed = seg.last_indexed, at
        if marks == NULL:
            raise MemoryError()
        try:
            # Copy each buffer, stamping base offsets; note where new index entries go.
            for i in range(n):
                if views[i] is None:
                    continue
                view = views[i]
                blen = view.shape[0]
                ranges[i] = (offset, offset + counts[i] - 1)
                with nogil:
                    memcpy(p, &view[0], blen)
                pos = 0
                while pos < blen:
                    at = seg.size + (p - out) + pos
                    store_u64(p + pos + OFF_BASE_OFFSET, offset)
                    if at == 0 or at - last_indexed >= self.index_interval_bytes:
                        marks[2 * nmarks] = <Py_ssize_t>(offset - seg.base)
                        marks[2 * nmarks + 1] = at
                        nmarks += 1
                        last_indexed = at
                    offset += load_u32(p + pos + OFF_COUNT)
                    pos += load_u32(p + pos + OFF_LENGTH)
                p += blen
            written_from = seg.size
            # Disk blocks for the new entries before anything is written: a full disk refuses this append
            # and leaves the log as it was.
            try:
                seg.reserve_index(seg.idx_count + nmarks)
            except OSError as e:
                raise WalWriteError(f"appending {total} bytes to {seg.log_path} failed: {e.strerror or e}; "
                                    "nothing of this append was kept") from e
            try:
                _write_all(seg.fd, out, total, written_from)
            except OSError as e:
                # Cut the partial write back so the file still ends on a whole batch. If even that fails,
                # stop appending: recovery on reopen will cut the torn tail.
                if ftruncate(seg.fd, written_from) != 0:
                    self._fail(f"writing {total} bytes to {seg.log_path}", e)
                raise WalWriteError(f"writing {total} bytes to {seg.log_path} failed: "
                                    f"{e.strerror or e}; nothing of this append was kept") from e
            # Index entries only after the bytes they point at are in the file.
            for i in range(nmarks):
                if not seg.add_entry(seg.base + <uint64_t>marks[2 * i], marks[2 * i + 1]):
                    break
        finally:
            free(marks)
        if seg.size == 0:
            seg.opened = time.monotonic()
        seg.size += total
        seg.next_offset = offset
        self._next_offset = offset
        self._written += total
        return AppendResult(ranges, data, first, offset)

    cdef void _maybe_roll(self, Py_ssize_t incoming) except *:
        seg = self._active
        if seg.size == 0:
            return
        if (seg.size + incoming > self.segment_bytes
                or seg.idx_count >= seg.idx_capacity
                or (self.segment_ms > 0 and (time.monotonic() - seg.opened) * 1000 >= self.segment_ms)):
            self.roll()

    def sync(self):
        """fdatasync the active segment. Returns the next offset it covered: every record below it that was
        appended before the call is durable. (Segments before the active one were synced when they rolled.)"""
        self._check_open()
        cdef _Segment seg = self._active          # held: retention cannot close its fd under us
        cdef uint64_t covered = self._next_offset, written = self._written
        cdef int fd = seg.fd, rc
        cdef int err = 0
        with nogil:
            rc = fdatasync(fd)
            if rc != 0:
                err = errno
        if rc != 0:
            # After a failed fsync the kernel may have dropped the dirty pages: nothing written since the
            # last good sync can be trusted, so refuse to go on (PostgreSQL's "fsyncgate" lesson).
            self._fail(f"fdatasync of {seg.log_path}", OSError(err, os.strerror(err)))
        if written > self._synced:
            self._synced = written
        return covered

    def roll(self):
        """Seal the active segment (fsync data, cut and fsync its index) and start a new one."""
        self._check_open()
        seg = self._active
        cdef int rc
        if seg.size == 0:
            return
        try:
            with nogil:
                rc = fdatasync(seg.fd)
            if rc != 0:
                raise _os_error("cannot fsync", seg.log_path)
            if msync(seg.idx, seg.idx_capacity * ENTRY, MS_SYNC) != 0:
                raise _os_error("cannot msync", seg.idx_path)
            count = seg.idx_count
            with open(seg.idx_path, "r+b") as f:      # the cut gives back the reservation past the entries
                f.truncate(count * ENTRY)
                os.fsync(f.fileno())
            seg.map_index(count, False)
            seg.idx_count = count
            self._synced = self._written
            new = self._new_segment(self._next_offset)
        except OSError as e:
            self._fail("rolling a segment", e)
        self._segments.append(new)
        self._bases.append(new.base)
        self._active = new

    def delete_before(self, offset):
        """Retention: delete whole sealed segments whose every record is below `offset`."""
        self._check_open()
        cdef int deleted = 0
        try:
            while len(self._segments) > 1 and (<_Segment>self._segments[0]).next_offset <= offset:
                seg = self._segments[0]
                # The index first: a crash in between leaves a log without index, which opening rebuilds.
                if os.path.exists(seg.idx_path):
                    os.unlink(seg.idx_path)
                os.unlink(seg.log_path)
                self._segments.pop(0)
                self._bases.pop(0)
                deleted += 1
            if deleted:
                self._fsync_dir()
        except OSError as e:
            raise WalWriteError(f"retention in {self.directory} failed: {e.strerror or e}") from e
        return deleted

    def close(self):
        if self._closed:
            return
        try:
            if self._failed is None and self._written > self._synced:
                self.sync()
        finally:
            self._closed = True
            for seg in self._segments:
                (<_Segment>seg)._unmap()
                if (<_Segment>seg).fd >= 0:
                    c_close((<_Segment>seg).fd)
                    (<_Segment>seg).fd = -1
            self._segments = []
            self._bases = []

    # -- reading ---------------------------------------------------------------------------------------

    cdef _Segment _segment_for(self, uint64_t offset):
        cdef Py_ssize_t lo = 0, hi = len(self._bases) - 1, mid
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if <uint64_t>self._bases[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return self._segments[lo]

    def lookup(self, offset):
        if self._closed:
            raise WalClosed(f"the WAL in {self.directory} is closed")
        if offset < self.start_offset:
            raise OffsetOutOfRange(f"offset {offset} is below the first stored offset {self.start_offset}")
        seg = self._segment_for(offset)
        return (seg.base, seg.find(offset))

    def read(self, offset, Py_ssize_t max_bytes, limit):
        """Whole batches from the one holding `offset`: at most max_bytes, at least one batch, all below
        `limit`. Runs in any thread; the GIL is released for the preads."""
        if self._closed:
            raise WalClosed(f"the WAL in {self.directory} is closed")
        if offset >= limit:
            return None
        if offset < self.start_offset:
            raise OffsetOutOfRange(f"offset {offset} is below the first stored offset {self.start_offset}")
        cdef _Segment seg = self._segment_for(offset)
        cdef uint64_t want = offset, lim = limit, base
        cdef Py_ssize_t size = seg.size, pos = seg.find(want), end, n, cut
        cdef unsigned char head[PEEK]
        cdef uint32_t length, count
        # Walk headers from the indexed batch to the one holding `offset`.
        while True:
            if pos + PEEK > size or _read_at(seg.fd, head, PEEK, pos) != PEEK:
                return None
            if not _plausible(head):
                raise WalCorrupt(f"segment {seg.log_path} is damaged at byte {pos}")
            base = load_u64(head + OFF_BASE_OFFSET)
            count = load_u32(head + OFF_COUNT)
            length = load_u32(head + OFF_LENGTH)
            if base >= lim:
                return None
            if base + count > want:
                break
            pos += length
        n = min(max(max_bytes, <Py_ssize_t>length), size - pos)
        data = PyBytes_FromStringAndSize(NULL, n)
        cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(data)
        n = _read_at(seg.fd, p, n, pos)
        # Keep whole batches below the limit.
        cut = 0
        while cut + HEADER_BYTES <= n:
            length = load_u32(p + cut + OFF_LENGTH)
            if not _plausible(p + cut):
                raise WalCorrupt(f"segment {seg.log_path} is damaged at byte {pos + cut}")
            if load_u64(p + cut + OFF_BASE_OFFSET) >= lim or cut + length > n:
                break
            cut += length
        if cut == 0:
            return None
        # A view, not a slice: slicing bytes would copy the whole read again.
        return data if cut == len(data) else memoryview(data)[:cut]

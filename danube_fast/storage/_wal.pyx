# cython: language_level=3
# Release directives (no bounds or wraparound checks, C division) come from setup.py, which turns them on
# for the DANUBE_FAST_DEBUG build; a directive here would override both.
"""Segment primitives of the write-ahead log, native (twin: _wal_py.py, selected by DANUBE_FAST_PURE=1).

The log's policy (roll, retention, index checks, who may touch what when) is written once, in
danube_fast/storage/segmented_log.py (recovery in log_loader.py, the segment files in segments.py), over the
primitives here: what is hot or a syscall. Stamping and copying a group, verifying batches with their CRCs,
walking headers, the mmap'd sparse index and its search, pread/pwrite/fdatasync. The file formats are
described in segments.py.

Thread safety: a Segment is not safe on its own. The policy changes what readers look at (size, next
offset, the index mapping and its entry count) under its lock and hands `read` a size it read under that
lock; the data calls (write, read, datasync) then run outside it, with the GIL released around the
syscalls that may wait. The descriptor closes in `close` (the policy calls it once no read is running) or
when the last reference goes, so retention can unlink a segment a reader still holds.
"""

import os
import threading

from cpython.buffer cimport PyBUF_FORMAT, PyBUF_WRITABLE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF
from libc.errno cimport EINTR, EINVAL, EIO, errno
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset
from posix.fcntl cimport (
    O_CLOEXEC, O_CREAT, O_EXCL, O_RDONLY, O_RDWR, O_WRONLY, POSIX_FADV_WILLNEED, open as c_open,
    posix_fadvise, posix_fallocate,
)
from posix.mman cimport MAP_FAILED, MAP_SHARED, MS_SYNC, PROT_READ, PROT_WRITE, mmap, msync, munmap
from posix.unistd cimport close as c_close, fdatasync, fsync, ftruncate, pread, pwrite


cdef extern from "fcntl.h":
    const int O_DIRECT  # Linux; pyconfig.h defines _GNU_SOURCE, which exposes it


cdef extern from "stdlib.h":
    int posix_memalign(void** memptr, size_t alignment, size_t size) nogil

from danube_fast.codec._frames cimport (
    BATCH_MAGIC, BATCH_VERSION, BatchInfo, HEADER_BYTES, OFF_BASE_OFFSET, OFF_BASE_TS, OFF_COUNT, OFF_LENGTH,
    OFF_MAGIC, OFF_MAX_TS, NOGIL_MIN_BYTES, OFF_VERSION, check_batch, load_u32, load_u64, store_u32, store_u64,
)

from danube_fast.storage._wal_common import INDEX_SUFFIX, LOG_SUFFIX, READ_ROOM, index_reservation, segment_name
from danube_fast.errors import FrameCorrupt, WalCorrupt

cdef Py_ssize_t ROOM = READ_ROOM

# A read's bytes object is handled as a pointer until it is cut to size: _PyBytes_Resize needs the only
# reference, and a Cython object variable cannot be passed by address.
cdef extern from "Python.h":
    PyObject* _new_bytes "PyBytes_FromStringAndSize"(const char* v, Py_ssize_t n) except NULL
    char* _bytes_at "PyBytes_AS_STRING"(PyObject* o)
    int _PyBytes_Resize(PyObject** s, Py_ssize_t n) except -1

cdef object _cut_to(PyObject* raw, Py_ssize_t size):
    """The new bytes object `raw` (its only reference, given here) shrunk to `size` bytes in place."""
    _PyBytes_Resize(&raw, size)  # on failure it frees the object and raises
    out = <object>raw
    Py_DECREF(out)
    return out


cdef enum:
    ENTRY = 8                      # INDEX_ENTRY_BYTES
    PEEK = 24                      # header bytes needed to walk: base_offset, crc, length, magic.., count
    _MAX_SEGMENT = 1 << 30         # positions are u32: a 1 GiB segment plus one big group stays inside
    AHEAD = 4 << 20                # read-ahead step of sequential reads (Segment.read)
    BLOCK = 4096                   # O_DIRECT alignment of buffer, position and length (any Linux block size
                                   # up to 4 KiB divides it)
    FILE_CHUNK = 4 << 20           # bytes per O_DIRECT write of write_direct

MAX_SEGMENT = _MAX_SEGMENT


cdef object _os_error(str what, str path):
    cdef int err = errno
    return OSError(err, f"{what} {path}: {os.strerror(err)}")


cdef int _write_all(int fd, const unsigned char* p, size_t n, Py_ssize_t pos, int dfd=-1) except -1:
    """pwrite until done; raises OSError (the caller turns it into WalWriteError). With `dfd` (the O_DIRECT
    descriptor; whole aligned blocks) the bytes go there; what it refuses (EINVAL: a file size limit cuts
    the length mid-block) or leaves unaligned goes through `fd`, which writes it or reports the real error."""
    cdef ssize_t w
    cdef int err = 0, use
    while n > 0:
        use = dfd if dfd >= 0 and pos % BLOCK == 0 else fd
        # A small write into the page cache returns in microseconds: keeping the GIL is cheaper than a
        # handoff (see NOGIL_MIN_BYTES). A large one may wait on writeback, a direct one on the device, so
        # they let the event loop run.
        if use == dfd or n >= NOGIL_MIN_BYTES:
            with nogil:
                w = pwrite(use, p, n, pos)
                if w < 0:
                    err = errno
        else:
            w = pwrite(use, p, n, pos)
            if w < 0:
                err = errno
        if w < 0:
            if err == EINTR:
                continue
            if err == EINVAL and use == dfd:
                dfd = -1
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


cdef class _Stage:
    """A writer thread's block-aligned buffer for O_DIRECT appends (one per thread, not per segment: ten
    thousand active segments must not each hold one). It grows to the largest group the thread wrote."""
    cdef unsigned char* p
    cdef size_t cap

    def __dealloc__(self):
        free(self.p)

    cdef unsigned char* fit(self, size_t n) except NULL:
        cdef void* m = NULL
        if n > self.cap:
            n = (n + (1 << 20) - 1) & ~<size_t>((1 << 20) - 1)
            if posix_memalign(&m, BLOCK, n) != 0:
                raise MemoryError(f"cannot allocate an aligned {n}-byte write buffer")
            free(self.p)
            self.p = <unsigned char*>m
            self.cap = n
        return self.p


_stages = threading.local()


cdef _Stage _stage():
    cdef _Stage st = getattr(_stages, "stage", None)
    if st is None:
        st = _Stage()
        _stages.stage = st
    return st


cdef class _Aligned:
    """One group as a direct append writes it, in a block-aligned buffer of its own: the segment's last
    partial block (`head` bytes), the stamped batches (`n` bytes), zeros up to the next block. Through the
    buffer protocol it is the batches alone (read-only): the group's bytes for AppendResult, the tail cache
    and readers, so the write needs no copy into the stage (Segment.stamp, Segment.write)."""
    cdef unsigned char* p
    cdef Py_ssize_t head
    cdef Py_ssize_t n
    cdef Py_ssize_t padded
    cdef Py_ssize_t start        # file position of p[0]
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __dealloc__(self):
        free(self.p)

    def __len__(self):
        return self.n

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("a stamped group is read-only")
        self.shape[0] = self.n
        self.strides[0] = 1
        buffer.buf = self.p + self.head
        buffer.len = self.n
        buffer.readonly = 1
        buffer.itemsize = 1
        buffer.format = NULL
        if flags & PyBUF_FORMAT:
            buffer.format = b"B"
        buffer.ndim = 1
        buffer.shape = self.shape
        buffer.strides = self.strides
        buffer.suboffsets = NULL
        buffer.internal = NULL
        buffer.obj = self

    def __releasebuffer__(self, Py_buffer* buffer):
        pass


def write_direct(int fd, int dfd, list parts):
    """Write the concatenation of `parts` from the start of the empty file open as `fd`, through `dfd` (an
    O_DIRECT descriptor of the same file) in whole blocks from this thread's aligned stage, FILE_CHUNK bytes
    a write; the zeros padding the last block are cut with ftruncate on `fd`. Returns the bytes written; the
    caller fsyncs `fd`. A write `dfd` refuses goes through `fd` (see _write_all).

    Why: an object written through the page cache costs the kernel a copy into pages it allocates for it,
    which on the benchmark VM cost up to 2.7 ms of CPU per MB (docs/ARCHITECTURE.md, "Direct object
    writes"); from a reused aligned buffer the device reads the bytes itself."""
    cdef unsigned char* buf = _stage().fit(FILE_CHUNK)
    cdef const unsigned char[::1] view
    cdef const unsigned char* src
    cdef Py_ssize_t fill = 0, pos = 0, total = 0, off, n, take, padded
    for part in parts:
        view = memoryview(part).cast("B")
        n = view.shape[0]
        off = 0
        while off < n:
            take = min(n - off, FILE_CHUNK - fill)
            src = &view[off]  # indexed with the GIL: the debug build checks bounds
            with nogil:
                memcpy(buf + fill, src, take)
            fill += take
            off += take
            if fill == FILE_CHUNK:
                _write_all(fd, buf, fill, pos, dfd)
                pos += fill
                fill = 0
        total += n
    if fill:
        padded = (fill + BLOCK - 1) // BLOCK * BLOCK
        memset(buf + fill, 0, padded - fill)
        _write_all(fd, buf, padded, pos, dfd)
        if padded != fill and ftruncate(fd, total) != 0:
            raise OSError(errno, os.strerror(errno))
    return total


cdef class Segment:
    """One .log file and its .idx. Owned by SegmentedLog (storage/segmented_log.py); readers may hold a
    reference. Errors of the files come out as OSError naming the file, damage as WalCorrupt."""

    cdef readonly uint64_t base
    cdef readonly str log_path
    cdef readonly str idx_path
    cdef int fd
    cdef public Py_ssize_t start          # file position of the first batch: after the file header (a
                                          # segment older than it: 0)
    cdef public Py_ssize_t size           # end of the whole, written batches (the footer of a sealed
                                          # segment lies past it)
    # What the footer of the sealed segment says of its batches: kept up by stamp and scan.
    cdef public uint64_t batches
    cdef public uint64_t min_time
    cdef public uint64_t max_time
    cdef public uint64_t next_offset      # offset after this segment's last record
    cdef public double opened             # monotonic seconds when the first batch went in (age roll)
    cdef unsigned char* idx               # mmap'd entries
    cdef readonly Py_ssize_t idx_capacity # entries the mapping holds
    cdef readonly Py_ssize_t idx_count    # valid entries
    cdef Py_ssize_t idx_reserved          # bytes from the index file's start that have disk blocks (active)
    cdef readonly Py_ssize_t last_indexed # file position of the newest entry
    # O_DIRECT appends (direct): a second descriptor, the file's last partial block as written (tail, valid
    # up to tail_end; -1: read it back), and the file's length with the zero padding after `size`.
    cdef int dfd
    cdef bint want_direct
    # O_DIRECT reads (direct_reads): a read-only descriptor of the same file.
    cdef int rfd
    cdef bint want_direct_reads
    cdef unsigned char* tail
    cdef Py_ssize_t tail_end
    cdef Py_ssize_t file_end

    def __cinit__(self):
        self.fd = -1
        self.dfd = -1
        self.rfd = -1
        self.idx = NULL
        self.tail = NULL
        self.tail_end = -1

    def __init__(self, str directory, uint64_t base):
        self.base = base
        self.next_offset = base
        self.log_path = os.path.join(directory, segment_name(base, LOG_SUFFIX))
        self.idx_path = os.path.join(directory, segment_name(base, INDEX_SUFFIX))

    def __dealloc__(self):
        self._unmap()
        if self.dfd >= 0:
            c_close(self.dfd)
        if self.rfd >= 0:
            c_close(self.rfd)
        if self.fd >= 0:
            c_close(self.fd)
        free(self.tail)

    cdef void _unmap(self) noexcept:
        if self.idx != NULL:
            munmap(self.idx, self.idx_capacity * ENTRY)
            self.idx = NULL

    # -- files -----------------------------------------------------------------------------------------

    def create(self, Py_ssize_t index_max_bytes):
        """Create the .log (it must not exist) and a fresh, empty index."""
        self.fd = c_open(os.fsencode(self.log_path), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        if self.fd < 0:
            raise _os_error("cannot create segment", self.log_path)
        self.fresh_index(index_max_bytes)

    def open(self):
        """Open the existing .log; `size` becomes its length."""
        self.fd = c_open(os.fsencode(self.log_path), O_RDWR | O_CLOEXEC)
        if self.fd < 0:
            raise _os_error("cannot open segment", self.log_path)
        self.size = os.fstat(self.fd).st_size

    def fileno(self):
        """The log file's descriptor (a sendfile span dups it: storage/file_span.py)."""
        return self.fd

    def close(self):
        """Close the descriptors and unmap the index; the fields (size, entry count, capacity) stay, so that
        reopen can bring the segment back as it was. Zero padding from direct appends is cut first (best
        effort: recovery cuts it too)."""
        self._unmap()
        self._close_direct()
        if self.rfd >= 0:
            c_close(self.rfd)
            self.rfd = -1
        if self.fd >= 0:
            c_close(self.fd)
            self.fd = -1

    cdef void _close_direct(self) noexcept:
        if self.dfd >= 0:
            if self.file_end > self.size and self.fd >= 0 and ftruncate(self.fd, self.size) == 0:
                self.file_end = self.size
            c_close(self.dfd)
            self.dfd = -1
        free(self.tail)
        self.tail = NULL
        self.tail_end = -1

    def reopen(self, bint active):
        """Reopen a segment this process closed: the .log, and the index mapped as before (the active one
        writable at its full capacity, a sealed one read-only), and direct appends if they were on."""
        self.fd = c_open(os.fsencode(self.log_path), O_RDWR | O_CLOEXEC)
        if self.fd < 0:
            raise _os_error("cannot open segment", self.log_path)
        self._map(self.idx_capacity if active else self.idx_count, active)
        if active and self.want_direct:
            self.direct(True)
        if self.want_direct_reads:
            self.direct_reads(True)

    def direct(self, bint on):
        """Turn O_DIRECT appends on (True when the file system takes them) or off (the padding cut; the
        caller's next fdatasync makes the cut durable).

        Why: an fsync'd append through the page cache costs the kernel a copy, page bookkeeping and
        writeback on every group; written directly it goes from one aligned buffer to the device (measured
        in docs/ARCHITECTURE.md, "Direct appends"). A write covers whole 4 KiB blocks: the last partial
        block is rewritten from the copy kept in `tail`, and the rest of the last block is zeros, which
        recovery cuts like any torn tail. Reads stay on the buffered descriptor."""
        cdef int fd
        self.want_direct = on
        if not on:
            if self.dfd >= 0:
                if self.file_end > self.size:
                    self.cut(self.size)
                self._close_direct()
            return False
        if self.dfd >= 0:
            return True
        fd = self._open_direct(O_WRONLY, "writes")
        if fd < 0:
            self.want_direct = False
            return False
        self.tail = <unsigned char*>malloc(BLOCK)
        if self.tail == NULL:
            c_close(fd)
            raise MemoryError()
        self.dfd = fd
        self.tail_end = -1
        self.file_end = os.fstat(self.fd).st_size
        return True

    def direct_reads(self, bint on):
        """Read with O_DIRECT from now on (True when the file system takes it) or through the page cache.

        Why: with direct appends (`direct`) the data is not in the page cache, so a buffered read has the
        kernel read it into fresh cache pages and copy it out; a direct read lands in the caller's buffer
        with no copy and no page bookkeeping. Measured here reading 1 GiB in 1 MiB preads: the same
        1.2-1.5 GB/s, at 0.06 s of CPU instead of 0.3-0.4 s. The cost: readers of the same data no longer
        share the page cache's copy, so the broker turns it on only when asked (`[wal] direct_reads`;
        docs/ARCHITECTURE.md, "Direct reads"). Only for a log whose appends are direct: a direct read of
        dirty cached pages makes the kernel write them back first."""
        cdef int fd
        self.want_direct_reads = on
        if not on:
            if self.rfd >= 0:
                c_close(self.rfd)
                self.rfd = -1
            return False
        if self.rfd >= 0:
            return True
        fd = self._open_direct(O_RDONLY, "reads")
        if fd < 0:
            self.want_direct_reads = False
            return False
        self.rfd = fd
        return True

    cdef int _open_direct(self, int mode, str what) except -2:
        """A second descriptor of the .log with O_DIRECT, or -1 where the file system has no O_DIRECT (tmpfs
        and some others answer EINVAL); other failures raise."""
        cdef int fd = c_open(os.fsencode(self.log_path), mode | O_DIRECT | O_CLOEXEC)
        if fd < 0:
            if errno == EINVAL:
                return -1
            raise _os_error(f"cannot open segment for direct {what}", self.log_path)
        return fd

    cdef _Aligned _aligned(self, Py_ssize_t n):
        """A buffer for `n` stamped bytes that will follow `size`: the last partial block first (from `tail`,
        or read back), zeros after the group up to a block."""
        cdef _Aligned a = _Aligned.__new__(_Aligned)
        cdef void* m = NULL
        cdef Py_ssize_t pos = self.size
        a.start = pos - pos % BLOCK
        a.head = pos - a.start
        a.n = n
        a.padded = (a.head + n + BLOCK - 1) // BLOCK * BLOCK
        if posix_memalign(&m, BLOCK, a.padded) != 0:
            raise MemoryError(f"cannot allocate an aligned {a.padded}-byte group")
        a.p = <unsigned char*>m
        self._load_head(a.p, pos)
        memset(a.p + a.head + n, 0, a.padded - a.head - n)
        return a

    cdef int _load_head(self, unsigned char* buf, Py_ssize_t pos) except -1:
        """The bytes of `pos`'s block before `pos` into `buf`: from `tail`, or read back from the file."""
        cdef Py_ssize_t head = pos % BLOCK
        if head:
            if self.tail_end == pos:
                memcpy(buf, self.tail, head)
            elif _read_at(self.fd, buf, head, pos - head) != head:
                raise OSError(EIO, f"cannot read back the last block of {self.log_path}")
        return 0

    cdef int _write_blocks(self, const unsigned char* buf, Py_ssize_t start, Py_ssize_t end,
                           Py_ssize_t padded) except -1:
        """Write `padded` bytes of whole blocks from `start` (the data ends at `end`) and keep the new last
        partial block in `tail`."""
        _write_all(self.fd, buf, padded, start, self.dfd)
        memcpy(self.tail, buf + (end - end % BLOCK - start), end % BLOCK)
        self.tail_end = end
        self.file_end = max(self.file_end, start + padded)
        return 0

    cdef int _write_direct(self, const unsigned char* data, Py_ssize_t n, Py_ssize_t pos) except -1:
        cdef Py_ssize_t start = pos - pos % BLOCK, head = pos - start, total = head + n
        cdef Py_ssize_t padded = (total + BLOCK - 1) // BLOCK * BLOCK
        cdef unsigned char* buf = _stage().fit(padded)
        self._load_head(buf, pos)
        if n >= NOGIL_MIN_BYTES:
            with nogil:
                memcpy(buf + head, data, n)
        else:
            memcpy(buf + head, data, n)
        memset(buf + total, 0, padded - total)
        return self._write_blocks(buf, start, pos + n, padded)

    def write(self, data, Py_ssize_t pos):
        """pwrite all of `data` at `pos` (a group `stamp` laid out for a direct write at `pos`: as it is)."""
        cdef const unsigned char[::1] view = memoryview(data).cast("B")
        cdef _Aligned a
        if view.shape[0]:
            try:
                if self.dfd >= 0 and isinstance(data, _Aligned) and \
                        (<_Aligned>data).start + (<_Aligned>data).head == pos:
                    a = <_Aligned>data
                    self._write_blocks(a.p, a.start, a.start + a.head + a.n, a.padded)
                elif self.dfd >= 0:
                    self._write_direct(&view[0], view.shape[0], pos)
                else:
                    _write_all(self.fd, &view[0], view.shape[0], pos)
            except OSError as e:
                raise OSError(e.errno, f"cannot write to {self.log_path}: {e.strerror}") from None

    def cut(self, Py_ssize_t pos):
        """ftruncate the .log to `pos` (a failed write is cut back to the last whole batch)."""
        if ftruncate(self.fd, pos) != 0:
            raise _os_error("cannot truncate", self.log_path)
        self.file_end = pos
        if self.tail_end > pos:
            self.tail_end = -1

    def datasync(self):
        cdef int fd = self.fd, rc, err = 0
        with nogil:
            rc = fdatasync(fd)
            if rc != 0:
                err = errno
        if rc != 0:
            raise OSError(err, f"cannot fsync {self.log_path}: {os.strerror(err)}")

    def fsync(self):
        if fsync(self.fd) != 0:
            raise _os_error("cannot fsync", self.log_path)

    # -- the index -------------------------------------------------------------------------------------

    cdef int _map(self, Py_ssize_t capacity, bint writable) except -1:
        cdef int fd
        cdef void* m
        self._unmap()
        self.idx_capacity = capacity
        if capacity == 0:
            return 0
        fd = c_open(os.fsencode(self.idx_path), (O_RDWR if writable else O_RDONLY) | O_CLOEXEC)
        if fd < 0:
            raise _os_error("cannot open index", self.idx_path)
        m = mmap(NULL, capacity * ENTRY, PROT_READ | (PROT_WRITE if writable else 0), MAP_SHARED, fd, 0)
        c_close(fd)
        if m == MAP_FAILED:
            raise _os_error("cannot mmap index", self.idx_path)
        self.idx = <unsigned char*>m
        return 0

    def fresh_index(self, Py_ssize_t index_max_bytes):
        """A new, empty, writable index: a sparse file of index_max_bytes, mapped. None of it is reserved:
        entries reserve what they need (reserve_index)."""
        with open(self.idx_path, "wb") as f:
            f.truncate(index_max_bytes)
        self.idx_count = 0
        self.idx_reserved = 0
        self.last_indexed = 0
        self._map(index_max_bytes // ENTRY, True)

    def load_index(self, Py_ssize_t count):
        """Map the first `count` entries of the .idx file read-only (a sealed segment's index)."""
        self._map(count, False)
        self.idx_count = count
        self.last_indexed = self.entry_pos(count - 1) if count else 0

    def resume_index(self, Py_ssize_t count, Py_ssize_t capacity):
        """Map the index of the active segment as a clean close left it (storage/segments.py `take_clean`):
        writable at `capacity` entries, the first `count` valid; appends reserve disk blocks again from the
        start (reserving blocks already held costs nothing)."""
        self._map(capacity, True)
        self.idx_count = count
        self.idx_reserved = 0
        self.last_indexed = self.entry_pos(count - 1) if count else 0

    def sync_index(self):
        """msync the index's entries (a clean close vouches for them)."""
        if self.idx != NULL and msync(self.idx, self.idx_capacity * ENTRY, MS_SYNC) != 0:
            raise _os_error("cannot msync", self.idx_path)

    def seal_index(self):
        """msync the entries and cut the file to them (which gives back the reservation past them), durably.
        The mapping stays valid for the entries; load_index(idx_count) then maps them read-only."""
        self.sync_index()
        with open(self.idx_path, "r+b") as f:
            f.truncate(self.idx_count * ENTRY)
            os.fsync(f.fileno())

    def reserve_index(self, Py_ssize_t entries):
        """Give the first `entries` entries of the writable index disk blocks before they are stored, so that
        a full disk raises OSError (ENOSPC) here instead of SIGBUS in the store (see index_reservation)."""
        cdef Py_ssize_t needed = min(entries, self.idx_capacity) * ENTRY
        cdef Py_ssize_t start = self.idx_reserved, end
        cdef int fd, rc
        if needed <= start:
            return
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

    cdef inline uint32_t entry_rel(self, Py_ssize_t i) noexcept nogil:
        return load_u32(self.idx + i * ENTRY)

    cdef inline uint32_t entry_pos(self, Py_ssize_t i) noexcept nogil:
        return load_u32(self.idx + i * ENTRY + 4)

    def entry(self, Py_ssize_t i):
        """(offset relative to base, file position) of entry i."""
        if not 0 <= i < self.idx_count:
            raise IndexError(f"index entry {i} of {self.idx_count}")
        return (self.entry_rel(i), self.entry_pos(i))

    def entries_every(self, Py_ssize_t interval):
        """(relative offset, position) of entry 0 and of every entry at least `interval` bytes after the last
        one taken (the footer's sparser index)."""
        cdef Py_ssize_t i, last = -interval
        out = []
        for i in range(self.idx_count):
            if <Py_ssize_t>self.entry_pos(i) - last >= interval:
                last = self.entry_pos(i)
                out.append((self.entry_rel(i), last))
        return out

    def entries_increasing(self):
        """Offsets and positions strictly increase from entry to entry."""
        cdef Py_ssize_t i
        for i in range(1, self.idx_count):
            if self.entry_rel(i) <= self.entry_rel(i - 1) or self.entry_pos(i) <= self.entry_pos(i - 1):
                return False
        return True

    def add_entries(self, const unsigned char[::1] marks):
        """Store packed entries (from stamp) after the bytes they point at are in the file; stops when the
        index is full (the next append rolls)."""
        cdef Py_ssize_t n = min(marks.shape[0] // ENTRY, self.idx_capacity - self.idx_count)
        if n <= 0:
            return
        memcpy(self.idx + self.idx_count * ENTRY, &marks[0], n * ENTRY)
        self.idx_count += n
        self.last_indexed = self.entry_pos(self.idx_count - 1)

    cdef int _add_entry(self, uint64_t offset, Py_ssize_t position) except -1:
        if self.idx_count < self.idx_capacity:
            self.reserve_index(self.idx_count + 1)
            store_u32(self.idx + self.idx_count * ENTRY, <uint32_t>(offset - self.base))
            store_u32(self.idx + self.idx_count * ENTRY + 4, <uint32_t>position)
            self.idx_count += 1
            self.last_indexed = position
        return 0

    def find(self, uint64_t offset):
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

    # -- walking and verifying -------------------------------------------------------------------------

    def peek(self, Py_ssize_t pos):
        """(base offset, batch length, record count) of the header at `pos`, None past the end of the file."""
        cdef unsigned char head[PEEK]
        if _read_at(self.fd, head, PEEK, pos) != PEEK:
            return None
        return (load_u64(head + OFF_BASE_OFFSET), load_u32(head + OFF_LENGTH), load_u32(head + OFF_COUNT))

    def walk(self, Py_ssize_t pos, uint64_t offset):
        """Offset after the last record, walking the (sealed) headers from the batch at `pos` that starts at
        `offset` to the end of the file."""
        cdef unsigned char head[PEEK]
        while pos < self.size:
            if _read_at(self.fd, head, PEEK, pos) != PEEK or not _plausible(head):
                raise WalCorrupt(f"sealed segment {self.log_path} is damaged at byte {pos}")
            offset = load_u64(head + OFF_BASE_OFFSET) + load_u32(head + OFF_COUNT)
            pos += load_u32(head + OFF_LENGTH)
        if pos != self.size:
            raise WalCorrupt(f"sealed segment {self.log_path} ends inside a batch")
        return offset

    def build_index(self, Py_ssize_t interval):
        """Packed index entries for a sealed segment, from its headers (structure only, offsets continuous)."""
        entries = bytearray()
        cdef Py_ssize_t pos = self.start, last = -1
        cdef uint64_t expected = self.base
        cdef unsigned char head[PEEK]
        while pos < self.size:
            if (_read_at(self.fd, head, PEEK, pos) != PEEK or not _plausible(head)
                    or load_u64(head + OFF_BASE_OFFSET) != expected):
                raise WalCorrupt(f"sealed segment {self.log_path} is damaged at byte {pos}; it is not the "
                                 "tail, so recovery will not cut it")
            if last < 0 or pos - last >= interval:
                entries += (expected - self.base).to_bytes(4, "little") + pos.to_bytes(4, "little")
                last = pos
            expected += load_u32(head + OFF_COUNT)
            pos += load_u32(head + OFF_LENGTH)
        return bytes(entries)

    def scan(self, Py_ssize_t interval):
        """Verify every batch from the start (structure, CRC, continuous offsets) into the fresh index.
        Returns (end of the good prefix, offset after it, why it stopped or None at the end of the file)."""
        cdef const unsigned char* data = NULL
        cdef void* m = NULL
        cdef Py_ssize_t pos = self.start
        cdef uint64_t expected = self.base
        cdef BatchInfo info
        cdef str reason = None
        self.batches = 0
        if self.size > 0:
            m = mmap(NULL, self.size, PROT_READ, MAP_SHARED, self.fd, 0)
            if m == MAP_FAILED:
                raise _os_error("cannot mmap segment", self.log_path)
            data = <const unsigned char*>m
        try:
            while pos < self.size:
                try:
                    check_batch(data, self.size, pos, &info, True)
                except FrameCorrupt as e:
                    reason = str(e)
                    break
                if info.base_offset != expected:
                    reason = f"batch at byte {pos} has base offset {info.base_offset}, expected {expected}"
                    break
                if pos == self.start or pos - self.last_indexed >= interval:
                    self._add_entry(expected, pos)
                self._count(data + pos)
                expected += info.count
                pos += info.length
        finally:
            if m != NULL:
                munmap(m, self.size)
        return (pos, expected, reason)

    cdef inline void _count(self, const unsigned char* head) noexcept:
        """Count the batch whose header is at `head` in the footer's figures."""
        cdef uint64_t lo = load_u64(head + OFF_BASE_TS), hi = load_u64(head + OFF_MAX_TS)
        if self.batches == 0 or lo < self.min_time:
            self.min_time = lo
        if self.batches == 0 or hi > self.max_time:
            self.max_time = hi
        self.batches += 1

    # -- appending -------------------------------------------------------------------------------------

    def stamp(self, list views, list counts, list ranges, uint64_t first, Py_ssize_t interval):
        """Copy the valid buffers (views[i] not None; from check_buffers) into one bytes object as they would
        follow this segment's `size` bytes, stamping base offsets from `first`; sets ranges[i] to (first,
        last) offsets. Returns (data, offset after it, packed index entries for the batches that get one)."""
        cdef Py_ssize_t n = len(views), i, total = 0, pos, blen, at, last_indexed = self.last_indexed
        cdef const unsigned char[::1] view
        cdef const unsigned char* src
        cdef unsigned char* out
        for i in range(n):
            if views[i] is not None:
                total += len(views[i])
        if self.dfd >= 0 and total >= NOGIL_MIN_BYTES:
            data = self._aligned(total)
            out = (<_Aligned>data).p + (<_Aligned>data).head
        else:  # small groups: a copy into the stage costs less than a block of its own in the cache
            data = PyBytes_FromStringAndSize(NULL, total)
            out = <unsigned char*>PyBytes_AS_STRING(data)
        marks = PyBytes_FromStringAndSize(NULL, (total // HEADER_BYTES + 1) * ENTRY)
        cdef unsigned char* mk = <unsigned char*>PyBytes_AS_STRING(marks)
        cdef unsigned char* p = out
        cdef Py_ssize_t nmarks = 0
        cdef uint64_t offset = first
        for i in range(n):
            if views[i] is None:
                continue
            view = views[i]
            blen = view.shape[0]
            ranges[i] = (offset, offset + <uint64_t>counts[i] - 1)
            src = &view[0]  # indexed with the GIL: the debug build checks bounds
            if blen >= NOGIL_MIN_BYTES:
                with nogil:
                    memcpy(p, src, blen)
            else:
                memcpy(p, src, blen)
            pos = 0
            while pos < blen:
                at = self.size + (p - out) + pos
                store_u64(p + pos + OFF_BASE_OFFSET, offset)
                self._count(p + pos)
                if at == self.start or at - last_indexed >= interval:
                    store_u32(mk + nmarks * ENTRY, <uint32_t>(offset - self.base))
                    store_u32(mk + nmarks * ENTRY + 4, <uint32_t>at)
                    nmarks += 1
                    last_indexed = at
                offset += load_u32(p + pos + OFF_COUNT)
                pos += load_u32(p + pos + OFF_LENGTH)
            p += blen
        return (data, offset, marks[:nmarks * ENTRY])

    # -- reading ---------------------------------------------------------------------------------------

    cdef int _walk(self, const unsigned char* head, Py_ssize_t pos, uint64_t offset, uint64_t limit,
                   uint32_t* length) except -2:
        """One step of the header walk, the header read from `pos`: 1 if its batch holds `offset`, 0 to go on
        (`length` bytes further), -1 if it is at or past `limit`."""
        if not _plausible(head):
            raise WalCorrupt(f"segment {self.log_path} is damaged at byte {pos}")
        length[0] = load_u32(head + OFF_LENGTH)
        if load_u64(head + OFF_BASE_OFFSET) >= limit:
            return -1
        return 1 if load_u64(head + OFF_BASE_OFFSET) + load_u32(head + OFF_COUNT) > offset else 0

    def read(self, Py_ssize_t pos, Py_ssize_t size, uint64_t offset, Py_ssize_t max_bytes, uint64_t limit):
        """Whole batches from the one holding `offset`, walking from the indexed batch at `pos`, within the
        first `size` bytes: at most max_bytes, at least one batch, all below `limit`. None when there is no
        such batch. The GIL is released for the preads."""
        cdef Py_ssize_t n, cut
        cdef unsigned char head[PEEK]
        cdef uint32_t length
        cdef int found
        if self.rfd >= 0:
            got = self._read_direct(pos, size, offset, max_bytes, limit)
            if got is not False:
                return got
        # Walk headers from the indexed batch to the one holding `offset`.
        while True:
            if pos + PEEK > size or _read_at(self.fd, head, PEEK, pos) != PEEK:
                return None
            found = self._walk(head, pos, offset, limit, &length)
            if found < 0:
                return None
            if found:
                break
            pos += length
        n = min(max(max_bytes, <Py_ssize_t>length), size - pos)
        # The batches go after READ_ROOM free bytes of the same object: a fast API response writes its framing
        # there instead of copying the batches behind it (fast_wire.py).
        cdef PyObject* raw = _new_bytes(NULL, ROOM + n)
        cdef unsigned char* p = <unsigned char*>_bytes_at(raw) + ROOM
        cdef Py_ssize_t step
        try:
            memset(p - ROOM, 0, ROOM)
            n = _read_at(self.fd, p, n, pos)
            # A reader going through the segment in 1 MiB reads gets the next AHEAD..2*AHEAD bytes asked of
            # the device once per step: direct appends leave recent data out of the page cache, and the
            # kernel's own read-ahead for 1 MiB reads reached about a third of the device's speed here
            # (docs/ARCHITECTURE.md).
            step = (pos + n) // AHEAD * AHEAD
            if (pos < step or pos % AHEAD == 0) and step < size:
                with nogil:
                    posix_fadvise(self.fd, step, min(2 * AHEAD, size - step), POSIX_FADV_WILLNEED)
            cut = self._whole(p, n, pos, limit)
        except BaseException:
            Py_DECREF(<object>raw)
            raise
        if cut == 0:
            Py_DECREF(<object>raw)
            return None
        # Cut in place to the whole batches (a view alone would keep the object's tail, which a response
        # built on the object cannot have), then a view past the room.
        return memoryview(_cut_to(raw, ROOM + cut))[ROOM:]

    cdef Py_ssize_t _whole(self, const unsigned char* p, Py_ssize_t n, Py_ssize_t pos, uint64_t limit) except -1:
        """The bytes of the whole batches below `limit` at the start of the `n` bytes read from `pos`."""
        cdef Py_ssize_t cut = 0
        cdef uint32_t length
        while cut + HEADER_BYTES <= n:
            length = load_u32(p + cut + OFF_LENGTH)
            if not _plausible(p + cut):
                raise WalCorrupt(f"segment {self.log_path} is damaged at byte {pos + cut}")
            if load_u64(p + cut + OFF_BASE_OFFSET) >= limit or cut + length > n:
                break
            cut += length
        return cut

    cdef object _read_direct(self, Py_ssize_t pos, Py_ssize_t size, uint64_t offset, Py_ssize_t max_bytes,
                             uint64_t limit):
        """`read` through the O_DIRECT descriptor, with the same result: the whole blocks around what is
        wanted go into an aligned scratch buffer and the header walk runs in that memory; when the walk ends
        past what was read, the blocks from the batch it found are read instead. The batches are copied out
        (the GIL released) into a bytes object after READ_ROOM free bytes, as `read` leaves them. Returns a
        view of them, None as `read` does, or False when a read came back short (`read` then does it the
        buffered way)."""
        cdef Py_ssize_t start, end, got, avail, at, n, cut
        cdef Py_ssize_t want = max_bytes + BLOCK  # the walk from the indexed batch is usually within a block
        cdef uint32_t length
        cdef int found
        cdef unsigned char* p
        cdef void* scratch = NULL
        while True:
            if pos + PEEK > size:
                return None
            start = pos - pos % BLOCK
            end = (min(pos + max(want, <Py_ssize_t>PEEK), size) + BLOCK - 1) // BLOCK * BLOCK
            if posix_memalign(&scratch, BLOCK, end - start) != 0:
                raise MemoryError()
            p = <unsigned char*>scratch
            try:
                got = _read_at(self.rfd, p, end - start, start)
                avail = min(start + got, size)  # file positions [start, avail) are in memory
                # Walk headers from the indexed batch to the one holding `offset`.
                at = pos
                while True:
                    if at + PEEK > size:
                        return None
                    if at + PEEK > avail:
                        break
                    found = self._walk(p + (at - start), at, offset, limit, &length)
                    if found < 0:
                        return None
                    if found:
                        n = min(max(max_bytes, <Py_ssize_t>length), size - at)
                        if at + n <= avail:
                            cut = self._whole(p + (at - start), n, at, limit)
                            if cut == 0:
                                return None
                            return _after_room(p + (at - start), cut)
                        want = n
                        break
                    at += length
                    want = max_bytes
            finally:
                free(scratch)
                scratch = NULL
            if at == pos:
                return False  # the blocks from `pos` itself came back short
            pos = at


cdef object _after_room(const unsigned char* src, Py_ssize_t n):
    """A copy of `n` bytes from `src` after READ_ROOM zero bytes of a new bytes object, as a view of the
    copy; the GIL released for the copy."""
    data = PyBytes_FromStringAndSize(NULL, ROOM + n)
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(data)
    memset(p, 0, ROOM)
    with nogil:
        memcpy(p + ROOM, src, n)
    return memoryview(data)[ROOM:]


def check_buffers(list buffers):
    """Validate each buffer (whole batches: structure, CRC, records). Returns (ranges, views, counts, total):
    ranges[i] is the FrameCorrupt that rejected buffers[i] or None; views[i] its bytes or None; counts[i] its
    record count; total the bytes of the accepted ones."""
    cdef Py_ssize_t n = len(buffers), i, total = 0, pos, blen
    cdef const unsigned char[::1] view
    cdef BatchInfo info
    cdef uint64_t records
    cdef list ranges = [None] * n
    cdef list views = [None] * n
    cdef list counts = [0] * n
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
    return (ranges, views, counts, total)

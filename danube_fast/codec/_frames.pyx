# cython: language_level=3
# Release directives (no bounds or wraparound checks, C division) come from setup.py, which turns them on
# for the DANUBE_FAST_DEBUG build; a directive here would override both.
"""Record-batch codec: the native hot path (twin: _frames_py.py, selected by DANUBE_FAST_PURE=1).

The byte layout is written once: field by field with the reasons in docs/FORMAT.md, and as the named
positions of _frames.pxd, which this module and _wal.pyx use. The pure-Python twin derives its positions
from its own structs; tests/unit/test_layout_pinned.py pins them to LAYOUT below.
"""

import sys

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from danube_fast.errors import FrameCorrupt


cdef extern from "_crc32c.h":
    void crc32c_init() noexcept nogil
    uint32_t crc32c_update(uint32_t crc, const unsigned char* p, size_t n) noexcept nogil

cdef extern from "_utf8.h":
    int utf8_valid(const unsigned char* s, size_t n) noexcept nogil

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL

# Compression codecs (docs/FORMAT.md#compression), called directly: they run on every compressed batch the
# WAL checks and every one a decoder expands, with the GIL released for large batches.
cdef extern from "zstd.h":
    ctypedef struct ZSTD_CCtx:
        pass
    ctypedef struct ZSTD_DCtx:
        pass
    int ZSTD_CLEVEL_DEFAULT
    ZSTD_CCtx* ZSTD_createCCtx() nogil
    size_t ZSTD_freeCCtx(ZSTD_CCtx* c) nogil
    ZSTD_DCtx* ZSTD_createDCtx() nogil
    size_t ZSTD_freeDCtx(ZSTD_DCtx* c) nogil
    size_t ZSTD_compressCCtx(ZSTD_CCtx* c, void* dst, size_t cap, const void* src, size_t n, int level) nogil
    size_t ZSTD_decompressDCtx(ZSTD_DCtx* c, void* dst, size_t cap, const void* src, size_t n) nogil
    size_t ZSTD_compressBound(size_t n) nogil
    unsigned ZSTD_isError(size_t code) nogil
    const char* ZSTD_getErrorName(size_t code) nogil
    int ZSTD_minCLevel() nogil
    int ZSTD_maxCLevel() nogil

cdef extern from "lz4.h":
    int LZ4_compress_default(const char* src, char* dst, int n, int cap) nogil
    int LZ4_decompress_safe(const char* src, char* dst, int n, int cap) nogil
    int LZ4_compressBound(int n) nogil


if sys.byteorder != "little":
    raise ImportError("danube_fast.codec._frames needs a little-endian host; set DANUBE_FAST_PURE=1 elsewhere")
crc32c_init()

MAGIC = BATCH_MAGIC
VERSION = BATCH_VERSION
HEADER_SIZE = HEADER_BYTES
MAX_BATCH_BYTES = MAX_BATCH

# Every position of _frames.pxd by field name, for the test that pins the twin to this module.
LAYOUT = {
    "base_offset": OFF_BASE_OFFSET, "crc": OFF_CRC, "batch_length": OFF_LENGTH, "magic": OFF_MAGIC,
    "version": OFF_VERSION, "flags": OFF_FLAGS, "record_count": OFF_COUNT, "base_timestamp": OFF_BASE_TS,
    "max_timestamp": OFF_MAX_TS, "producer_id": OFF_PRODUCER_ID, "producer_name_len": OFF_NAME_LEN,
    "broker_addr_len": OFF_ADDR_LEN, "raw_size": OFF_RAW_SIZE, "header": HEADER_BYTES, "crc_from": CRC_FROM,
    "record.length": REC_LENGTH, "record.flags": REC_FLAGS, "record.timestamp_delta": REC_TS_DELTA,
    "record.fixed": REC_FIXED, "flag.request_id": F_REQUEST_ID, "flag.schema_id": F_SCHEMA_ID,
    "flag.schema_version": F_SCHEMA_VERSION, "flag.routing_key": F_ROUTING_KEY,
    "flag.attributes": F_ATTRIBUTES, "flag.known": F_KNOWN, "codec.mask": CODEC_MASK,
    "codec.zstd": CODEC_ZSTD, "codec.lz4": CODEC_LZ4, "flag.sequenced": FLAG_SEQUENCED,
    "sequence_bytes": SEQ_BYTES,
}

# Codec names by number (docs/FORMAT.md#compression); `compression=` arguments take the names.
COMPRESSIONS = ("none", "zstd", "lz4")

# pyarrow is imported on first use (danube_fast/codec/_arrow.py says why).
from danube_fast.codec._arrow import arrow_schema, pyarrow as _pyarrow


def __getattr__(name):
    if name == "ARROW_SCHEMA":
        return arrow_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

cdef uint64_t U64_MAX = 0xFFFFFFFFFFFFFFFF


cdef uint32_t crc32c_of(const unsigned char* p, size_t n) noexcept nogil:
    return crc32c_update(0, p, n)


# ---------------------------------------------------------------------------------------------------------
# Buffers: hold the Py_buffer for as long as the pointer is used, release it in __dealloc__.

cdef class _Input:
    cdef Py_buffer view
    cdef bint held
    cdef const unsigned char* ptr
    cdef Py_ssize_t size

    def __cinit__(self, object obj, bint writable=False):
        cdef int flags = PyBUF_WRITABLE if writable else PyBUF_SIMPLE
        if writable:
            try:
                PyObject_GetBuffer(obj, &self.view, flags)
            except BufferError as e:
                raise TypeError(f"a writable buffer is needed, not {type(obj).__name__}") from e
        else:
            PyObject_GetBuffer(obj, &self.view, flags)
        self.held = True
        self.ptr = <const unsigned char*>self.view.buf
        self.size = self.view.len

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)


# ---------------------------------------------------------------------------------------------------------
# Python-visible records and headers

cdef class Record:
    """One message. `offset` is -1 until the record is decoded from a stamped batch."""

    cdef public object payload
    cdef public object publish_time
    cdef public object request_id
    cdef public object routing_key
    cdef public object attributes
    cdef public object schema_id
    cdef public object schema_version
    cdef public object offset

    def __init__(self, payload, publish_time=0, request_id=0, routing_key=None, attributes=None,
                 schema_id=None, schema_version=None, offset=-1):
        self.payload = payload
        self.publish_time = publish_time
        self.request_id = request_id
        self.routing_key = routing_key
        self.attributes = attributes
        self.schema_id = schema_id
        self.schema_version = schema_version
        self.offset = offset

    def _fields(self):
        return (self.payload, self.publish_time, self.request_id, self.routing_key, self.attributes,
                self.schema_id, self.schema_version, self.offset)

    def __eq__(self, other):
        if not isinstance(other, Record):
            return NotImplemented
        return self._fields() == (<Record>other)._fields()

    __hash__ = None

    def __reduce__(self):
        return (Record, self._fields())

    def __repr__(self):
        return ("Record(payload=%r, publish_time=%r, request_id=%r, routing_key=%r, attributes=%r, "
                "schema_id=%r, schema_version=%r, offset=%r)" % self._fields())


cdef class BatchHeader:
    """The header of one batch, at byte `position` of the buffer it was read from."""

    cdef readonly Py_ssize_t position
    cdef readonly uint64_t base_offset
    cdef readonly uint32_t length
    cdef readonly uint32_t crc
    cdef readonly uint32_t record_count
    cdef readonly uint64_t base_timestamp
    cdef readonly uint64_t max_timestamp
    cdef readonly uint64_t producer_id
    cdef readonly str producer_name
    cdef readonly str broker_addr
    cdef readonly str compression
    cdef readonly uint32_t raw_size
    cdef readonly uint64_t session  # a sequenced batch's producer session and sequence; 0 and 0 otherwise
    cdef readonly uint64_t sequence

    @property
    def last_offset(self):
        return self.base_offset + self.record_count - 1

    @property
    def end(self):
        return self.position + self.length

    def __repr__(self):
        return (f"BatchHeader(position={self.position}, base_offset={self.base_offset}, "
                f"length={self.length}, record_count={self.record_count}, producer_id={self.producer_id}, "
                f"producer_name={self.producer_name!r}, compression={self.compression!r})")


cdef str _utf8(const unsigned char* p, Py_ssize_t n, Py_ssize_t position, str what):
    if not utf8_valid(p, n):
        raise FrameCorrupt(f"{what} is not valid UTF-8", position)
    return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)


cdef BatchHeader _make_header(const unsigned char* buf, BatchInfo* h):
    cdef BatchHeader out = BatchHeader.__new__(BatchHeader)
    cdef const unsigned char* names = buf + h.position + HEADER_BYTES
    out.position = h.position
    out.base_offset = h.base_offset
    out.length = h.length
    out.crc = h.crc
    out.record_count = h.count
    out.base_timestamp = h.base_ts
    out.max_timestamp = h.max_ts
    out.producer_id = h.producer_id
    out.producer_name = _utf8(names, h.name_len, h.position, "producer name")
    out.broker_addr = _utf8(names + h.name_len, h.addr_len, h.position, "broker address")
    out.compression = COMPRESSIONS[h.codec]
    out.raw_size = h.raw_size
    out.session = h.session
    out.sequence = h.sequence
    return out


# ---------------------------------------------------------------------------------------------------------
# Validation

cdef struct Totals:
    Py_ssize_t records
    Py_ssize_t payload_bytes
    Py_ssize_t key_bytes
    Py_ssize_t producer_bytes
    Py_ssize_t attr_entries
    Py_ssize_t attr_key_bytes
    Py_ssize_t attr_value_bytes


cdef inline Py_ssize_t _head(BatchInfo* h) noexcept nogil:
    """Bytes of the header, names and sequence: where the (stored) records start."""
    return HEADER_BYTES + h.name_len + h.addr_len + h.seq_len


cdef int _check_header(const unsigned char* buf, Py_ssize_t size, Py_ssize_t pos,
                       BatchInfo* h) except -1 nogil:
    cdef Py_ssize_t remaining = size - pos
    cdef const unsigned char* p = buf + pos
    cdef uint16_t flags
    if remaining < HEADER_BYTES:
        with gil:
            raise FrameCorrupt(f"batch is torn: needs a {HEADER_BYTES}-byte header, buffer has {remaining}", pos)
    if p[OFF_MAGIC] != BATCH_MAGIC:
        with gil:
            raise FrameCorrupt(f"bad magic 0x{p[OFF_MAGIC]:02x}, expected 0x{BATCH_MAGIC:02x}", pos)
    if p[OFF_VERSION] != BATCH_VERSION:
        with gil:
            raise FrameCorrupt(f"unsupported version {p[OFF_VERSION]}, expected {BATCH_VERSION}", pos)
    flags = load_u16(p + OFF_FLAGS)
    if flags & ~(CODEC_MASK | FLAG_SEQUENCED):
        with gil:
            raise FrameCorrupt(f"batch flags 0x{flags:04x} set bits other than the codec's and sequenced", pos)
    if (flags & CODEC_MASK) > CODEC_LAST:
        with gil:
            raise FrameCorrupt(f"unknown compression codec {flags & CODEC_MASK}", pos)
    h.position = pos
    h.base_offset = load_u64(p + OFF_BASE_OFFSET)
    h.crc = load_u32(p + OFF_CRC)
    h.length = load_u32(p + OFF_LENGTH)
    h.count = load_u32(p + OFF_COUNT)
    h.base_ts = load_u64(p + OFF_BASE_TS)
    h.max_ts = load_u64(p + OFF_MAX_TS)
    h.producer_id = load_u64(p + OFF_PRODUCER_ID)
    h.name_len = load_u16(p + OFF_NAME_LEN)
    h.addr_len = load_u16(p + OFF_ADDR_LEN)
    h.codec = <uint8_t>(flags & CODEC_MASK)
    h.raw_size = load_u32(p + OFF_RAW_SIZE)
    h.seq_len = SEQ_BYTES if flags & FLAG_SEQUENCED else 0
    h.session = h.sequence = 0
    if h.codec == CODEC_NONE and h.raw_size != 0:
        with gil:
            raise FrameCorrupt(f"raw_size is {h.raw_size} in an uncompressed batch, must be 0", pos)
    if h.codec != CODEC_NONE and h.raw_size == 0:
        with gil:
            raise FrameCorrupt("raw_size is 0 in a compressed batch", pos)
    if h.length > MAX_BATCH:
        with gil:
            raise FrameCorrupt(f"batch_length {h.length} exceeds the {MAX_BATCH}-byte limit", pos)
    if <Py_ssize_t>h.length < _head(h):
        with gil:
            raise FrameCorrupt(f"batch_length {h.length} is shorter than its header, names and sequence", pos)
    if _head(h) + <Py_ssize_t>h.raw_size > MAX_BATCH:
        with gil:
            raise FrameCorrupt(f"raw_size {h.raw_size} would make the batch exceed the {MAX_BATCH}-byte limit", pos)
    if h.length > remaining:
        with gil:
            raise FrameCorrupt(f"batch is torn: needs {h.length} bytes, buffer has {remaining}", pos)
    if h.count == 0:
        with gil:
            raise FrameCorrupt("record_count is 0", pos)
    if not utf8_valid(p + HEADER_BYTES, h.name_len):
        with gil:
            raise FrameCorrupt("producer name is not valid UTF-8", pos)
    if not utf8_valid(p + HEADER_BYTES + h.name_len, h.addr_len):
        with gil:
            raise FrameCorrupt("broker address is not valid UTF-8", pos)
    if h.seq_len:
        h.session = load_u64(p + HEADER_BYTES + h.name_len + h.addr_len)
        h.sequence = load_u64(p + HEADER_BYTES + h.name_len + h.addr_len + 8)
        if h.session == 0 or h.sequence == 0:
            with gil:
                raise FrameCorrupt("a sequenced batch has session or sequence 0", pos)
    return 0


cdef int _check_crc(const unsigned char* buf, BatchInfo* h) except -1:
    cdef uint32_t computed
    with nogil:
        computed = crc32c_update(0, buf + h.position + CRC_FROM, h.length - CRC_FROM)
    if computed != h.crc:
        raise FrameCorrupt(f"CRC mismatch: stored 0x{h.crc:08x}, computed 0x{computed:08x}", h.position)
    return 0


cdef int _walk_records(const unsigned char* q, const unsigned char* end, BatchInfo* h,
                       Totals* t) except -1 nogil:
    """Check that the records [q, end) of batch `h` tile it exactly and that every text field is UTF-8."""
    cdef const unsigned char* r
    cdef const unsigned char* rend
    cdef uint32_t i, rlen, vlen
    cdef uint16_t klen, nattrs, j
    cdef uint8_t flags
    for i in range(h.count):
        if end - q < 4:
            with gil:
                raise FrameCorrupt(f"record {i} overruns the batch end", h.position)
        rlen = load_u32(q)
        q += 4
        if rlen > <size_t>(end - q) or rlen < REC_FIXED - 4:
            with gil:
                raise FrameCorrupt(f"record {i} has length {rlen}, which does not fit the batch", h.position)
        rend = q + rlen
        flags = q[0]
        if flags & ~F_KNOWN:
            with gil:
                raise FrameCorrupt(f"record {i} sets unknown flag bits 0x{flags:02x}", h.position)
        r = q + (REC_FIXED - 4)
        if flags & F_REQUEST_ID:
            r += 8
        if flags & F_SCHEMA_ID:
            r += 8
        if flags & F_SCHEMA_VERSION:
            r += 4
        if r > rend:
            with gil:
                raise FrameCorrupt(f"record {i} overruns the batch end", h.position)
        if flags & F_ROUTING_KEY:
            if rend - r < 2:
                with gil:
                    raise FrameCorrupt(f"record {i} overruns the batch end", h.position)
            klen = load_u16(r)
            r += 2
            if klen > rend - r:
                with gil:
                    raise FrameCorrupt(f"routing key of record {i} overruns the record", h.position)
            if not utf8_valid(r, klen):
                with gil:
                    raise FrameCorrupt(f"routing key of record {i} is not valid UTF-8", h.position)
            if t != NULL:
                t.key_bytes += klen
            r += klen
        if flags & F_ATTRIBUTES:
            if rend - r < 2:
                with gil:
                    raise FrameCorrupt(f"record {i} overruns the batch end", h.position)
            nattrs = load_u16(r)
            r += 2
            for j in range(nattrs):
                if rend - r < 2:
                    with gil:
                        raise FrameCorrupt(f"attributes of record {i} overrun the record", h.position)
                klen = load_u16(r)
                r += 2
                if klen > rend - r or not utf8_valid(r, klen):
                    with gil:
                        raise FrameCorrupt(f"attribute key of record {i} is torn or not UTF-8", h.position)
                r += klen
                if rend - r < 4:
                    with gil:
                        raise FrameCorrupt(f"attributes of record {i} overrun the record", h.position)
                vlen = load_u32(r)
                r += 4
                if vlen > <size_t>(rend - r) or not utf8_valid(r, vlen):
                    with gil:
                        raise FrameCorrupt(f"attribute value of record {i} is torn or not UTF-8", h.position)
                r += vlen
                if t != NULL:
                    t.attr_key_bytes += klen
                    t.attr_value_bytes += vlen
            if t != NULL:
                t.attr_entries += nattrs
        if t != NULL:
            t.payload_bytes += rend - r
        q = rend
    if q != end:
        with gil:
            raise FrameCorrupt(f"records end {end - q} bytes before the batch does", h.position)
    if t != NULL:
        t.records += h.count
        t.producer_bytes += <Py_ssize_t>h.name_len * h.count
    return 0


cdef int check_batch(const unsigned char* buf, Py_ssize_t size, Py_ssize_t pos, BatchInfo* info,
                     bint verify_crc) except -1:
    _check_header(buf, size, pos, info)
    if verify_crc:
        _check_crc(buf, info)
    if info.codec == CODEC_NONE:
        _walk_records(buf + pos + _head(info), buf + pos + info.length, info, NULL)
    else:
        _inflate(buf, info)   # decompresses and walks the records
    return 0


# ---------------------------------------------------------------------------------------------------------
# Compression (docs/FORMAT.md#compression)

# zstd contexts are reused (creating one per call costs more than compressing a small batch); the pools are
# touched with the GIL held only, and a context is used by one thread at a time.
cdef enum:
    ZSTD_CONTEXTS_KEPT = 16
    CCTX = 0   # compression contexts
    DCTX = 1   # decompression contexts
    MIN_SAVING = 8   # keep a batch compressed only when that saves at least 1/8 of its records' bytes
cdef void* _pool[2][ZSTD_CONTEXTS_KEPT]
cdef int _pooled[2]
_pooled[CCTX] = _pooled[DCTX] = 0


cdef void* _take_ctx(int kind) except NULL:
    if _pooled[kind] > 0:
        _pooled[kind] -= 1
        return _pool[kind][_pooled[kind]]
    cdef void* ctx = <void*>ZSTD_createCCtx() if kind == CCTX else <void*>ZSTD_createDCtx()
    if ctx == NULL:
        raise MemoryError()
    return ctx


cdef void _give_ctx(int kind, void* ctx) noexcept:
    if _pooled[kind] < ZSTD_CONTEXTS_KEPT:
        _pool[kind][_pooled[kind]] = ctx
        _pooled[kind] += 1
    elif kind == CCTX:
        ZSTD_freeCCtx(<ZSTD_CCtx*>ctx)
    else:
        ZSTD_freeDCtx(<ZSTD_DCtx*>ctx)


cdef int _codec_of(object compression) except -1:
    if compression is None:
        return CODEC_NONE
    try:
        return COMPRESSIONS.index(compression)
    except ValueError:
        raise ValueError(f"unknown compression {compression!r}, expected one of {', '.join(COMPRESSIONS)}") \
            from None


cdef int _decompress(const unsigned char* src, size_t n, unsigned char* dst, BatchInfo* h) except -1:
    """The stored records of batch `h` into `dst` (h.raw_size bytes)."""
    cdef size_t got = 0
    cdef int lz4_got = -1
    cdef bint ok
    cdef ZSTD_DCtx* ctx
    cdef bint nogil_io = h.raw_size >= NOGIL_MIN_BYTES
    if h.codec == CODEC_ZSTD:
        ctx = <ZSTD_DCtx*>_take_ctx(DCTX)
        if nogil_io:
            with nogil:
                got = ZSTD_decompressDCtx(ctx, dst, h.raw_size, src, n)
        else:
            got = ZSTD_decompressDCtx(ctx, dst, h.raw_size, src, n)
        _give_ctx(DCTX, ctx)
        ok = not ZSTD_isError(got) and got == h.raw_size
    else:
        if nogil_io:
            with nogil:
                lz4_got = LZ4_decompress_safe(<const char*>src, <char*>dst, <int>n, <int>h.raw_size)
        else:
            lz4_got = LZ4_decompress_safe(<const char*>src, <char*>dst, <int>n, <int>h.raw_size)
        ok = lz4_got == <int>h.raw_size
    if not ok:
        raise FrameCorrupt(f"{COMPRESSIONS[h.codec]} records do not decompress to the {h.raw_size} bytes "
                           f"raw_size gives", h.position)
    return 0


cdef Py_ssize_t _inflate_into(const unsigned char* buf, BatchInfo* h, unsigned char* dst) except -1:
    """Write the compressed batch `h` into `dst` as the uncompressed batch it stands for, its records checked;
    returns the bytes written. Errors name the compressed batch's position. The copy's CRC is left as it was:
    expanded batches never leave this module, and nothing verifies them again."""
    cdef const unsigned char* p = buf + h.position
    cdef Py_ssize_t head = _head(h), total = head + h.raw_size
    memcpy(dst, p, head)
    _decompress(p + head, h.length - head, dst + head, h)
    _walk_records(dst + head, dst + total, h, NULL)
    store_u16(dst + OFF_FLAGS, load_u16(p + OFF_FLAGS) & ~CODEC_MASK)
    store_u32(dst + OFF_RAW_SIZE, 0)
    store_u32(dst + OFF_LENGTH, <uint32_t>total)
    return total


cdef object _inflate(const unsigned char* buf, BatchInfo* h):
    """The compressed batch `h` expanded (see _inflate_into), as bytes."""
    out = PyBytes_FromStringAndSize(NULL, _head(h) + h.raw_size)
    _inflate_into(buf, h, <unsigned char*>PyBytes_AS_STRING(out))
    return out


cdef object _expand_all(const unsigned char* buf, Py_ssize_t size, bint verify):
    """None when no batch of `buf` is compressed; else a copy with every compressed batch expanded, every
    batch checked (CRC if `verify`, records always) in order, errors naming positions in `buf`."""
    cdef BatchInfo h
    cdef Py_ssize_t pos = 0, total = 0, at = 0
    cdef bint compressed = False
    try:
        while pos < size:   # headers only: the common buffer has no compressed batch
            _check_header(buf, size, pos, &h)
            compressed |= h.codec != CODEC_NONE
            total += _head(&h) + h.raw_size if h.codec != CODEC_NONE else h.length
            pos += h.length
    except FrameCorrupt:
        if not compressed:
            return None   # the decoder reports it, in order
        total = -1   # a bad header after a compressed batch: expand batch by batch up to it
    if not compressed:
        return None
    parts = [] if total < 0 else None
    out = PyBytes_FromStringAndSize(NULL, max(total, 0))
    cdef unsigned char* dst = <unsigned char*>PyBytes_AS_STRING(out)
    pos = 0
    while pos < size:
        _check_header(buf, size, pos, &h)
        if verify:
            _check_crc(buf, &h)
        if h.codec == CODEC_NONE:
            _walk_records(buf + pos + _head(&h), buf + pos + h.length, &h, NULL)
            if parts is None:
                memcpy(dst + at, buf + pos, h.length)
                at += h.length
            else:
                parts.append(PyBytes_FromStringAndSize(<const char*>buf + pos, h.length))
        elif parts is None:
            at += _inflate_into(buf, &h, dst + at)
        else:
            parts.append(_inflate(buf, &h))
        pos += h.length
    return out if parts is None else b"".join(parts)


cdef object _compress(object batch, int codec, int level):
    """`batch` (one sealed, uncompressed batch) with its records compressed, or `batch` itself when that
    saves less than 1/MIN_SAVING of their bytes (not worth a decompression in every reader)."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(batch)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(batch)
    cdef Py_ssize_t head = HEADER_BYTES + load_u16(p + OFF_NAME_LEN) + load_u16(p + OFF_ADDR_LEN) + \
        (SEQ_BYTES if load_u16(p + OFF_FLAGS) & FLAG_SEQUENCED else 0)
    cdef Py_ssize_t raw = n - head, bound, got = 0
    cdef size_t zgot = 0
    cdef ZSTD_CCtx* ctx = NULL
    cdef unsigned char* scratch
    cdef bint nogil_io = raw >= NOGIL_MIN_BYTES
    if codec == CODEC_ZSTD:
        bound = ZSTD_compressBound(raw)
    else:
        bound = LZ4_compressBound(<int>raw)
    scratch = <unsigned char*>malloc(head + bound)
    if scratch == NULL:
        raise MemoryError()
    try:
        if codec == CODEC_ZSTD:
            ctx = <ZSTD_CCtx*>_take_ctx(CCTX)
            if nogil_io:
                with nogil:
                    zgot = ZSTD_compressCCtx(ctx, scratch + head, bound, p + head, raw, level)
            else:
                zgot = ZSTD_compressCCtx(ctx, scratch + head, bound, p + head, raw, level)
            _give_ctx(CCTX, ctx)
            if ZSTD_isError(zgot):
                raise ValueError(f"zstd compression failed: {ZSTD_getErrorName(zgot).decode()}")
            got = <Py_ssize_t>zgot
        else:
            if nogil_io:
                with nogil:
                    got = LZ4_compress_default(<const char*>p + head, <char*>scratch + head, <int>raw,
                                               <int>bound)
            else:
                got = LZ4_compress_default(<const char*>p + head, <char*>scratch + head, <int>raw, <int>bound)
            if got <= 0:
                raise ValueError("lz4 compression failed")
        if got > raw - raw // MIN_SAVING:
            return batch
        memcpy(scratch, p, head)
        store_u16(scratch + OFF_FLAGS, <uint16_t>(codec | (load_u16(p + OFF_FLAGS) & FLAG_SEQUENCED)))
        store_u32(scratch + OFF_RAW_SIZE, <uint32_t>raw)
        store_u32(scratch + OFF_LENGTH, <uint32_t>(head + got))
        out = PyBytes_FromStringAndSize(<const char*>scratch, head + got)
        _seal(out)
        return out
    finally:
        free(scratch)


cdef object _maybe_compress(object batch, object compression, object level):
    cdef int codec = _codec_of(compression)
    cdef int lvl = 0
    if codec == CODEC_NONE:
        return batch
    if level is not None:
        lvl = level
        if codec == CODEC_ZSTD and not ZSTD_minCLevel() <= lvl <= ZSTD_maxCLevel():
            raise ValueError(f"zstd level {lvl} is outside {ZSTD_minCLevel()}..{ZSTD_maxCLevel()}")
    elif codec == CODEC_ZSTD:
        lvl = ZSTD_CLEVEL_DEFAULT
    return _compress(batch, codec, lvl)


cdef int _check_all(const unsigned char* buf, Py_ssize_t size, Totals* t) except -1 nogil:
    """Structure and records (not CRCs) of every batch of an uncompressed buffer, sizes summed into `t`."""
    cdef BatchInfo h
    cdef Py_ssize_t pos = 0
    while pos < size:
        _check_header(buf, size, pos, &h)
        if h.codec != CODEC_NONE:   # decode_arrow expands compressed batches before calling this
            with gil:
                raise FrameCorrupt("compressed batch where an expanded buffer was expected", pos)
        _walk_records(buf + pos + _head(&h), buf + pos + h.length, &h, t)
        pos += h.length
    return 0


# ---------------------------------------------------------------------------------------------------------
# Buffers with room in front: a message's framing written before its data in place of a copy behind it
# (fast_wire.py). grpc sends only `bytes`, and copies them itself, so a response whose framing is joined to
# 1 MiB of batches costs a second copy on the event loop; a buffer made with free bytes in front of its data
# (a WAL read, `join_after_room`) gets the framing written into them instead (docs/ARCHITECTURE.md, "Consume
# without a framing copy").

def join_after_room(chunks, Py_ssize_t room):
    """The chunks copied one after another into a new bytes object, after `room` zero bytes: a view of the
    copies (its `.obj` the whole object), for `fill_room`."""
    cdef list items = chunks if type(chunks) is list else list(chunks)
    cdef Py_ssize_t total = 0, at
    cdef _Input inp
    if room < 0:
        raise ValueError(f"room must be >= 0, not {room}")
    inputs = [_Input(c) for c in items]
    for inp in inputs:
        total += inp.size
    out = PyBytes_FromStringAndSize(NULL, room + total)
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(out)
    memset(p, 0, room)
    at = room
    for inp in inputs:
        memcpy(p + at, inp.ptr, inp.size)
        at += inp.size
    return memoryview(out)[room:]


def fill_room(data, head):
    """The bytes object `data` is a view of, with `head` written into its first len(head) bytes, when `data`
    covers exactly the rest of it (the room in front of the data was left for this); else None and nothing
    written. The room is written, never the data: whoever made the object left it for its framing, and no view
    handed out covers it."""
    cdef _Input inp
    cdef _Input h = _Input(head)
    if type(data) is not memoryview:
        return None
    obj = (<object>data).obj
    if not PyBytes_CheckExact(obj) or not (<object>data).c_contiguous:
        return None
    inp = _Input(data)
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(obj)
    if inp.size == 0 or inp.ptr != p + h.size or h.size + inp.size != PyBytes_GET_SIZE(obj):
        return None
    memcpy(p, h.ptr, h.size)
    return obj


# ---------------------------------------------------------------------------------------------------------
# Public API: checksums, headers, stamping

cdef int _check_position(Py_ssize_t position, Py_ssize_t size) except -1:
    if position < 0 or position > size:
        raise ValueError(f"position {position} is outside the buffer of {size} bytes")
    return 0


def crc32c(data, value=0):
    """CRC32C of `data`, continuing from `value` (the CRC of what came before)."""
    cdef _Input inp = _Input(data)
    cdef uint32_t v = _u32(value, "value")
    with nogil:
        v = crc32c_update(v, inp.ptr, inp.size)
    return v


def parse_header(buf, Py_ssize_t position=0):
    """The header of the batch at `position`: structure checked, CRC not."""
    cdef _Input inp = _Input(buf)
    cdef BatchInfo h
    _check_position(position, inp.size)
    _check_header(inp.ptr, inp.size, position, &h)
    return _make_header(inp.ptr, &h)


def verify_batch(buf, Py_ssize_t position=0):
    """The header of the batch at `position` after checking its structure, CRC and records."""
    cdef _Input inp = _Input(buf)
    cdef BatchInfo h
    _check_position(position, inp.size)
    check_batch(inp.ptr, inp.size, position, &h, True)
    return _make_header(inp.ptr, &h)


def scan_batches(buf, bint verify=True):
    """Headers of all back-to-back batches in `buf`: fully verified (CRC, records), or with `verify`
    False only each header's structure."""
    cdef _Input inp = _Input(buf)
    cdef BatchInfo h
    cdef Py_ssize_t pos = 0
    out = []
    while pos < inp.size:
        if verify:
            check_batch(inp.ptr, inp.size, pos, &h, True)
        else:
            _check_header(inp.ptr, inp.size, pos, &h)
        out.append(_make_header(inp.ptr, &h))
        pos += h.length
    return out


def span(buf):
    """(first offset, next offset) of a buffer of back-to-back batches, from the headers alone (structure
    of each header checked, records and CRCs not: for buffers this process wrote or already verified)."""
    cdef _Input inp = _Input(buf)
    cdef BatchInfo h
    cdef Py_ssize_t pos = 0
    cdef uint64_t first = 0, nxt = 0
    if inp.size == 0:
        raise FrameCorrupt("empty buffer has no offsets", 0)
    while pos < inp.size:
        _check_header(inp.ptr, inp.size, pos, &h)
        if pos == 0:
            first = h.base_offset
        nxt = h.base_offset + h.count
        pos += h.length
    return (first, nxt)


def stamp_base_offset(buf, base_offset, Py_ssize_t position=0):
    """Write `base_offset` into the batch at `position` of a writable buffer (the CRC does not cover it)."""
    cdef _Input inp = _Input(buf, True)
    cdef uint64_t off = _u64(base_offset, "base_offset")
    cdef unsigned char* p
    _check_position(position, inp.size)
    if inp.size - position < HEADER_BYTES:
        raise FrameCorrupt(f"no batch header at byte {position} of a {inp.size}-byte buffer", position)
    p = <unsigned char*>inp.ptr + position
    if p[OFF_MAGIC] != BATCH_MAGIC or p[OFF_VERSION] != BATCH_VERSION:
        raise FrameCorrupt(f"bad magic or version at byte {position}", position)
    store_u64(p + OFF_BASE_OFFSET, off)


# ---------------------------------------------------------------------------------------------------------
# Encoding

cdef inline uint64_t _u64(object v, str field) except? 0xFFFFFFFFFFFFFFFF:
    if not isinstance(v, int):
        raise TypeError(f"{field} must be an int, not {type(v).__name__}")
    try:
        return v
    except OverflowError:
        raise ValueError(f"{field} {v!r} does not fit in an unsigned 64-bit field") from None


cdef inline uint32_t _u32(object v, str field) except? 0xFFFFFFFF:
    if not isinstance(v, int):
        raise TypeError(f"{field} must be an int, not {type(v).__name__}")
    try:
        return v
    except OverflowError:
        raise ValueError(f"{field} {v!r} does not fit in an unsigned 32-bit field") from None


cdef const char* _text(object s, Py_ssize_t* n, Py_ssize_t limit, str field) except NULL:
    if not isinstance(s, str):
        raise TypeError(f"{field} must be a str, not {type(s).__name__}")
    cdef const char* p = PyUnicode_AsUTF8AndSize(s, n)
    if n[0] > limit:
        raise ValueError(f"{field} is {n[0]} UTF-8 bytes, more than the {limit} allowed")
    return p


cdef Py_ssize_t _payload_size(object payload) except -1:
    cdef Py_buffer view
    if PyBytes_CheckExact(payload):
        return PyBytes_GET_SIZE(payload)
    if not isinstance(payload, (bytearray, memoryview)):
        raise TypeError(f"payload must be bytes, bytearray or memoryview, not {type(payload).__name__}")
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    n = view.len
    PyBuffer_Release(&view)
    return n


cdef unsigned char* _put_payload(unsigned char* q, object payload):
    cdef Py_buffer view
    if PyBytes_CheckExact(payload):
        memcpy(q, PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload))
        return q + PyBytes_GET_SIZE(payload)
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    memcpy(q, view.buf, view.len)
    q += view.len
    PyBuffer_Release(&view)
    return q


cdef Py_ssize_t _attributes_size(object attrs) except -1:
    cdef Py_ssize_t pos = 0, n, total = 2
    cdef PyObject* k
    cdef PyObject* v
    if len(attrs) > 0xFFFF:
        raise ValueError(f"{len(attrs)} attributes, more than the 65535 allowed")
    while PyDict_Next(attrs, &pos, &k, &v):
        _text(<object>k, &n, 0xFFFF, "attribute key")
        total += 2 + n
        _text(<object>v, &n, 0xFFFFFFFF, "attribute value")
        total += 4 + n
    return total


cdef unsigned char* _put_attributes(unsigned char* q, object attrs):
    cdef Py_ssize_t pos = 0, n
    cdef PyObject* k
    cdef PyObject* v
    cdef const char* s
    store_u16(q, <uint16_t>len(attrs))
    q += 2
    while PyDict_Next(attrs, &pos, &k, &v):
        s = PyUnicode_AsUTF8AndSize(<object>k, &n)
        store_u16(q, <uint16_t>n)
        memcpy(q + 2, s, n)
        q += 2 + n
        s = PyUnicode_AsUTF8AndSize(<object>v, &n)
        store_u32(q, <uint32_t>n)
        memcpy(q + 4, s, n)
        q += 4 + n
    return q


cdef Py_ssize_t _record_size(Record rec) except -1:
    """Encoded size of `rec` (length field included); checks every field's type and range."""
    cdef Py_ssize_t n, size = REC_FIXED + _payload_size(rec.payload)
    if _u64(rec.request_id, "request_id") != 0:
        size += 8
    if rec.schema_id is not None:
        _u64(rec.schema_id, "schema_id")
        size += 8
    if rec.schema_version is not None:
        _u32(rec.schema_version, "schema_version")
        size += 4
    if rec.routing_key is not None:
        _text(rec.routing_key, &n, 0xFFFF, "routing_key")
        size += 2 + n
    if rec.attributes is not None:
        if not isinstance(rec.attributes, dict):
            raise TypeError(f"attributes must be a dict, not {type(rec.attributes).__name__}")
        if rec.attributes:
            size += _attributes_size(rec.attributes)
    if size - 4 > 0xFFFFFFFF:
        raise ValueError("record is larger than 4 GiB")
    return size


cdef unsigned char* _put_record(unsigned char* q, Record rec, uint32_t ts_delta) except NULL:
    cdef unsigned char* start = q
    cdef uint8_t flags = 0
    cdef uint64_t request_id = _u64(rec.request_id, "request_id")
    cdef Py_ssize_t n
    cdef const char* s
    q += REC_FIXED
    if request_id != 0:
        flags |= F_REQUEST_ID
        store_u64(q, request_id)
        q += 8
    if rec.schema_id is not None:
        flags |= F_SCHEMA_ID
        store_u64(q, _u64(rec.schema_id, "schema_id"))
        q += 8
    if rec.schema_version is not None:
        flags |= F_SCHEMA_VERSION
        store_u32(q, _u32(rec.schema_version, "schema_version"))
        q += 4
    if rec.routing_key is not None:
        flags |= F_ROUTING_KEY
        s = PyUnicode_AsUTF8AndSize(rec.routing_key, &n)
        store_u16(q, <uint16_t>n)
        memcpy(q + 2, s, n)
        q += 2 + n
    if rec.attributes:
        flags |= F_ATTRIBUTES
        q = _put_attributes(q, rec.attributes)
    q = _put_payload(q, rec.payload)
    store_u32(start + REC_LENGTH, <uint32_t>(q - start - 4))
    start[REC_FLAGS] = flags
    store_u32(start + REC_TS_DELTA, ts_delta)
    return q


cdef object _new_batch(Py_ssize_t body, uint32_t count, uint64_t base_ts, uint64_t max_ts, object producer_id,
                       object producer_name, object broker_addr, object base_offset, object session,
                       object sequence, unsigned char** cursor, Py_ssize_t room=0):
    """Allocate a batch of `body` record bytes with its header filled except the CRC, after `room` zero bytes
    of the same object (see fill_room); sequenced when `session` is not 0."""
    cdef Py_ssize_t name_len, addr_len
    cdef const char* name = _text(producer_name, &name_len, 0xFFFF, "producer_name")
    cdef const char* addr = _text(broker_addr, &addr_len, 0xFFFF, "broker_addr")
    cdef uint64_t pid = _u64(producer_id, "producer_id")
    cdef uint64_t boff = _u64(base_offset, "base_offset")
    cdef uint64_t sess = _u64(session, "session")
    cdef uint64_t seq = _u64(sequence, "sequence")
    cdef Py_ssize_t seq_len = SEQ_BYTES if sess else 0
    if (sess == 0) != (seq == 0):
        raise ValueError("session and sequence go together: both 0 (not sequenced) or both set")
    cdef Py_ssize_t total = HEADER_BYTES + name_len + addr_len + seq_len + body
    if total > MAX_BATCH:
        raise ValueError(f"batch would be {total} bytes, more than the {MAX_BATCH} allowed")
    if max_ts - base_ts > 0xFFFFFFFF:
        raise ValueError("publish times in one batch span more than 2**32-1 ms")
    out = PyBytes_FromStringAndSize(NULL, room + total)
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(out)
    memset(p, 0, room)
    p += room
    store_u64(p + OFF_BASE_OFFSET, boff)
    store_u32(p + OFF_LENGTH, <uint32_t>total)
    p[OFF_MAGIC] = BATCH_MAGIC
    p[OFF_VERSION] = BATCH_VERSION
    store_u16(p + OFF_FLAGS, FLAG_SEQUENCED if seq_len else 0)
    store_u32(p + OFF_COUNT, count)
    store_u64(p + OFF_BASE_TS, base_ts)
    store_u64(p + OFF_MAX_TS, max_ts)
    store_u64(p + OFF_PRODUCER_ID, pid)
    store_u16(p + OFF_NAME_LEN, <uint16_t>name_len)
    store_u16(p + OFF_ADDR_LEN, <uint16_t>addr_len)
    store_u32(p + OFF_RAW_SIZE, 0)
    memcpy(p + HEADER_BYTES, name, name_len)
    memcpy(p + HEADER_BYTES + name_len, addr, addr_len)
    if seq_len:
        store_u64(p + HEADER_BYTES + name_len + addr_len, sess)
        store_u64(p + HEADER_BYTES + name_len + addr_len + 8, seq)
    cursor[0] = p + HEADER_BYTES + name_len + addr_len + seq_len
    return out


cdef void _seal(object batch, Py_ssize_t room=0) noexcept:
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(batch) + room
    cdef Py_ssize_t n = PyBytes_GET_SIZE(batch) - room
    with nogil:
        store_u32(p + OFF_CRC, crc32c_update(0, p + CRC_FROM, n - CRC_FROM))


def encode_batch(records, *, producer_id=0, producer_name="", broker_addr="", base_offset=0,
                 compression="none", level=None, session=0, sequence=0):
    """Encode a sequence of Records into one batch (bytes), its records compressed with `compression`
    ("none", "zstd" or "lz4"; `level` for zstd, its default 3) unless that saves less than 1/8 of them;
    sequenced (docs/FORMAT.md#sequenced-batches) when `session` and `sequence` are given."""
    cdef list recs = records if type(records) is list else list(records)
    cdef Py_ssize_t n = len(recs), i, body = 0
    cdef uint64_t ts, base_ts = U64_MAX, max_ts = 0
    cdef uint64_t* stamps
    cdef unsigned char* q
    cdef Record rec
    if n == 0:
        raise ValueError("a batch needs at least one record")
    if n > 0xFFFFFFFF:
        raise ValueError("too many records for one batch")
    stamps = <uint64_t*>malloc(n * sizeof(uint64_t))
    if stamps == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            item = recs[i]
            if type(item) is not Record:
                raise TypeError(f"records must be Record objects, not {type(item).__name__}")
            rec = <Record>item
            ts = _u64(rec.publish_time, "publish_time")
            stamps[i] = ts
            if ts < base_ts:
                base_ts = ts
            if ts > max_ts:
                max_ts = ts
            body += _record_size(rec)
        out = _new_batch(body, <uint32_t>n, base_ts, max_ts, producer_id, producer_name, broker_addr,
                         base_offset, session, sequence, &q)
        for i in range(n):
            q = _put_record(q, <Record>recs[i], <uint32_t>(stamps[i] - base_ts))
    finally:
        free(stamps)
    _seal(out)
    return _maybe_compress(out, compression, level)


def encode_payloads(payloads, *, publish_time=0, producer_id=0, producer_name="", broker_addr="",
                    base_offset=0, compression="none", level=None, session=0, sequence=0, Py_ssize_t room=0):
    """One batch of payload-only records with one publish time: the fast path for bulk producers
    (`compression`, `level`, `session` and `sequence` as in encode_batch). With `room`, an uncompressed
    batch comes as a view of a bytes object that has `room` zero bytes in front of it, where a request's
    framing can be written (fill_room); a compressed one as bytes."""
    cdef list items = payloads if type(payloads) is list else list(payloads)
    cdef Py_ssize_t n = len(items), i, body = 0
    cdef uint64_t ts = _u64(publish_time, "publish_time")
    cdef unsigned char* q
    cdef unsigned char* start
    if n == 0:
        raise ValueError("a batch needs at least one record")
    if room < 0:
        raise ValueError(f"room must be >= 0, not {room}")
    if _codec_of(compression) != CODEC_NONE:
        room = 0  # the compressed batch is a new object
    for i in range(n):
        body += REC_FIXED + _payload_size(items[i])
    out = _new_batch(body, <uint32_t>n, ts, ts, producer_id, producer_name, broker_addr, base_offset, session,
                     sequence, &q, room)
    for i in range(n):
        start = q
        q = _put_payload(q + REC_FIXED, items[i])
        store_u32(start + REC_LENGTH, <uint32_t>(q - start - 4))
        start[REC_FLAGS] = 0
        store_u32(start + REC_TS_DELTA, 0)
    _seal(out, room)
    if room:
        return memoryview(out)[room:]
    return _maybe_compress(out, compression, level)


# ---------------------------------------------------------------------------------------------------------
# Decoding to Records

cdef Record _read_record(const unsigned char* q, uint64_t offset, uint64_t base_ts, Py_ssize_t position,
                         const unsigned char** next_record):
    cdef Record rec = Record.__new__(Record)
    cdef uint32_t rlen = load_u32(q)
    cdef const unsigned char* rend = q + 4 + rlen
    cdef uint8_t flags = q[REC_FLAGS]
    cdef const unsigned char* r = q + REC_FIXED
    cdef uint16_t klen, nattrs, j
    cdef uint32_t vlen
    rec.offset = offset
    rec.publish_time = base_ts + load_u32(q + REC_TS_DELTA)
    rec.request_id = 0
    if flags & F_REQUEST_ID:
        rec.request_id = load_u64(r)
        r += 8
    if flags & F_SCHEMA_ID:
        rec.schema_id = load_u64(r)
        r += 8
    if flags & F_SCHEMA_VERSION:
        rec.schema_version = load_u32(r)
        r += 4
    if flags & F_ROUTING_KEY:
        klen = load_u16(r)
        rec.routing_key = _utf8(r + 2, klen, position, "routing key")
        r += 2 + klen
    if flags & F_ATTRIBUTES:
        attrs = {}
        nattrs = load_u16(r)
        r += 2
        for j in range(nattrs):
            klen = load_u16(r)
            key = _utf8(r + 2, klen, position, "attribute key")
            r += 2 + klen
            vlen = load_u32(r)
            attrs[key] = _utf8(r + 4, vlen, position, "attribute value")
            r += 4 + vlen
        rec.attributes = attrs if attrs else None
    rec.payload = PyBytes_FromStringAndSize(<const char*>r, rend - r)
    next_record[0] = rend
    return rec


cdef list _batch_records(const unsigned char* q, BatchInfo* h):
    """The records of batch `h`, whose (uncompressed, checked) records start at `q`."""
    cdef uint32_t i
    out = []
    for i in range(h.count):
        out.append(_read_record(q, h.base_offset + i, h.base_ts, h.position, &q))
    return out


cdef list _checked_records(const unsigned char* buf, Py_ssize_t size, Py_ssize_t pos, BatchInfo* h,
                           bint verify):
    """The records of the batch at `pos`, checked as check_batch does and decompressed once if need be."""
    cdef const unsigned char* raw
    _check_header(buf, size, pos, h)
    if verify:
        _check_crc(buf, h)
    if h.codec == CODEC_NONE:
        _walk_records(buf + pos + _head(h), buf + pos + h.length, h, NULL)
        return _batch_records(buf + pos + _head(h), h)
    expanded = _inflate(buf, h)
    raw = <const unsigned char*>PyBytes_AS_STRING(expanded)
    return _batch_records(raw + _head(h), h)


def decode_records(buf, bint verify=True):
    """All records of all batches in `buf`, in order, offsets set."""
    cdef _Input inp = _Input(buf)
    cdef BatchInfo h
    cdef Py_ssize_t pos = 0
    out = []
    while pos < inp.size:
        out.extend(_checked_records(inp.ptr, inp.size, pos, &h, verify))
        pos += h.length
    return out


def iter_records(buf, bint verify=True):
    """Iterate the records of `buf` batch by batch; a corrupt batch raises when the iteration reaches it."""
    cdef _Input inp = _Input(buf)
    cdef BatchInfo h
    cdef Py_ssize_t pos = 0
    while pos < inp.size:
        yield from _checked_records(inp.ptr, inp.size, pos, &h, verify)
        pos += h.length


# ---------------------------------------------------------------------------------------------------------
# Decoding to Arrow: one validation pass that sizes every column, one pass that fills them.

cdef class _Columns:
    """Arrow buffers being filled; `ptr(name)` is valid while the pyarrow Buffer lives."""
    cdef dict buffers

    def __cinit__(self):
        self.buffers = {}

    cdef unsigned char* alloc(self, str name, Py_ssize_t size) except NULL:
        cdef Py_buffer view
        buf = _pyarrow().allocate_buffer(max(size, 1))
        self.buffers[name] = buf
        PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE)
        p = <unsigned char*>view.buf
        PyBuffer_Release(&view)   # pyarrow memory does not move; the Buffer object keeps it alive
        return p


cdef inline void _set_valid(unsigned char* bitmap, Py_ssize_t i) noexcept nogil:
    bitmap[i >> 3] |= <unsigned char>(1 << (i & 7))


cdef inline void _put_text(unsigned char* data, int32_t* offsets, Py_ssize_t i, const unsigned char* src,
                           Py_ssize_t n) noexcept nogil:
    memcpy(data + offsets[i], src, n)
    offsets[i + 1] = offsets[i] + <int32_t>n



def decode_arrow(buf, bint verify=True):
    """Decode a buffer of back-to-back batches into one pyarrow.RecordBatch (schema ARROW_SCHEMA)."""
    return decode_arrow_chunks((buf,), verify)


def decode_arrow_chunks(bufs, bint verify=True):
    """The batches of several buffers, one buffer after another, as one pyarrow.RecordBatch: its Arrow
    buffers are allocated and wrapped once for all of them, and every chunk is copied in under one release
    of the GIL (a table commit decodes a few hundred chunks of the log). A FrameCorrupt's position is within
    the buffer that holds the bad batch."""
    pa = _pyarrow()
    schema = arrow_schema()
    cdef list inputs = []
    cdef Totals t
    memset(&t, 0, sizeof(Totals))
    cdef _Input inp
    cdef bint plain_verify
    for buf in bufs:
        inp = _Input(buf)
        plain_verify = verify
        # Compressed batches are expanded (and checked) first; the passes below then see plain batches.
        expanded = _expand_all(inp.ptr, inp.size, verify)
        if expanded is not None:
            inp = _Input(expanded)
            plain_verify = False
        # Sizing walks only record headers; the CRC is checked batch by batch in _fill, right before the
        # batch is copied, so the payload bytes come from DRAM once (measured: 4.0 -> 5.x GiB/s,
        # bench/RESULTS.md). Without the GIL: a table commit walks a quarter of a million records here, and
        # the broker's event loop must not wait for it.
        with nogil:
            _check_all(inp.ptr, inp.size, &t)
        inputs.append((inp, plain_verify))
    if t.records == 0:
        return pa.RecordBatch.from_pylist([], schema=schema)
    for what, size in (("payload", t.payload_bytes), ("routing key", t.key_bytes),
                       ("producer name", t.producer_bytes), ("attribute key", t.attr_key_bytes),
                       ("attribute value", t.attr_value_bytes), ("attribute", t.attr_entries)):
        if size > 0x7FFFFFFF:
            raise ValueError(f"{what} bytes exceed 2 GiB; decode the buffer in smaller pieces")
    cdef Py_ssize_t n = t.records, bitmap = (n + 7) // 8
    cdef _Columns cols = _Columns()
    cdef int64_t* offsets = <int64_t*>cols.alloc("offset", n * 8)
    cdef int64_t* stamps = <int64_t*>cols.alloc("timestamp", n * 8)
    cdef unsigned char* key_valid = cols.alloc("key_valid", bitmap)
    cdef int32_t* key_offs = <int32_t*>cols.alloc("key_offs", (n + 1) * 4)
    cdef unsigned char* key_data = cols.alloc("key_data", t.key_bytes)
    cdef int32_t* val_offs = <int32_t*>cols.alloc("val_offs", (n + 1) * 4)
    cdef unsigned char* val_data = cols.alloc("val_data", t.payload_bytes)
    cdef int32_t* prod_offs = <int32_t*>cols.alloc("prod_offs", (n + 1) * 4)
    cdef unsigned char* prod_data = cols.alloc("prod_data", t.producer_bytes)
    cdef unsigned char* attr_valid = cols.alloc("attr_valid", bitmap)
    cdef int32_t* map_offs = <int32_t*>cols.alloc("map_offs", (n + 1) * 4)
    cdef int32_t* akey_offs = <int32_t*>cols.alloc("akey_offs", (t.attr_entries + 1) * 4)
    cdef unsigned char* akey_data = cols.alloc("akey_data", t.attr_key_bytes)
    cdef int32_t* aval_offs = <int32_t*>cols.alloc("aval_offs", (t.attr_entries + 1) * 4)
    cdef unsigned char* aval_data = cols.alloc("aval_data", t.attr_value_bytes)
    cdef unsigned char* sid_valid = cols.alloc("sid_valid", bitmap)
    cdef int64_t* sids = <int64_t*>cols.alloc("sid", n * 8)
    cdef unsigned char* sver_valid = cols.alloc("sver_valid", bitmap)
    cdef int64_t* svers = <int64_t*>cols.alloc("sver", n * 8)
    cdef Py_ssize_t key_nulls = 0, attr_nulls = 0, sid_nulls = 0, sver_nulls = 0, bad = -1
    cdef Py_ssize_t row = 0, entry = 0, chunk = 0, chunks = len(inputs)
    cdef uint32_t computed = 0
    # The chunks as C arrays, so that one nogil block copies them all.
    cdef const unsigned char** ptrs = <const unsigned char**>malloc(chunks * sizeof(void*))
    cdef Py_ssize_t* sizes = <Py_ssize_t*>malloc(chunks * sizeof(Py_ssize_t))
    cdef unsigned char* verifies = <unsigned char*>malloc(chunks)
    if ptrs == NULL or sizes == NULL or verifies == NULL:
        free(ptrs)
        free(sizes)
        free(verifies)
        raise MemoryError()
    try:
        for chunk in range(chunks):
            inp = inputs[chunk][0]
            ptrs[chunk], sizes[chunk], verifies[chunk] = inp.ptr, inp.size, inputs[chunk][1]
        with nogil:
            memset(key_valid, 0, bitmap)
            memset(attr_valid, 0, bitmap)
            memset(sid_valid, 0, bitmap)
            memset(sver_valid, 0, bitmap)
            key_offs[0] = val_offs[0] = prod_offs[0] = map_offs[0] = akey_offs[0] = aval_offs[0] = 0
            for chunk in range(chunks):
                _fill(ptrs[chunk], sizes[chunk], offsets, stamps, key_valid, key_offs, key_data, val_offs,
                      val_data, prod_offs, prod_data, attr_valid, map_offs, akey_offs, akey_data, aval_offs,
                      aval_data, sid_valid, sids, sver_valid, svers, &key_nulls, &attr_nulls, &sid_nulls,
                      &sver_nulls, verifies[chunk], &bad, &computed, &row, &entry)
                if bad >= 0:
                    break
        if bad >= 0:
            raise FrameCorrupt(f"CRC mismatch: stored 0x{load_u32(ptrs[chunk] + bad + OFF_CRC):08x}, "
                               f"computed 0x{computed:08x}", bad)
    finally:
        free(ptrs)
        free(sizes)
        free(verifies)
    b = cols.buffers
    attributes = schema.field("attributes").type
    entries = pa.StructArray.from_arrays(
        [pa.Array.from_buffers(pa.string(), t.attr_entries, [None, b["akey_offs"], b["akey_data"]]),
         pa.Array.from_buffers(pa.string(), t.attr_entries, [None, b["aval_offs"], b["aval_data"]])],
        fields=[attributes.key_field, attributes.item_field])
    arrays = [
        pa.Array.from_buffers(pa.int64(), n, [None, b["offset"]]),
        pa.Array.from_buffers(pa.timestamp("ms"), n, [None, b["timestamp"]]),
        pa.Array.from_buffers(pa.string(), n, [b["key_valid"] if key_nulls else None, b["key_offs"],
                                               b["key_data"]], null_count=key_nulls),
        pa.Array.from_buffers(pa.binary(), n, [None, b["val_offs"], b["val_data"]]),
        pa.Array.from_buffers(pa.string(), n, [None, b["prod_offs"], b["prod_data"]]),
        pa.Array.from_buffers(attributes, n,
                              [b["attr_valid"] if attr_nulls else None, b["map_offs"]],
                              null_count=attr_nulls, children=[entries]),
        pa.Array.from_buffers(pa.int64(), n, [b["sid_valid"] if sid_nulls else None, b["sid"]],
                              null_count=sid_nulls),
        pa.Array.from_buffers(pa.int64(), n, [b["sver_valid"] if sver_nulls else None, b["sver"]],
                              null_count=sver_nulls),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


cdef void _fill(const unsigned char* buf, Py_ssize_t size, int64_t* offsets, int64_t* stamps,
                unsigned char* key_valid, int32_t* key_offs, unsigned char* key_data,
                int32_t* val_offs, unsigned char* val_data, int32_t* prod_offs, unsigned char* prod_data,
                unsigned char* attr_valid, int32_t* map_offs, int32_t* akey_offs, unsigned char* akey_data,
                int32_t* aval_offs, unsigned char* aval_data, unsigned char* sid_valid, int64_t* sids,
                unsigned char* sver_valid, int64_t* svers, Py_ssize_t* key_nulls, Py_ssize_t* attr_nulls,
                Py_ssize_t* sid_nulls, Py_ssize_t* sver_nulls, bint verify, Py_ssize_t* bad,
                uint32_t* computed, Py_ssize_t* row_io, Py_ssize_t* entry_io) noexcept nogil:
    """Second pass over batches whose structure _check_all validated: CRC (if `verify`), then copies, from
    row `row_io` and attribute entry `entry_io` on (both moved past what this buffer held). Stops at the
    first CRC mismatch and reports its position in `bad`."""
    cdef Py_ssize_t pos = 0, row = row_io[0], entry = entry_io[0]
    cdef const unsigned char* p
    cdef const unsigned char* q
    cdef const unsigned char* r
    cdef const unsigned char* rend
    cdef const unsigned char* name
    cdef uint64_t base_offset, base_ts
    cdef uint32_t count, i, length, vlen
    cdef uint16_t name_len, addr_len, klen, nattrs, j
    cdef uint8_t flags
    while pos < size:
        p = buf + pos
        base_offset = load_u64(p + OFF_BASE_OFFSET)
        base_ts = load_u64(p + OFF_BASE_TS)
        length = load_u32(p + OFF_LENGTH)
        count = load_u32(p + OFF_COUNT)
        name_len = load_u16(p + OFF_NAME_LEN)
        addr_len = load_u16(p + OFF_ADDR_LEN)
        if verify:
            computed[0] = crc32c_update(0, p + CRC_FROM, length - CRC_FROM)
            if computed[0] != load_u32(p + OFF_CRC):
                bad[0] = pos
                row_io[0], entry_io[0] = row, entry
                return
        name = p + HEADER_BYTES
        q = name + name_len + addr_len + (SEQ_BYTES if load_u16(p + OFF_FLAGS) & FLAG_SEQUENCED else 0)
        for i in range(count):
            rend = q + 4 + load_u32(q)
            flags = q[REC_FLAGS]
            offsets[row] = <int64_t>(base_offset + i)
            stamps[row] = <int64_t>(base_ts + load_u32(q + REC_TS_DELTA))
            r = q + REC_FIXED
            if flags & F_REQUEST_ID:
                r += 8
            if flags & F_SCHEMA_ID:
                _set_valid(sid_valid, row)
                sids[row] = <int64_t>load_u64(r)
                r += 8
            else:
                sids[row] = 0
                sid_nulls[0] += 1
            if flags & F_SCHEMA_VERSION:
                _set_valid(sver_valid, row)
                svers[row] = load_u32(r)
                r += 4
            else:
                svers[row] = 0
                sver_nulls[0] += 1
            if flags & F_ROUTING_KEY:
                klen = load_u16(r)
                _set_valid(key_valid, row)
                _put_text(key_data, key_offs, row, r + 2, klen)
                r += 2 + klen
            else:
                key_offs[row + 1] = key_offs[row]
                key_nulls[0] += 1
            nattrs = load_u16(r) if flags & F_ATTRIBUTES else 0
            if flags & F_ATTRIBUTES:
                r += 2
            if nattrs:
                _set_valid(attr_valid, row)
                for j in range(nattrs):
                    klen = load_u16(r)
                    _put_text(akey_data, akey_offs, entry, r + 2, klen)
                    r += 2 + klen
                    vlen = load_u32(r)
                    _put_text(aval_data, aval_offs, entry, r + 4, vlen)
                    r += 4 + vlen
                    entry += 1
            else:
                attr_nulls[0] += 1
            map_offs[row + 1] = <int32_t>entry
            _put_text(val_data, val_offs, row, r, rend - r)
            _put_text(prod_data, prod_offs, row, name, name_len)
            q = rend
            row += 1
        pos += length
    row_io[0], entry_io[0] = row, entry

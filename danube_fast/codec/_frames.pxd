# C-level contract of the record-batch codec, cimported by _wal.pyx. Layout: docs/FORMAT.md.
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy


cdef enum:
    # Batch header fields; each position derives from the one before it.
    OFF_BASE_OFFSET = 0
    OFF_CRC = OFF_BASE_OFFSET + 8
    OFF_LENGTH = OFF_CRC + 4
    OFF_MAGIC = OFF_LENGTH + 4
    OFF_VERSION = OFF_MAGIC + 1
    OFF_FLAGS = OFF_VERSION + 1
    OFF_COUNT = OFF_FLAGS + 2
    OFF_BASE_TS = OFF_COUNT + 4
    OFF_MAX_TS = OFF_BASE_TS + 8
    OFF_PRODUCER_ID = OFF_MAX_TS + 8
    OFF_NAME_LEN = OFF_PRODUCER_ID + 8
    OFF_ADDR_LEN = OFF_NAME_LEN + 2
    OFF_RAW_SIZE = OFF_ADDR_LEN + 2
    HEADER_BYTES = OFF_RAW_SIZE + 4
    CRC_FROM = OFF_LENGTH          # the CRC covers [CRC_FROM, batch_length): base_offset and crc excluded

    # Record fields (relative to the record start).
    REC_LENGTH = 0
    REC_FLAGS = REC_LENGTH + 4
    REC_TS_DELTA = REC_FLAGS + 1
    REC_FIXED = REC_TS_DELTA + 4

    # Record presence flags.
    F_REQUEST_ID = 1
    F_SCHEMA_ID = 2
    F_SCHEMA_VERSION = 4
    F_ROUTING_KEY = 8
    F_ATTRIBUTES = 16
    F_KNOWN = 31

    # A write of fewer bytes than this keeps the GIL: releasing and retaking it costs a thread handoff (tens
    # of microseconds when the event loop thread is busy: the broker bench's WAL writer spent much of its
    # time waiting for the GIL on one-message groups), more than a small write into the page cache takes.
    NOGIL_MIN_BYTES = 64 * 1024

    # Bits 0-2 of the batch flags: how the records are stored (docs/FORMAT.md#compression).
    CODEC_MASK = 7
    CODEC_NONE = 0
    CODEC_ZSTD = 1
    CODEC_LZ4 = 2
    CODEC_LAST = CODEC_LZ4
    # Bit 3: the batch is sequenced (docs/FORMAT.md#sequenced-batches): `session` and `sequence` (u64 each)
    # follow the names.
    FLAG_SEQUENCED = 8
    SEQ_BYTES = 16

    BATCH_MAGIC = 0xDB
    BATCH_VERSION = 1
    MAX_BATCH = 1 << 26


cdef struct BatchInfo:
    Py_ssize_t position
    uint64_t base_offset
    uint32_t crc
    uint32_t length
    uint32_t count
    uint64_t base_ts
    uint64_t max_ts
    uint64_t producer_id
    uint16_t name_len
    uint16_t addr_len
    uint8_t codec
    uint32_t raw_size
    uint8_t seq_len                # SEQ_BYTES in a sequenced batch, else 0
    uint64_t session
    uint64_t sequence


# Structure (and, with verify_crc, the CRC) of the batch at `pos`, its records decompressed first if it is
# compressed; fills `info`; raises FrameCorrupt.
cdef int check_batch(const unsigned char* buf, Py_ssize_t size, Py_ssize_t pos, BatchInfo* info,
                     bint verify_crc) except -1
cdef uint32_t crc32c_of(const unsigned char* p, size_t n) noexcept nogil


# Little-endian loads and stores at any alignment (the module refuses to import on a big-endian host).
cdef inline uint16_t load_u16(const unsigned char* p) noexcept nogil:
    cdef uint16_t v
    memcpy(&v, p, 2)
    return v

cdef inline uint32_t load_u32(const unsigned char* p) noexcept nogil:
    cdef uint32_t v
    memcpy(&v, p, 4)
    return v

cdef inline uint64_t load_u64(const unsigned char* p) noexcept nogil:
    cdef uint64_t v
    memcpy(&v, p, 8)
    return v

cdef inline void store_u16(unsigned char* p, uint16_t v) noexcept nogil:
    memcpy(p, &v, 2)

cdef inline void store_u32(unsigned char* p, uint32_t v) noexcept nogil:
    memcpy(p, &v, 4)

cdef inline void store_u64(unsigned char* p, uint64_t v) noexcept nogil:
    memcpy(p, &v, 8)

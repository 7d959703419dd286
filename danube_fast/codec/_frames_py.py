"""Pure-Python twin of the native record-batch codec `danube_fast.codec._frames` (`_frames.pyx`).

`danube_fast.codec.frames` selects this module instead of the native one when DANUBE_FAST_PURE=1. It is the
reference implementation: the native module must produce the same bytes, return the same values and raise the
same exception types at the same batch positions. The byte layout and the order of the validation checks are
written once, in docs/FORMAT.md; this module follows that document and does not repeat it.

Only the standard library (`struct`) and pyarrow are used (its codecs stand in for the native module's libzstd
and liblz4: they write the same formats, not always the same bytes, so the tests compare what decodes). Every
reader accepts any buffer-protocol object and releases its view of the buffer before returning or raising, so
a caller may resize a `bytearray` (for example to cut a torn tail) while handling a `FrameCorrupt`.
"""

from __future__ import annotations

import contextlib
import operator
import struct
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from danube_fast.codec._arrow import arrow_schema
from danube_fast.codec._arrow import pyarrow as _pyarrow
from danube_fast.errors import FrameCorrupt

if TYPE_CHECKING:
    import pyarrow as pa
    from typing_extensions import Buffer

__all__ = [  # ARROW_SCHEMA too, through __getattr__ (built on first use)
    "COMPRESSIONS", "HEADER_SIZE", "LAYOUT", "MAGIC", "MAX_BATCH_BYTES", "VERSION",
    "BatchHeader", "Record", "arrow_schema", "crc32c", "decode_arrow", "decode_records", "encode_batch",
    "encode_payloads", "iter_records", "parse_header", "scan_batches", "stamp_base_offset", "verify_batch",
]

MAGIC = 0xDB
VERSION = 1
MAX_BATCH_BYTES = 1 << 26  # 64 MiB

# Batch header, see docs/FORMAT.md: base_offset, crc, batch_length, magic, version, flags, record_count,
# base_timestamp, max_timestamp, producer_id, producer_name_len, broker_addr_len, raw_size.
_HEADER = struct.Struct("<QIIBBHIQQQHHI")
_HEADER_FIELDS = ("base_offset", "crc", "batch_length", "magic", "version", "flags", "record_count",
                  "base_timestamp", "max_timestamp", "producer_id", "producer_name_len", "broker_addr_len",
                  "raw_size")
HEADER_SIZE = _HEADER.size
_CRC_POS = 8  # the u32 CRC sits right after base_offset ...
_CRC_START = _CRC_POS + 4  # ... and covers everything after itself
_LENGTH_POS = _CRC_START
_MAGIC_POS = 16
_VERSION_POS = _MAGIC_POS + 1
_FLAGS_POS = _VERSION_POS + 1
_NAME_LEN_POS = 48
_RAW_SIZE_POS = 52

# Record prefix: length (of what follows it), flags, timestamp_delta.
_RECORD_PREFIX = struct.Struct("<IBI")
_LENGTH_SIZE = 4
_MIN_RECORD_LENGTH = _RECORD_PREFIX.size - _LENGTH_SIZE  # flags + timestamp_delta

_F_REQUEST_ID = 0x01
_F_SCHEMA_ID = 0x02
_F_SCHEMA_VERSION = 0x04
_F_ROUTING_KEY = 0x08
_F_ATTRIBUTES = 0x10
_KNOWN_FLAGS = 0x1F

# Batch flags bits 0-2: the codec, an index into COMPRESSIONS (docs/FORMAT.md#compression).
_CODEC_MASK = 0x07
# Bit 3: sequenced (docs/FORMAT.md#sequenced-batches): session and sequence, u64 each, follow the names.
_FLAG_SEQUENCED = 0x08
_SEQUENCE = struct.Struct("<QQ")
_CODEC_ZSTD = 1
_CODEC_LZ4 = 2
COMPRESSIONS = ("none", "zstd", "lz4")
_ARROW_CODECS = {_CODEC_ZSTD: "zstd", _CODEC_LZ4: "lz4_raw"}  # lz4_raw: the LZ4 block format, no frame
_ZSTD_DEFAULT_LEVEL = 3
_MIN_SAVING = 8  # a batch stays compressed only when that saves at least 1/8 of its records' bytes


def _positions(layout: struct.Struct, names: Sequence[str], prefix: str = "") -> dict[str, int]:
    """Each field's byte position in `layout` (no padding: the format starts with "<")."""
    codes = layout.format[1:]
    return {prefix + name: struct.calcsize("<" + codes[:i]) for i, name in enumerate(names)}


# The positions by field name, as the native module's LAYOUT names them (tests/unit/test_layout_pinned.py).
LAYOUT = {
    **_positions(_HEADER, _HEADER_FIELDS), "header": HEADER_SIZE, "crc_from": _CRC_START,
    **_positions(_RECORD_PREFIX, ("length", "flags", "timestamp_delta"), "record."),
    "record.fixed": _RECORD_PREFIX.size, "flag.request_id": _F_REQUEST_ID, "flag.schema_id": _F_SCHEMA_ID,
    "flag.schema_version": _F_SCHEMA_VERSION, "flag.routing_key": _F_ROUTING_KEY,
    "flag.attributes": _F_ATTRIBUTES, "flag.known": _KNOWN_FLAGS, "codec.mask": _CODEC_MASK,
    "codec.zstd": _CODEC_ZSTD, "codec.lz4": _CODEC_LZ4, "flag.sequenced": _FLAG_SEQUENCED,
    "sequence_bytes": _SEQUENCE.size,
}

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U16_MAX = (1 << 16) - 1
_U32_MAX = (1 << 32) - 1
_U64_MASK = (1 << 64) - 1  # offsets and times are u64: sums wrap as they do in the native module

def __getattr__(name: str) -> Any:
    if name == "ARROW_SCHEMA":
        return arrow_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------------------------------------------
# Public value types


class Record:
    """One message. `offset` is -1 until the record is decoded from a stamped batch."""

    __slots__ = (
        "attributes",
        "offset",
        "payload",
        "publish_time",
        "request_id",
        "routing_key",
        "schema_id",
        "schema_version",
    )

    def __init__(
        self,
        payload: bytes,
        publish_time: int = 0,
        request_id: int = 0,
        routing_key: str | None = None,
        attributes: dict[str, str] | None = None,
        schema_id: int | None = None,
        schema_version: int | None = None,
        offset: int = -1,
    ) -> None:
        self.payload = payload
        self.publish_time = publish_time
        self.request_id = request_id
        self.routing_key = routing_key
        self.attributes = attributes
        self.schema_id = schema_id
        self.schema_version = schema_version
        self.offset = offset

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in Record.__slots__)

    def __repr__(self) -> str:
        payload = bytes(self.payload)
        shown = repr(payload[:32]) + ("..." if len(payload) > 32 else "")
        fields = [f"offset={self.offset}", f"publish_time={self.publish_time}", f"payload={shown}"]
        if self.request_id:
            fields.append(f"request_id={self.request_id}")
        for name in ("routing_key", "attributes", "schema_id", "schema_version"):
            value = getattr(self, name)
            if value is not None:
                fields.append(f"{name}={value!r}")
        return f"Record({', '.join(fields)})"


class BatchHeader:
    """The decoded header of the batch that starts at byte `position` of the buffer it was read from."""

    __slots__ = (
        "base_offset",
        "base_timestamp",
        "broker_addr",
        "compression",
        "crc",
        "length",
        "max_timestamp",
        "position",
        "producer_id",
        "producer_name",
        "raw_size",
        "record_count",
        "sequence",
        "session",
    )

    def __init__(
        self,
        position: int,
        base_offset: int,
        length: int,
        crc: int,
        record_count: int,
        base_timestamp: int,
        max_timestamp: int,
        producer_id: int,
        producer_name: str,
        broker_addr: str,
        compression: str = "none",
        raw_size: int = 0,
        session: int = 0,
        sequence: int = 0,
    ) -> None:
        self.position = position
        self.base_offset = base_offset
        self.length = length
        self.crc = crc
        self.record_count = record_count
        self.base_timestamp = base_timestamp
        self.max_timestamp = max_timestamp
        self.producer_id = producer_id
        self.producer_name = producer_name
        self.broker_addr = broker_addr
        self.compression = compression
        self.raw_size = raw_size
        self.session = session  # a sequenced batch's producer session and sequence; 0 and 0 otherwise
        self.sequence = sequence

    @property
    def last_offset(self) -> int:
        return (self.base_offset + self.record_count - 1) & _U64_MASK

    @property
    def end(self) -> int:
        return self.position + self.length

    def __repr__(self) -> str:
        return (
            f"BatchHeader(position={self.position}, base_offset={self.base_offset}, length={self.length}, "
            f"crc=0x{self.crc:08x}, record_count={self.record_count}, base_timestamp={self.base_timestamp}, "
            f"max_timestamp={self.max_timestamp}, producer_id={self.producer_id}, "
            f"producer_name={self.producer_name!r}, broker_addr={self.broker_addr!r}, "
            f"compression={self.compression!r})"
        )


# ------------------------------------------------------------------------------------------------------------
# CRC32C (Castagnoli), slicing-by-8: about 1.5x the speed of the byte-at-a-time loop in CPython.


def _crc_tables() -> tuple[tuple[int, ...], ...]:
    poly = 0x82F63B78  # reflected Castagnoli polynomial
    first = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
        first.append(crc)
    tables = [tuple(first)]
    for _ in range(7):
        previous = tables[-1]
        tables.append(tuple((crc >> 8) ^ first[crc & 0xFF] for crc in previous))
    return tuple(tables)


_CRC_TABLES = _crc_tables()
_TWO_U32 = struct.Struct("<II")


def crc32c(data: Buffer, value: int = 0) -> int:
    """CRC32C of `data`, continuing from `value`: crc32c(b, crc32c(a)) == crc32c(a + b)."""
    value = _check_uint(value, 32, "value")
    with _reading(data) as view:
        return _crc32c_view(view, value)


def _crc32c_view(view: memoryview, value: int) -> int:
    t0, t1, t2, t3, t4, t5, t6, t7 = _CRC_TABLES
    crc = value ^ 0xFFFFFFFF
    split = len(view) & ~7
    for low, high in _TWO_U32.iter_unpack(view[:split]):
        low ^= crc
        crc = (
            t7[low & 0xFF] ^ t6[(low >> 8) & 0xFF] ^ t5[(low >> 16) & 0xFF] ^ t4[low >> 24]
            ^ t3[high & 0xFF] ^ t2[(high >> 8) & 0xFF] ^ t1[(high >> 16) & 0xFF] ^ t0[high >> 24]
        )
    for byte in view[split:]:
        crc = t0[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# ------------------------------------------------------------------------------------------------------------
# Encoding


def _check_uint(value: Any, bits: int, field: str) -> int:
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{field} must be an int, not {type(value).__name__}") from None
    if not 0 <= number < 1 << bits:
        raise ValueError(f"{field} {number} is out of range for an unsigned {bits}-bit field")
    return number


def _check_payload(payload: Any, what: str) -> bytes | bytearray | memoryview:
    if isinstance(payload, (bytes, bytearray)):
        return payload
    if isinstance(payload, memoryview):
        return payload.cast("B") if payload.format != "B" or payload.ndim != 1 else payload
    raise TypeError(f"{what} must be bytes, bytearray or memoryview, not {type(payload).__name__}")


def _utf8_field(text: Any, field: str, max_bytes: int) -> bytes:
    if not isinstance(text, str):
        raise TypeError(f"{field} must be a str, not {type(text).__name__}")
    encoded = text.encode("utf-8")
    if len(encoded) > max_bytes:
        raise ValueError(f"{field} is {len(encoded)} UTF-8 bytes, the limit is {max_bytes}")
    return encoded


def _encode_attributes(attributes: Any, index: int) -> bytes:
    if not isinstance(attributes, dict):
        raise TypeError(f"record {index}: attributes must be a dict or None, not {type(attributes).__name__}")
    if len(attributes) > _U16_MAX:
        raise ValueError(f"record {index} has {len(attributes)} attributes, the limit is {_U16_MAX}")
    parts = [_U16.pack(len(attributes))]
    for key, value in attributes.items():
        encoded_key = _utf8_field(key, f"record {index}: attribute key", _U16_MAX)
        encoded_value = _utf8_field(value, f"record {index}: attribute value", _U32_MAX)
        parts += (_U16.pack(len(encoded_key)), encoded_key, _U32.pack(len(encoded_value)), encoded_value)
    return b"".join(parts)


class _Prepared(NamedTuple):
    publish_time: int
    flags: int
    optional: bytes  # the optional fields, already encoded in FORMAT.md order
    payload: bytes | bytearray | memoryview


def _prepare_record(record: Any, index: int) -> _Prepared:
    if not isinstance(record, Record):
        raise TypeError(f"record {index} is a {type(record).__name__}, not a Record")
    payload = _check_payload(record.payload, f"record {index}: payload")
    publish_time = _check_uint(record.publish_time, 64, "publish_time")
    request_id = _check_uint(record.request_id, 64, "request_id")
    flags = 0
    optional = []
    if request_id:
        flags |= _F_REQUEST_ID
        optional.append(_U64.pack(request_id))
    if record.schema_id is not None:
        flags |= _F_SCHEMA_ID
        optional.append(_U64.pack(_check_uint(record.schema_id, 64, "schema_id")))
    if record.schema_version is not None:
        flags |= _F_SCHEMA_VERSION
        optional.append(_U32.pack(_check_uint(record.schema_version, 32, "schema_version")))
    if record.routing_key is not None:
        flags |= _F_ROUTING_KEY
        key = _utf8_field(record.routing_key, f"record {index}: routing_key", _U16_MAX)
        optional += (_U16.pack(len(key)), key)
    if record.attributes is not None:
        attributes = _encode_attributes(record.attributes, index)
        if record.attributes:  # an empty map is sent as absent, see FORMAT.md
            flags |= _F_ATTRIBUTES
            optional.append(attributes)
    return _Prepared(publish_time, flags, b"".join(optional), payload)


def _start_batch(
    record_count: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_name: str,
    broker_addr: str,
    base_offset: int,
    records_size: int,
    session: int,
    sequence: int,
) -> bytearray:
    """The header, names and (with a session) sequence of a batch, with batch_length set and the CRC left 0
    for `_finish_batch`."""
    base_offset = _check_uint(base_offset, 64, "base_offset")
    producer_id = _check_uint(producer_id, 64, "producer_id")
    session = _check_uint(session, 64, "session")
    sequence = _check_uint(sequence, 64, "sequence")
    if (session == 0) != (sequence == 0):
        raise ValueError("session and sequence go together: both 0 (not sequenced) or both set")
    name = _utf8_field(producer_name, "producer_name", _U16_MAX)
    addr = _utf8_field(broker_addr, "broker_addr", _U16_MAX)
    seq = _SEQUENCE.pack(session, sequence) if session else b""
    length = HEADER_SIZE + len(name) + len(addr) + len(seq) + records_size
    if length > MAX_BATCH_BYTES:
        raise ValueError(f"the batch would be {length} bytes, more than MAX_BATCH_BYTES ({MAX_BATCH_BYTES})")
    out = bytearray(_HEADER.pack(
        base_offset, 0, length, MAGIC, VERSION, _FLAG_SEQUENCED if seq else 0, record_count, base_timestamp,
        max_timestamp, producer_id, len(name), len(addr), 0,
    ))
    out += name
    out += addr
    out += seq
    return out


def _finish_batch(out: bytearray) -> bytes:
    with memoryview(out) as view:
        crc = _crc32c_view(view[_CRC_START:], 0)
    _U32.pack_into(out, _CRC_POS, crc)
    return bytes(out)


def encode_batch(
    records: Sequence[Record],
    *,
    producer_id: int = 0,
    producer_name: str = "",
    broker_addr: str = "",
    base_offset: int = 0,
    compression: str | None = "none",
    level: int | None = None,
    session: int = 0,
    sequence: int = 0,
) -> bytes:
    """Encode `records` as one batch. Their `offset` is ignored: the batch carries `base_offset`. The records
    are compressed with `compression` ("none", "zstd" or "lz4"; `level` for zstd) unless that saves less than
    1/8 of their bytes. Sequenced (docs/FORMAT.md#sequenced-batches) when `session` and `sequence` are
    given."""
    codec = _codec_of(compression)
    prepared = [_prepare_record(record, index) for index, record in enumerate(records)]
    if not prepared:
        raise ValueError("a batch needs at least one record")
    base_timestamp = min(p.publish_time for p in prepared)
    max_timestamp = max(p.publish_time for p in prepared)
    if max_timestamp - base_timestamp > _U32_MAX:
        raise ValueError(
            f"publish times span {max_timestamp - base_timestamp} ms, a batch allows at most {_U32_MAX}"
        )
    records_size = sum(_RECORD_PREFIX.size + len(p.optional) + len(p.payload) for p in prepared)
    out = _start_batch(
        len(prepared), base_timestamp, max_timestamp, producer_id, producer_name, broker_addr, base_offset,
        records_size, session, sequence,
    )
    for p in prepared:
        length = _MIN_RECORD_LENGTH + len(p.optional) + len(p.payload)
        out += _RECORD_PREFIX.pack(length, p.flags, p.publish_time - base_timestamp)
        out += p.optional
        out += p.payload
    return _maybe_compress(_finish_batch(out), codec, level)


def encode_payloads(
    payloads: Sequence[bytes],
    *,
    publish_time: int = 0,
    producer_id: int = 0,
    producer_name: str = "",
    broker_addr: str = "",
    base_offset: int = 0,
    compression: str | None = "none",
    level: int | None = None,
    session: int = 0,
    sequence: int = 0,
    room: int = 0,
) -> Any:
    """The bytes of `encode_batch([Record(p, publish_time) for p in payloads], ...)`, without the Records;
    with `room` (and no compression), a view of them after `room` zero bytes, as `_frames.pyx` returns."""
    codec = _codec_of(compression)
    if room < 0:
        raise ValueError(f"room must be >= 0, not {room}")
    checked = [_check_payload(payload, f"payload {index}") for index, payload in enumerate(payloads)]
    if not checked:
        raise ValueError("a batch needs at least one record")
    publish_time = _check_uint(publish_time, 64, "publish_time")
    records_size = sum(_RECORD_PREFIX.size + len(payload) for payload in checked)
    out = _start_batch(
        len(checked), publish_time, publish_time, producer_id, producer_name, broker_addr, base_offset,
        records_size, session, sequence,
    )
    for payload in checked:
        out += _RECORD_PREFIX.pack(_MIN_RECORD_LENGTH + len(payload), 0, 0)
        out += payload
    if room and codec == 0:
        return memoryview(bytes(room) + _finish_batch(out))[room:]
    return _maybe_compress(_finish_batch(out), codec, level)


# ------------------------------------------------------------------------------------------------------------
# Compression (docs/FORMAT.md#compression)


def _codec_of(compression: str | None) -> int:
    if compression is None:
        return 0
    try:
        return COMPRESSIONS.index(compression)
    except ValueError:
        raise ValueError(
            f"unknown compression {compression!r}, expected one of {', '.join(COMPRESSIONS)}"
        ) from None


def _maybe_compress(batch: bytes, codec: int, level: int | None) -> bytes:
    """`batch` with its records compressed by `codec`, or `batch` when that saves less than 1/8 of their
    bytes (not worth a decompression in every reader)."""
    if codec == 0:
        return batch
    pa = _pyarrow()
    if codec == _CODEC_ZSTD:
        level = _ZSTD_DEFAULT_LEVEL if level is None else operator.index(level)
        if not -(1 << 17) <= level <= 22:
            raise ValueError(f"zstd level {level} is outside {-(1 << 17)}..22")
        compressor = pa.Codec("zstd", compression_level=level)
    else:
        compressor = pa.Codec(_ARROW_CODECS[codec])
    name_len, addr_len = struct.unpack_from("<HH", batch, _NAME_LEN_POS)
    sequenced = _U16.unpack_from(batch, _FLAGS_POS)[0] & _FLAG_SEQUENCED
    head = HEADER_SIZE + name_len + addr_len + (_SEQUENCE.size if sequenced else 0)
    raw = len(batch) - head
    packed = compressor.compress(memoryview(batch)[head:], asbytes=True)
    if len(packed) > raw - raw // _MIN_SAVING:
        return batch
    out = bytearray(batch[:head])
    _U16.pack_into(out, _FLAGS_POS, codec | sequenced)
    _U32.pack_into(out, _RAW_SIZE_POS, raw)
    _U32.pack_into(out, _LENGTH_POS, head + len(packed))
    out += packed
    return _finish_batch(out)


def _decompress(view: memoryview, header: BatchHeader, records_start: int) -> bytes:
    """The records of the compressed batch `header`, exactly `raw_size` bytes (check 4)."""
    pa = _pyarrow()
    codec = pa.Codec(_ARROW_CODECS[COMPRESSIONS.index(header.compression)])
    block = view[records_start:header.end]
    raw: bytes | None = None
    with contextlib.suppress(OSError, ValueError, pa.ArrowException):
        raw = codec.decompress(block, decompressed_size=header.raw_size, asbytes=True)
    if raw is not None and header.compression == "lz4":
        # pyarrow returns raw_size bytes even when the block held fewer (its zstd codec checks, its lz4 codec
        # does not): the block decodes to exactly raw_size bytes only if it overflows one byte less.
        with contextlib.suppress(OSError, ValueError, pa.ArrowException):
            codec.decompress(block, decompressed_size=header.raw_size - 1, asbytes=True)
            raw = None
    if raw is None or len(raw) != header.raw_size:
        raise FrameCorrupt(
            f"{header.compression} records do not decompress to the {header.raw_size} bytes raw_size gives",
            header.position,
        )
    return bytes(raw)


def stamp_base_offset(buf: Buffer, base_offset: int, position: int = 0) -> None:
    """Write `base_offset` into the batch at `position` of the writable `buf`; the CRC stays valid."""
    base_offset = _check_uint(base_offset, 64, "base_offset")
    position = _check_position(position)
    with _reading(buf) as view:
        if view.readonly:
            raise TypeError(f"stamp_base_offset needs a writable buffer, {type(buf).__name__} is read-only")
        _check_header_room(view, position)
        _check_magic_version(view, position)
        _U64.pack_into(view, position, base_offset)


# ------------------------------------------------------------------------------------------------------------
# Decoding


@contextmanager
def _reading(buf: Buffer) -> Iterator[memoryview]:
    """A flat unsigned-byte view of `buf`, released on exit."""
    try:
        raw = memoryview(buf)
    except TypeError:
        raise TypeError(f"expected a bytes-like object, not {type(buf).__name__}") from None
    with raw:
        if raw.format == "B" and raw.ndim == 1:
            yield raw
        else:
            with raw.cast("B") as flat:
                yield flat


def _check_position(position: Any) -> int:
    number = operator.index(position)
    if number < 0:
        raise ValueError(f"position must be >= 0, not {number}")
    return number


def _check_header_room(view: memoryview, position: int) -> None:
    remaining = max(len(view) - position, 0)
    if remaining < HEADER_SIZE:
        raise FrameCorrupt(
            f"batch is torn: needs a {HEADER_SIZE}-byte header, buffer has {remaining}", position
        )


def _check_magic_version(view: memoryview, position: int) -> None:
    magic = view[position + _MAGIC_POS]
    if magic != MAGIC:
        raise FrameCorrupt(f"bad magic 0x{magic:02x}, expected 0x{MAGIC:02x}", position)
    version = view[position + _VERSION_POS]
    if version != VERSION:
        raise FrameCorrupt(f"unsupported version {version}, expected {VERSION}", position)


def _decode_utf8(view: memoryview, start: int, size: int, what: str, position: int) -> str:
    try:
        return str(view[start:start + size], "utf-8")
    except UnicodeDecodeError as e:
        raise FrameCorrupt(f"{what} is not valid UTF-8", position) from e


def _read_header(view: memoryview, position: int) -> tuple[BatchHeader, int]:
    """Checks 1 and 2 of FORMAT.md "Validation"; returns the header and the position of its first record."""
    _check_header_room(view, position)
    _check_magic_version(view, position)
    (base_offset, crc, length, _magic, _version, flags, record_count, base_timestamp, max_timestamp,
     producer_id, name_len, addr_len, raw_size) = _HEADER.unpack_from(view, position)
    if flags & ~(_CODEC_MASK | _FLAG_SEQUENCED):
        raise FrameCorrupt(f"batch flags 0x{flags:04x} set bits other than the codec's and sequenced",
                           position)
    codec = flags & _CODEC_MASK
    if codec >= len(COMPRESSIONS):
        raise FrameCorrupt(f"unknown compression codec {codec}", position)
    if codec == 0 and raw_size:
        raise FrameCorrupt(f"raw_size is {raw_size} in an uncompressed batch, must be 0", position)
    if codec and not raw_size:
        raise FrameCorrupt("raw_size is 0 in a compressed batch", position)
    if record_count == 0:
        raise FrameCorrupt("record_count is 0, a batch has at least one record", position)
    records_start = HEADER_SIZE + name_len + addr_len + (_SEQUENCE.size if flags & _FLAG_SEQUENCED else 0)
    if length < records_start:
        raise FrameCorrupt(
            f"batch_length {length} is shorter than its header, names and sequence ({records_start} bytes)",
            position,
        )
    # Above the limit before torn: such a length is corrupt whatever the buffer holds.
    if length > MAX_BATCH_BYTES:
        raise FrameCorrupt(f"batch_length {length} exceeds MAX_BATCH_BYTES ({MAX_BATCH_BYTES})", position)
    if records_start + raw_size > MAX_BATCH_BYTES:
        raise FrameCorrupt(
            f"raw_size {raw_size} would make the batch exceed MAX_BATCH_BYTES ({MAX_BATCH_BYTES})", position
        )
    remaining = len(view) - position
    if length > remaining:
        raise FrameCorrupt(f"batch is torn: needs {length} bytes, buffer has {remaining}", position)
    name_start = position + HEADER_SIZE
    producer_name = _decode_utf8(view, name_start, name_len, "producer_name", position)
    broker_addr = _decode_utf8(view, name_start + name_len, addr_len, "broker_addr", position)
    session = sequence = 0
    if flags & _FLAG_SEQUENCED:
        session, sequence = _SEQUENCE.unpack_from(view, name_start + name_len + addr_len)
        if not (session and sequence):
            raise FrameCorrupt("a sequenced batch has session or sequence 0", position)
    header = BatchHeader(
        position, base_offset, length, crc, record_count, base_timestamp, max_timestamp, producer_id,
        producer_name, broker_addr, COMPRESSIONS[codec], raw_size, session, sequence,
    )
    return header, position + records_start


def _check_crc(view: memoryview, header: BatchHeader) -> None:
    computed = _crc32c_view(view[header.position + _CRC_START:header.end], 0)
    if computed != header.crc:
        raise FrameCorrupt(
            f"CRC mismatch: stored 0x{header.crc:08x}, computed 0x{computed:08x}", header.position
        )


class _Fields(NamedTuple):
    """One decoded record, before it becomes a Record or a row of Arrow columns."""

    publish_time: int
    request_id: int
    routing_key: str | None
    attributes: dict[str, str] | None
    schema_id: int | None
    schema_version: int | None
    payload: bytes


class _RecordReader:
    """Bounds-checked reads inside record `index`; every overrun is a FrameCorrupt naming the field."""

    __slots__ = ("cursor", "end", "index", "position", "view")

    def __init__(self, view: memoryview, cursor: int, end: int, index: int, position: int) -> None:
        self.view = view
        self.cursor = cursor
        self.end = end
        self.index = index
        self.position = position

    def _take(self, size: int, what: str) -> int:
        start = self.cursor
        if self.end - start < size:
            raise FrameCorrupt(f"record {self.index}: {what} overruns the record", self.position)
        self.cursor = start + size
        return start

    def uint(self, layout: struct.Struct, what: str) -> int:
        value: int = layout.unpack_from(self.view, self._take(layout.size, what))[0]
        return value

    def text(self, size: int, what: str) -> str:
        start = self._take(size, what)
        return _decode_utf8(self.view, start, size, f"record {self.index}: {what}", self.position)

    def attributes(self) -> dict[str, str] | None:
        count = self.uint(_U16, "attribute count")
        attributes = {}
        for number in range(count):
            what = f"attribute {number}"
            key = self.text(self.uint(_U16, f"{what} key length"), f"{what} key")
            attributes[key] = self.text(self.uint(_U32, f"{what} value length"), f"{what} value")
        return attributes or None


def _records(view: memoryview, header: BatchHeader, records_start: int) -> Iterator[_Fields]:
    """Checks 4 and 5 of FORMAT.md "Validation", decoding each record on the way."""
    if header.compression == "none":
        return _walk_records(view, header, records_start, header.end)
    raw = _decompress(view, header, records_start)
    return _walk_records(memoryview(raw), header, 0, len(raw))


def _walk_records(view: memoryview, header: BatchHeader, cursor: int, end: int) -> Iterator[_Fields]:
    """Check 5: the records [cursor, end) of `view`, errors naming the batch's position."""
    position = header.position
    for index in range(header.record_count):
        if end - cursor < _LENGTH_SIZE:
            raise FrameCorrupt(f"record {index} overruns the batch end", position)
        length, = _U32.unpack_from(view, cursor)
        record_end = cursor + _LENGTH_SIZE + length
        if record_end > end:
            raise FrameCorrupt(
                f"record {index} overruns the batch end: length {length}, {end - cursor - _LENGTH_SIZE} "
                f"bytes left", position,
            )
        if length < _MIN_RECORD_LENGTH:
            raise FrameCorrupt(
                f"record {index} is too short: length {length}, minimum {_MIN_RECORD_LENGTH}", position
            )
        _, flags, delta = _RECORD_PREFIX.unpack_from(view, cursor)
        unknown = flags & ~_KNOWN_FLAGS
        if unknown:
            raise FrameCorrupt(f"record {index} sets unknown flag bits 0x{unknown:02x}", position)
        reader = _RecordReader(view, cursor + _RECORD_PREFIX.size, record_end, index, position)
        request_id = reader.uint(_U64, "request_id") if flags & _F_REQUEST_ID else 0
        schema_id = reader.uint(_U64, "schema_id") if flags & _F_SCHEMA_ID else None
        schema_version = reader.uint(_U32, "schema_version") if flags & _F_SCHEMA_VERSION else None
        routing_key = None
        if flags & _F_ROUTING_KEY:
            routing_key = reader.text(reader.uint(_U16, "routing key length"), "routing key")
        attributes = reader.attributes() if flags & _F_ATTRIBUTES else None
        yield _Fields(
            (header.base_timestamp + delta) & _U64_MASK, request_id, routing_key, attributes, schema_id,
            schema_version, bytes(view[reader.cursor:record_end]),
        )
        cursor = record_end
    if cursor != end:
        raise FrameCorrupt(
            f"the {header.record_count} records end {end - cursor} bytes before the batch does", position
        )


def _batches(view: memoryview, verify: bool) -> Iterator[tuple[BatchHeader, list[_Fields]]]:
    """Every batch of `view` with its fully validated records, in order."""
    position = 0
    while position < len(view):
        header, records_start = _read_header(view, position)
        if verify:
            _check_crc(view, header)
        yield header, list(_records(view, header, records_start))
        position = header.end


def _verify(view: memoryview, position: int) -> BatchHeader:
    header, records_start = _read_header(view, position)
    _check_crc(view, header)
    for _ in _records(view, header, records_start):
        pass
    return header


def _parse(view: memoryview, position: int) -> BatchHeader:
    return _read_header(view, position)[0]


def parse_header(buf: Buffer, position: int = 0) -> BatchHeader:
    """The header of the batch at `position`, structurally checked (checks 1 and 2); the CRC is not read."""
    position = _check_position(position)
    with _reading(buf) as view:
        return _parse(view, position)


def verify_batch(buf: Buffer, position: int = 0) -> BatchHeader:
    """The header of the batch at `position` after every check of FORMAT.md, CRC and record walk included."""
    position = _check_position(position)
    with _reading(buf) as view:
        return _verify(view, position)


def scan_batches(buf: Buffer, verify: bool = True) -> list[BatchHeader]:
    """Headers of the back-to-back batches filling `buf`, each verified unless `verify` is false."""
    check = _verify if verify else _parse
    headers = []
    with _reading(buf) as view:
        position = 0
        while position < len(view):
            header = check(view, position)
            headers.append(header)
            position = header.end
    return headers


def join_after_room(chunks: Iterable[Buffer], room: int) -> memoryview:
    """See `_frames.pyx`: the chunks joined after `room` zero bytes, a view of the joined part."""
    if room < 0:
        raise ValueError(f"room must be >= 0, not {room}")
    return memoryview(bytes(room) + b"".join(chunks))[room:]


def fill_room(data: Buffer, head: Buffer) -> bytes | None:
    """See `_frames.pyx`. Always None here: Python cannot write into a bytes object, so callers join
    instead (the same message, one copy more)."""
    return None


def span(buf: Buffer) -> tuple[int, int]:
    """(first offset, next offset) of back-to-back batches, from their headers alone (no CRC, no records)."""
    with _reading(buf) as view:
        if len(view) == 0:
            raise FrameCorrupt("empty buffer has no offsets", 0)
        position, first, nxt = 0, 0, 0
        while position < len(view):
            header, _ = _read_header(view, position)
            if position == 0:
                first = header.base_offset
            nxt = header.base_offset + header.record_count
            position += header.length
        return first, nxt


def _make_record(fields: _Fields, offset: int) -> Record:
    return Record(
        fields.payload, fields.publish_time, fields.request_id, fields.routing_key, fields.attributes,
        fields.schema_id, fields.schema_version, offset,
    )


def iter_records(buf: Buffer, verify: bool = True) -> Iterator[Record]:
    """The records of every batch in `buf`, in order. A batch's records are yielded only once it passed
    validation; with `verify` false the CRC is skipped but the structure is still checked."""
    with _reading(buf) as view:
        for header, records in _batches(view, verify):
            for index, fields in enumerate(records):
                yield _make_record(fields, (header.base_offset + index) & _U64_MASK)


def decode_records(buf: Buffer, verify: bool = True) -> list[Record]:
    """`list(iter_records(buf, verify))`."""
    with _reading(buf) as view:
        return [
            _make_record(fields, (header.base_offset + index) & _U64_MASK)
            for header, records in _batches(view, verify)
            for index, fields in enumerate(records)
        ]


def _as_int64(value: int) -> int:
    """The u64 bit pattern of `value` read as a signed int64 (Spark has no unsigned types)."""
    return ((value + (1 << 63)) & ((1 << 64) - 1)) - (1 << 63)


def decode_arrow(buf: Buffer, verify: bool = True) -> pa.RecordBatch:
    """All records of `buf` as one RecordBatch with ARROW_SCHEMA."""
    return decode_arrow_chunks((buf,), verify)


def decode_arrow_chunks(bufs: Iterable[Buffer], verify: bool = True) -> pa.RecordBatch:
    """All records of several buffers, one after another, as one RecordBatch with ARROW_SCHEMA."""
    pa, schema = _pyarrow(), arrow_schema()
    columns: dict[str, list[Any]] = {field.name: [] for field in schema}
    for buf in bufs:
        with _reading(buf) as view:
            for header, records in _batches(view, verify):
                _append_rows(columns, header, records)
    arrays = [pa.array(columns[field.name], type=field.type) for field in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _append_rows(columns: dict[str, list[Any]], header: BatchHeader, records: Iterable[_Fields]) -> None:
    for index, fields in enumerate(records):
        columns["offset"].append(_as_int64(header.base_offset + index))
        columns["timestamp"].append(_as_int64(fields.publish_time))
        columns["key"].append(fields.routing_key)
        columns["value"].append(fields.payload)
        columns["producer"].append(header.producer_name)
        columns["attributes"].append(None if fields.attributes is None else list(fields.attributes.items()))
        columns["schema_id"].append(None if fields.schema_id is None else _as_int64(fields.schema_id))
        columns["schema_version"].append(fields.schema_version)

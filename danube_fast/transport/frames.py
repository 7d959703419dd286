"""The native transport's frames (docs/TRANSPORT.md): the 16-byte header, the handshake, error and keepalive
bodies, and an incremental decoder that refuses bad input before it buffers it.

Hand-written: the layout is ours, and nothing in the field parses it. It is per frame, not per record (a
frame carries whole record batches, which stay the bytes they arrived as), so `struct` is fast enough.

Everything here checks untrusted bytes: a bad header is a `FrameError` (the connection must close, since
where the next frame starts is unknown), a bad body a `FrameError` too, naming what was wrong. Nothing
else escapes: tests/fuzz/targets.py `transport_frames` holds it to that.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

HEADER = struct.Struct("<IBBHQ")  # length, type, flags, reserved, request_id
HEADER_BYTES = HEADER.size  # 16
AFTER_LENGTH = HEADER_BYTES - 4  # what `length` counts besides the body
VERSION = 1
MAGIC = b"DNBT"
MAX_BATCH = 64 * 1024 * 1024  # docs/FORMAT.md: the largest record batch
DEFAULT_MAX_FRAME = MAX_BATCH + 64 * 1024  # a batch and room for a frame's own fields
MIN_MAX_FRAME = 64 * 1024  # what a peer may lower max_frame to, at least: a handshake must fit

_U8, _U16, _U32, _U64, _I64 = (struct.Struct(f) for f in ("<B", "<H", "<I", "<Q", "<q"))


class FrameType(enum.IntEnum):
    HELLO = 0x01
    WELCOME = 0x02
    ERROR = 0x03
    PING = 0x04
    PONG = 0x05
    GOODBYE = 0x06
    PRODUCE_OPEN = 0x10
    PRODUCE_OPENED = 0x11
    PRODUCE = 0x12
    ACK = 0x13
    SUBSCRIBE = 0x20
    SUBSCRIBED = 0x21
    RECORDS = 0x22
    ACKNOWLEDGE = 0x23
    LOOKUP = 0x30
    LOCATED = 0x31
    OFFSETS = 0x40
    RANGE = 0x41
    READ = 0x42
    READ_DONE = 0x43
    CANCEL = 0x44
    REPLICA_FETCH = 0x50  # between brokers: replica_frames.py
    REPLICA_DATA = 0x51


_TYPES = frozenset(FrameType)

# gRPC's numeric status codes, which ERROR frames carry (docs/TRANSPORT.md "Errors").
STATUS_CODES = {"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
                "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
                "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
                "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16}
STATUS_NAMES = {number: name for name, number in STATUS_CODES.items()}


class FrameError(Exception):
    """The peer broke the protocol: `code` is the status the ERROR frame answering it carries."""

    def __init__(self, message: str, code: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Frame:
    type: FrameType
    flags: int
    request_id: int
    body: memoryview


# -- the header ---------------------------------------------------------------------------------------


def header(kind: FrameType, body_bytes: int, request_id: int, flags: int = 0) -> bytes:
    """The header of a frame of `kind` whose body is `body_bytes` long."""
    return HEADER.pack(AFTER_LENGTH + body_bytes, kind, flags, 0, request_id)


def frame(kind: FrameType, body: bytes, request_id: int = 0, flags: int = 0) -> bytes:
    """A whole frame (for the small ones: a frame carrying batches is written as header + body parts)."""
    return header(kind, len(body), request_id, flags) + body


def parse_header(data: bytes | bytearray | memoryview, max_frame: int) -> tuple[int, FrameType, int, int]:
    """(body bytes, type, flags, request id) of the header at the start of `data` (HEADER_BYTES of it), or
    FrameError: a length outside 12..max_frame - 4, a nonzero reserved field or an unknown type."""
    length, kind, flags, reserved, request_id = HEADER.unpack_from(data)
    if length < AFTER_LENGTH or length > max_frame - 4:
        raise FrameError(f"frame length {length}: it must be {AFTER_LENGTH} to {max_frame - 4} (max_frame "
                         f"{max_frame})")
    if reserved:
        raise FrameError(f"reserved header field is {reserved}, not 0")
    if kind not in _TYPES:
        raise FrameError(f"unknown frame type 0x{kind:02x}")
    return length - AFTER_LENGTH, FrameType(kind), flags, request_id


class FrameDecoder:
    """Bytes in, whole frames out. A header is checked as soon as its 16 bytes are in, before any of its body
    is buffered, so a length of 4 GiB costs nothing. `max_frame` may be lowered after the handshake."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()
        self._wanted: tuple[int, FrameType, int, int] | None = None  # the header read, waiting for its body

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """The frames `data` completes (their bodies copied out of the decoder's buffer)."""
        self._buffer += data
        out: list[Frame] = []
        while True:
            if self._wanted is None:
                if len(self._buffer) < HEADER_BYTES:
                    return out
                self._wanted = parse_header(self._buffer, self.max_frame)
                del self._buffer[:HEADER_BYTES]
            size, kind, flags, request_id = self._wanted
            if len(self._buffer) < size:
                return out
            body = bytes(self._buffer[:size])
            del self._buffer[:size]
            self._wanted = None
            out.append(Frame(kind, flags, request_id, memoryview(body)))


# -- bodies -----------------------------------------------------------------------------------------------


class BodyWriter:
    def __init__(self) -> None:
        self._parts = bytearray()

    def u8(self, value: int) -> BodyWriter:
        self._parts += _U8.pack(value)
        return self

    def u16(self, value: int) -> BodyWriter:
        self._parts += _U16.pack(value)
        return self

    def u32(self, value: int) -> BodyWriter:
        self._parts += _U32.pack(value)
        return self

    def u64(self, value: int) -> BodyWriter:
        self._parts += _U64.pack(value)
        return self

    def i64(self, value: int) -> BodyWriter:
        self._parts += _I64.pack(value)
        return self

    def string(self, value: str) -> BodyWriter:
        data = value.encode()
        if len(data) > 0xFFFF:
            raise ValueError(f"a string of {len(data)} bytes: at most 65535")
        self._parts += _U16.pack(len(data)) + data
        return self

    def u64_list(self, values: list[int]) -> BodyWriter:
        self._parts += _U32.pack(len(values)) + struct.pack(f"<{len(values)}Q", *values)
        return self

    def raw(self, value: bytes) -> BodyWriter:
        self._parts += value
        return self

    def done(self) -> bytes:
        return bytes(self._parts)


class BodyReader:
    """Fields read in order from a frame's body; `FrameError` names the frame and field that does not fit."""

    def __init__(self, body: memoryview | bytes, what: str) -> None:
        self._body = memoryview(body)
        self._at = 0
        self._what = what

    def _take(self, size: int, field: str) -> memoryview:
        if self._at + size > len(self._body):
            raise FrameError(f"{self._what}: {field} needs {size} bytes at byte {self._at}, the body has "
                             f"{len(self._body)}")
        out = self._body[self._at:self._at + size]
        self._at += size
        return out

    def fixed(self, size: int, field: str) -> bytes:
        return bytes(self._take(size, field))

    def u8(self, field: str) -> int:
        return int(_U8.unpack(self._take(1, field))[0])

    def u16(self, field: str) -> int:
        return int(_U16.unpack(self._take(2, field))[0])

    def u32(self, field: str) -> int:
        return int(_U32.unpack(self._take(4, field))[0])

    def u64(self, field: str) -> int:
        return int(_U64.unpack(self._take(8, field))[0])

    def i64(self, field: str) -> int:
        return int(_I64.unpack(self._take(8, field))[0])

    def string(self, field: str) -> str:
        data = self._take(self.u16(field), field)
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError as e:
            raise FrameError(f"{self._what}: {field} is not UTF-8 ({e.reason} at byte {e.start})") from None

    def u64_list(self, field: str, most: int) -> list[int]:
        count = self.u32(field)
        if count > most:
            raise FrameError(f"{self._what}: {field} has {count} items, at most {most}")
        data = self._take(8 * count, field)
        return list(struct.unpack(f"<{count}Q", data))

    def rest(self) -> memoryview:
        """The body's bytes after the fields read (a frame's record batches)."""
        out = self._body[self._at:]
        self._at = len(self._body)
        return out

    def end(self) -> None:
        if self._at != len(self._body):
            raise FrameError(f"{self._what}: {len(self._body) - self._at} bytes after its last field")


@dataclass(frozen=True)
class Hello:
    min_version: int
    max_version: int
    max_frame: int
    token: str
    client: str

    def encode(self) -> bytes:
        return (BodyWriter().raw(MAGIC).u16(self.min_version).u16(self.max_version).u32(self.max_frame)
                .string(self.token).string(self.client).done())

    @classmethod
    def decode(cls, body: memoryview | bytes) -> Hello:
        r = BodyReader(body, "HELLO")
        if r.fixed(len(MAGIC), "magic") != MAGIC:
            raise FrameError("HELLO: not a danube_fast native client (bad magic)")
        hello = cls(r.u16("min_version"), r.u16("max_version"), r.u32("max_frame"), r.string("token"),
                    r.string("client"))
        r.end()
        if hello.min_version > hello.max_version:
            raise FrameError(f"HELLO: min_version {hello.min_version} is above max_version "
                             f"{hello.max_version}")
        if hello.max_frame < MIN_MAX_FRAME:
            raise FrameError(f"HELLO: max_frame {hello.max_frame} is below {MIN_MAX_FRAME}")
        return hello

    def agree(self, server_max_frame: int = DEFAULT_MAX_FRAME) -> tuple[int, int]:
        """(version, max_frame) both sides use; FrameError (FAILED_PRECONDITION) without a common version."""
        if not self.min_version <= VERSION <= self.max_version:
            raise FrameError(f"HELLO: versions {self.min_version}..{self.max_version}, this broker speaks "
                             f"{VERSION}", "FAILED_PRECONDITION")
        return VERSION, min(self.max_frame, server_max_frame)


@dataclass(frozen=True)
class Welcome:
    version: int
    max_frame: int
    broker_id: int
    keepalive_ms: int
    max_inflight_bytes: int

    def encode(self) -> bytes:
        return (BodyWriter().u16(self.version).u32(self.max_frame).u64(self.broker_id).u32(self.keepalive_ms)
                .u64(self.max_inflight_bytes).done())

    @classmethod
    def decode(cls, body: memoryview | bytes) -> Welcome:
        r = BodyReader(body, "WELCOME")
        welcome = cls(r.u16("version"), r.u32("max_frame"), r.u64("broker_id"), r.u32("keepalive_ms"),
                      r.u64("max_inflight_bytes"))
        r.end()
        return welcome


@dataclass(frozen=True)
class Error:
    code: str  # a gRPC status name
    retriable: bool
    message: str

    def encode(self) -> bytes:
        return BodyWriter().u16(STATUS_CODES[self.code]).u8(int(self.retriable)).string(self.message).done()

    @classmethod
    def decode(cls, body: memoryview | bytes) -> Error:
        r = BodyReader(body, "ERROR")
        number, retriable, message = r.u16("code"), r.u8("retriable"), r.string("message")
        r.end()
        if number not in STATUS_NAMES:
            raise FrameError(f"ERROR: unknown status code {number}")
        if retriable > 1:
            raise FrameError(f"ERROR: retriable is {retriable}, not 0 or 1")
        return cls(STATUS_NAMES[number], bool(retriable), message)


def ping_body(nonce: int) -> bytes:
    """The body of a PING, and of the PONG that answers it."""
    return _U64.pack(nonce)


def decode_ping(body: memoryview | bytes, what: str = "PING") -> int:
    r = BodyReader(body, what)
    nonce = r.u64("nonce")
    r.end()
    return nonce


@dataclass(frozen=True)
class Goodbye:
    code: str
    message: str

    def encode(self) -> bytes:
        return BodyWriter().u16(STATUS_CODES[self.code]).string(self.message).done()

    @classmethod
    def decode(cls, body: memoryview | bytes) -> Goodbye:
        r = BodyReader(body, "GOODBYE")
        number, message = r.u16("code"), r.string("message")
        r.end()
        if number not in STATUS_NAMES:
            raise FrameError(f"GOODBYE: unknown status code {number}")
        return cls(STATUS_NAMES[number], message)


# -- the fast API's frames (the record batches they carry are not copied: `batches` views the body) ----------

MAX_ACK_OFFSETS = 1 << 20  # offsets one ACKNOWLEDGE may name (individually, or as nacks): 8 MiB of them


@dataclass(frozen=True)
class ProduceOpen:
    topic: str
    producer: str
    reliable: bool

    def encode(self) -> bytes:
        return BodyWriter().string(self.topic).string(self.producer).u8(int(self.reliable)).done()

    @classmethod
    def decode(cls, body: memoryview | bytes) -> ProduceOpen:
        r = BodyReader(body, "PRODUCE_OPEN")
        topic, producer, reliable = r.string("topic"), r.string("producer"), r.u8("reliable")
        r.end()
        if reliable > 1:
            raise FrameError(f"PRODUCE_OPEN: reliable is {reliable}, not 0 or 1")
        return cls(topic, producer, bool(reliable))


def produce_head(records: int) -> bytes:
    """A PRODUCE body's fields; the record batches follow them (written as they are, not joined)."""
    return _U32.pack(records)


def decode_produce(body: memoryview | bytes) -> tuple[int, memoryview]:
    """(records, the batches) of a PRODUCE body; the batches are checked by the codec, not here."""
    r = BodyReader(body, "PRODUCE")
    records = r.u32("records")
    batches = r.rest()
    if not batches:
        raise FrameError("PRODUCE: no record batch after its fields")
    return records, batches


def offsets_body(first: int, last: int) -> bytes:
    """The body of an ACK, and of SUBSCRIBED (consumer id, start offset) and RECORDS' fields."""
    return _U64.pack(first) + _U64.pack(last)


def decode_offsets(body: memoryview | bytes, what: str, first: str, last: str,
                   more: bool = False) -> tuple[int, int, memoryview]:
    """Two u64 fields named `first` and `last`, and (when `more`: RECORDS) the bytes after them."""
    r = BodyReader(body, what)
    a, b = r.u64(first), r.u64(last)
    rest = r.rest() if more else memoryview(b"")
    r.end()
    return a, b, rest


@dataclass(frozen=True)
class Subscribe:
    topic: str
    subscription: str
    consumer: str
    window_bytes: int
    earliest: bool

    def encode(self) -> bytes:
        return (BodyWriter().string(self.topic).string(self.subscription).string(self.consumer)
                .u64(self.window_bytes).u8(int(self.earliest)).done())

    @classmethod
    def decode(cls, body: memoryview | bytes) -> Subscribe:
        r = BodyReader(body, "SUBSCRIBE")
        got = (r.string("topic"), r.string("subscription"), r.string("consumer"), r.u64("window_bytes"),
               r.u8("initial_position"))
        r.end()
        if got[4] > 1:
            raise FrameError(f"SUBSCRIBE: initial_position is {got[4]}, not 0 (latest) or 1 (earliest)")
        return cls(got[0], got[1], got[2], got[3], bool(got[4]))


@dataclass(frozen=True)
class Read:
    """READ: offsets [from_offset, to_offset) of a Reliable topic (to_offset 0: what is committed when the
    read starts), in RECORDS frames of about max_bytes each (0: the broker's default), then READ_DONE."""

    topic: str
    from_offset: int
    to_offset: int
    max_bytes: int

    def encode(self) -> bytes:
        return (BodyWriter().string(self.topic).u64(self.from_offset).u64(self.to_offset).u32(self.max_bytes)
                .done())

    @classmethod
    def decode(cls, body: memoryview | bytes) -> Read:
        r = BodyReader(body, "READ")
        got = cls(r.string("topic"), r.u64("from_offset"), r.u64("to_offset"), r.u32("max_bytes"))
        r.end()
        return got


UP_TO = 0x01  # ACKNOWLEDGE's flag: its up_to field holds a cumulative ack


@dataclass(frozen=True)
class Acknowledge:
    up_to: int | None
    offsets: list[int]
    nacks: list[int]
    nack_delay_ms: int

    @property
    def flags(self) -> int:
        return UP_TO if self.up_to is not None else 0

    def encode(self) -> bytes:
        return (BodyWriter().u64(self.up_to or 0).u64_list(self.offsets).u64_list(self.nacks)
                .u32(self.nack_delay_ms).done())

    @classmethod
    def decode(cls, body: memoryview | bytes, flags: int) -> Acknowledge:
        if flags & ~UP_TO:
            raise FrameError(f"ACKNOWLEDGE: flags 0x{flags:02x} set bits other than up_to's")
        r = BodyReader(body, "ACKNOWLEDGE")
        up_to = r.u64("up_to")
        ack = cls(up_to if flags & UP_TO else None, r.u64_list("offsets", MAX_ACK_OFFSETS),
                  r.u64_list("nacks", MAX_ACK_OFFSETS), r.u32("nack_delay_ms"))
        r.end()
        return ack


def string_body(value: str) -> bytes:
    """The body of a LOOKUP or an OFFSETS (a topic) and of a LOCATED (an address)."""
    return BodyWriter().string(value).done()


def decode_string(body: memoryview | bytes, what: str, field: str) -> str:
    r = BodyReader(body, what)
    value = r.string(field)
    r.end()
    return value

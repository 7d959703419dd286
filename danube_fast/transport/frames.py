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

_U8, _U16, _U32, _U64 = (struct.Struct(f) for f in ("<B", "<H", "<I", "<Q"))


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

    def string(self, value: str) -> BodyWriter:
        data = value.encode()
        if len(data) > 0xFFFF:
            raise ValueError(f"a string of {len(data)} bytes: at most 65535")
        self._parts += _U16.pack(len(data)) + data
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

    def string(self, field: str) -> str:
        data = self._take(self.u16(field), field)
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError as e:
            raise FrameError(f"{self._what}: {field} is not UTF-8 ({e.reason} at byte {e.start})") from None

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

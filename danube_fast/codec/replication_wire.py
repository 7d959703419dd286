"""A replication fetch's answer (proto/Replication.proto `FetchResponse`) written and read without the
protobuf runtime, so that the records it carries are copied once on the owner (joined after the framing)
and not at all on the follower (its WAL appends from a view into the message grpc handed over).

Hand-written because every byte a follower copies crosses here: the protobuf runtime copies a bytes field
when the message is built, again when it is serialised, and on the reading side when it parses and on
every access of the field (fast_wire.py says the same of the fast API's Records), and a profile of a
factor-2 topic's owner (docs/REPLICATION.md, "Not yet") found it spending about 2 ms of CPU per MB more
than a factor-1 owner.

Written: the canonical protobuf encoding (fields in number order, defaults left out). Read: the five
fields in any order, each at most once, varints of any padding; any other message (an unknown field, a
field twice) goes to the protobuf parser, so what is accepted and what it means are protobuf's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from danube_fast.codec.fast_wire import LENGTH_DELIMITED, VARINT, Buffer, field_key, read_varint, varint
from danube_fast.proto import Replication_pb2 as pb

_DATA = field_key(pb.FetchResponse, "data", LENGTH_DELIMITED)
_NEXT = field_key(pb.FetchResponse, "next_offset", VARINT)
_START = field_key(pb.FetchResponse, "start_offset", VARINT)
_UPLOADED = field_key(pb.FetchResponse, "uploaded_through", VARINT)
_RESET = field_key(pb.FetchResponse, "reset", VARINT)
_UINT64 = 1 << 64


@dataclass(frozen=True, slots=True)
class FetchParts:
    """A FetchResponse as the owner makes it: its records as the log's buffers, not joined (the gRPC
    service joins them in `encode`; the native transport writes them to the socket as they are)."""

    chunks: Sequence[Buffer]
    next_offset: int
    start_offset: int
    uploaded_through: int
    reset: bool = False

    @property
    def nbytes(self) -> int:
        """The records' bytes."""
        return sum(memoryview(c).nbytes for c in self.chunks)

    def encode(self) -> bytes:
        return encode_fetch_response(self.chunks, self.next_offset, self.start_offset, self.uploaded_through,
                                     self.reset)


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    """A FetchResponse as the follower reads it: `data` is a view into the message's bytes."""

    data: memoryview
    next_offset: int
    start_offset: int
    uploaded_through: int
    reset: bool

    @classmethod
    def FromString(cls, raw: bytes) -> FetchAnswer:
        return decode_fetch_response(raw)

    def SerializeToString(self, deterministic: bool = False) -> bytes:
        return encode_fetch_response([self.data], self.next_offset, self.start_offset, self.uploaded_through,
                                     self.reset)


def encode_fetch_response(chunks: Sequence[Buffer], next_offset: int, start_offset: int,
                          uploaded_through: int, reset: bool = False) -> bytes:
    """The wire bytes of `FetchResponse(data=b"".join(chunks), ...)`, the chunks copied once."""
    size = sum(memoryview(c).nbytes for c in chunks)
    head = bytes((_DATA,)) + varint(size) if size else b""
    tail = b"".join(bytes((tag,)) + varint(value) for tag, value in (
        (_NEXT, next_offset), (_START, start_offset), (_UPLOADED, uploaded_through), (_RESET, int(reset)))
        if value)
    return b"".join((head, *chunks, tail))


def _int64(value: int) -> int:
    value &= _UINT64 - 1
    return value - _UINT64 if value >= 1 << 63 else value


def decode_fetch_response(raw: bytes) -> FetchAnswer:
    """`raw` read as above; the data not copied."""
    view = memoryview(raw)
    end = len(raw)
    at = 0
    data: memoryview | None = None
    ints: dict[int, int] = {}
    while at < end:
        tag = raw[at]
        value, after = read_varint(raw, at + 1, end)
        if after < 0 or tag >= 0x80:
            return _parsed(raw)
        if tag == _DATA and data is None and after + value <= end:
            data = view[after:after + value]
            at = after + value
        elif tag in (_NEXT, _START, _UPLOADED, _RESET) and tag not in ints:
            ints[tag] = value
            at = after
        else:
            return _parsed(raw)
    return FetchAnswer(data if data is not None else view[0:0], _int64(ints.get(_NEXT, 0)),
                       _int64(ints.get(_START, 0)), _int64(ints.get(_UPLOADED, 0)), bool(ints.get(_RESET, 0)))


def _parsed(raw: bytes) -> FetchAnswer:
    m = pb.FetchResponse.FromString(raw)
    return FetchAnswer(memoryview(m.data), m.next_offset, m.start_offset, m.uploaded_through, m.reset)

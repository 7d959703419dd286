"""The fast API's bulk messages written and read without the protobuf runtime: a producer's Batch request
(FastApi.proto: `ProduceRequest{batch: Batch{seq, data}}`) and the Records a consumer or a reader gets
(`ConsumeResponse{records: Records{data, first_offset, last_offset}}`, `ReadResponse{records: ...}`), so
that their record batches are copied at most once on the writing side and not at all on the reading side,
instead of twice on each.

Hand-written because it is the hot path of large records: the protobuf runtime copies a bytes field into its
arena when it parses a message and again on every access of the field, and once when the field is set and
once when the message is serialised. Here the writer joins a few header bytes and the data (one copy), or,
when the data sits in a buffer with RECORDS_ROOM free bytes in front of it (a WAL read leaves them), writes
the framing into those bytes and copies nothing: the offsets then come before the data and the varints are
padded to a fixed width, which protobuf reads as it reads the canonical form. The reader takes the data as a
memoryview into the message grpc handed over (no copy).

Read this way: Records whose fields each come at most once, in any order, and a Batch request in canonical
form. Anything else, including every other message of the two streams, goes to the protobuf parser, so the
set of accepted messages and their meaning are exactly protobuf's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from danube_fast.codec import frames
from danube_fast.proto import FastApi_pb2 as fast

Buffer = bytes | bytearray | memoryview

VARINT, LENGTH_DELIMITED = 0, 2  # protobuf wire types


def field_key(message: Any, field: str, wire_type: int) -> int:
    """A field's one-byte key (field number and wire type) from the generated descriptor."""
    number = int(message.DESCRIPTOR.fields_by_name[field].number)
    if number >= 16:
        raise ValueError(f"{message.DESCRIPTOR.name}.{field}: a one-byte key needs a field number below 16")
    return number << 3 | wire_type


_BATCH = field_key(fast.ProduceRequest, "batch", LENGTH_DELIMITED)
_BATCH_DATA = field_key(fast.Batch, "data", LENGTH_DELIMITED)
_SEQ = field_key(fast.Batch, "seq", VARINT)
_RECORDS = field_key(fast.ConsumeResponse, "records", LENGTH_DELIMITED)
_READ_RECORDS = field_key(fast.ReadResponse, "records", LENGTH_DELIMITED)
_DATA = field_key(fast.Records, "data", LENGTH_DELIMITED)
_FIRST = field_key(fast.Records, "first_offset", VARINT)
_LAST = field_key(fast.Records, "last_offset", VARINT)
_LENGTH_WIDTH, _OFFSET_WIDTH = 5, 10  # padded varints: a length below 2**35, any uint64
# The framing written in front of the data: outer tag and length, first_offset, last_offset, data tag, length.
RECORDS_ROOM = 1 + _LENGTH_WIDTH + 2 * (1 + _OFFSET_WIDTH) + 1 + _LENGTH_WIDTH
# ... and in front of a producer's batch: outer tag and length, seq, data tag and length.
PRODUCE_ROOM = 1 + _LENGTH_WIDTH + 1 + _OFFSET_WIDTH + 1 + _LENGTH_WIDTH


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """A ProduceRequest holding a Batch, read by `decode_produce_request`: `data` is a view into the
    request's bytes."""

    seq: int
    data: memoryview


def varint(value: int) -> bytes:
    """An integer field as protobuf writes it (a negative int64 as its 10-byte two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_batch_request(seq: int, data: Buffer) -> bytes:
    """The wire bytes of `ProduceRequest(batch=Batch(seq=seq, data=data))`: written into the PRODUCE_ROOM
    bytes in front of `data` when it has them (frames.encode_payloads(room=...)), with padded varints, and
    the batch not copied; else as protobuf writes them."""
    view = memoryview(data)
    size = view.nbytes
    obj = view.obj
    if type(obj) is bytes and len(obj) == size + PRODUCE_ROOM:  # maybe room in front: fill_room checks
        head = b"".join((_BATCH.to_bytes(1, "little"), _padded(PRODUCE_ROOM - 1 - _LENGTH_WIDTH + size,
                                                                  _LENGTH_WIDTH),
                         _SEQ.to_bytes(1, "little"), _padded(seq, _OFFSET_WIDTH),
                         _BATCH_DATA.to_bytes(1, "little"), _padded(size, _LENGTH_WIDTH)))
        framed = frames.fill_room(view, head)
        if framed is not None:
            return framed
    inner = (_SEQ.to_bytes(1, "little") + varint(seq) if seq else b"") + \
        _BATCH_DATA.to_bytes(1, "little") + varint(size)
    return b"".join((_BATCH.to_bytes(1, "little"), varint(len(inner) + size), inner, data))


def serialize_request(request: Any) -> bytes:
    """A serializer for the two streams: bytes from the encoders here as they are, messages through
    protobuf."""
    if isinstance(request, bytes):
        return request
    data: bytes = request.SerializeToString()
    return data


@dataclass(frozen=True, slots=True)
class RecordsResponse:
    """A ConsumeResponse holding Records, read by `decode_consume_response`: `data` is a view into the
    response's bytes."""

    data: memoryview
    first_offset: int
    last_offset: int


def encode_records_response(data: Buffer, first_offset: int, last_offset: int) -> bytes:
    """The wire bytes of `ConsumeResponse(records=Records(data, first_offset, last_offset))`, as protobuf
    writes them."""
    return _encode_records(_RECORDS, data, first_offset, last_offset)


def encode_read_response(data: Buffer, first_offset: int, last_offset: int) -> bytes:
    """The wire bytes of `ReadResponse(records=Records(data, first_offset, last_offset))`."""
    return _encode_records(_READ_RECORDS, data, first_offset, last_offset)


def records_data(chunks: Sequence[Buffer]) -> Buffer:
    """Chunks of batches as the data of one Records response: the only one as it is (a WAL read: room in
    front, else the encoder copies it once), several joined after RECORDS_ROOM free bytes (one copy; the
    framing then goes into the room)."""
    return chunks[0] if len(chunks) == 1 else frames.join_after_room(chunks, RECORDS_ROOM)


def _encode_records(outer: int, data: Buffer, first_offset: int, last_offset: int) -> bytes:
    view = memoryview(data)
    size = view.nbytes
    obj = view.obj
    if type(obj) is bytes and len(obj) == size + RECORDS_ROOM:  # maybe room in front: fill_room checks
        inner = RECORDS_ROOM - 1 - _LENGTH_WIDTH + size
        head = b"".join((outer.to_bytes(1, "little"), _padded(inner, _LENGTH_WIDTH),
                         _FIRST.to_bytes(1, "little"), _padded(first_offset, _OFFSET_WIDTH),
                         _LAST.to_bytes(1, "little"), _padded(last_offset, _OFFSET_WIDTH),
                         _DATA.to_bytes(1, "little"), _padded(size, _LENGTH_WIDTH)))
        framed = frames.fill_room(view, head)
        if framed is not None:
            return framed
    head = (_DATA.to_bytes(1, "little") + varint(size)) if size else b""
    tail = (_FIRST.to_bytes(1, "little") + varint(first_offset) if first_offset else b"") + \
        (_LAST.to_bytes(1, "little") + varint(last_offset) if last_offset else b"")
    inner = len(head) + size + len(tail)
    return b"".join((outer.to_bytes(1, "little"), varint(inner), head, data, tail))


def _padded(value: int, width: int) -> bytes:
    """`value` as a varint of exactly `width` bytes: groups of zeros carry continuation bits (protobuf reads
    a varint of up to 10 bytes whatever its padding)."""
    out = bytearray(width)
    for i in range(width - 1):
        out[i] = (value & 0x7F) | 0x80
        value >>= 7
    if value > 0x7F:
        raise ValueError(f"does not fit a {width}-byte varint")
    out[width - 1] = value
    return bytes(out)


def read_varint(raw: bytes, at: int, end: int) -> tuple[int, int]:
    """(value, next position); -1 as the position when the varint is torn or longer than 10 bytes."""
    value = shift = 0
    while at < end and shift < 70:
        byte = raw[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    return 0, -1


def decode_consume_response(raw: bytes) -> RecordsResponse | fast.ConsumeResponse:
    """A Records response as a RecordsResponse without copying its data; any other message through
    protobuf."""
    found = _records(raw, _RECORDS)
    if found is not None:
        return found
    response: fast.ConsumeResponse = fast.ConsumeResponse.FromString(raw)
    return response


def decode_read_response(raw: bytes) -> RecordsResponse | fast.ReadResponse:
    """A ReadResponse as a RecordsResponse without copying its data (any other encoding through protobuf)."""
    found = _records(raw, _READ_RECORDS)
    if found is not None:
        return found
    response: fast.ReadResponse = fast.ReadResponse.FromString(raw)
    return response


def _records(raw: bytes, outer: int) -> RecordsResponse | None:
    """`raw` as a RecordsResponse when it is Records in field `outer` with a data field and each field at most
    once (in any order, varints of any padding), else None."""
    end = len(raw)
    if end < 2 or raw[0] != outer:
        return None
    length, at = read_varint(raw, 1, end)
    if at <= 0 or at + length != end:
        return None
    start = stop = -1
    first = last = -1
    while at < end:
        tag = raw[at]
        value, after = read_varint(raw, at + 1, end)
        if after < 0:
            return None
        if tag == _DATA and start < 0 and after + value <= end:
            start, stop = after, after + value
            at = stop
        elif tag == _FIRST and first < 0 and value < 1 << 64:
            first, at = value, after
        elif tag == _LAST and last < 0 and value < 1 << 64:
            last, at = value, after
        else:
            return None
    if start < 0:
        return None
    return RecordsResponse(memoryview(raw)[start:stop], max(first, 0), max(last, 0))


def decode_produce_request(raw: bytes) -> BatchRequest | fast.ProduceRequest:
    """A Batch request as a BatchRequest without copying its data; any other message through protobuf."""
    end = len(raw)
    if end >= 2 and raw[0] == _BATCH:
        length, at = read_varint(raw, 1, end)
        if at > 0 and at + length == end:
            seq = 0
            if at < end and raw[at] == _SEQ:
                seq, at = read_varint(raw, at + 1, end)
            if 0 < at < end and raw[at] == _BATCH_DATA and seq < 1 << 64:
                size, start = read_varint(raw, at + 1, end)
                if start > 0 and start + size == end:
                    return BatchRequest(seq, memoryview(raw)[start:end])
    request: fast.ProduceRequest = fast.ProduceRequest.FromString(raw)
    return request

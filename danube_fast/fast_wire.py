"""The fast API's bulk messages written and read without the protobuf runtime: a producer's Batch request
(FastApi.proto: `ProduceRequest{batch: Batch{seq, data}}`) and the Records a consumer or a reader gets
(`ConsumeResponse{records: Records{data, first_offset, last_offset}}`, `ReadResponse{records: ...}`), so
that their record batches are copied once on the writing side and not at all on the reading side, instead
of twice on each.

Hand-written because it is the hot path of large records: the protobuf runtime copies a bytes field into its
arena when it parses a message and again on every access of the field, and once when the field is set and
once when the message is serialised. Here the writer joins a few header bytes and the data (one copy), and
the reader takes the data as a memoryview into the message grpc handed over (no copy).

Only the canonical form (fields in number order, each at most once, lengths exact) is read this way.
Anything else, including every other message of the two streams, goes to the protobuf parser, so the set of
accepted messages and their meaning are exactly protobuf's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from danube_fast.proto import FastApi_pb2 as fast

Buffer = bytes | bytearray | memoryview

_BATCH = 0x12  # field 2, length-delimited: ProduceRequest.batch, and Batch.data
_SEQ = 0x08  # field 1, varint: Batch.seq
_RECORDS = 0x12  # field 2, length-delimited: ConsumeResponse.records
_READ_RECORDS = 0x0A  # field 1, length-delimited: ReadResponse.records
_DATA = 0x0A  # field 1, length-delimited: Records.data
_FIRST = 0x10  # field 2, varint: Records.first_offset
_LAST = 0x18  # field 3, varint: Records.last_offset


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """A ProduceRequest holding a Batch, read by `decode_produce_request`: `data` is a view into the
    request's bytes."""

    seq: int
    data: memoryview


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_batch_request(seq: int, data: bytes) -> bytes:
    """The wire bytes of `ProduceRequest(batch=Batch(seq=seq, data=data))`, as protobuf writes them."""
    inner = (_SEQ.to_bytes(1, "little") + _varint(seq) if seq else b"") + \
        _BATCH.to_bytes(1, "little") + _varint(len(data))
    return b"".join((_BATCH.to_bytes(1, "little"), _varint(len(inner) + len(data)), inner, data))


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


def _encode_records(outer: int, data: Buffer, first_offset: int, last_offset: int) -> bytes:
    size = memoryview(data).nbytes
    head = (_DATA.to_bytes(1, "little") + _varint(size)) if size else b""
    tail = (_FIRST.to_bytes(1, "little") + _varint(first_offset) if first_offset else b"") + \
        (_LAST.to_bytes(1, "little") + _varint(last_offset) if last_offset else b"")
    inner = len(head) + size + len(tail)
    return b"".join((outer.to_bytes(1, "little"), _varint(inner), head, data, tail))


def _read_varint(raw: bytes, at: int, end: int) -> tuple[int, int]:
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
    """`raw` as a RecordsResponse when it is the canonical encoding of Records in field `outer`, else None."""
    end = len(raw)
    if end >= 2 and raw[0] == outer:
        length, at = _read_varint(raw, 1, end)
        if at > 0 and at + length == end and at < end and raw[at] == _DATA:
            size, start = _read_varint(raw, at + 1, end)
            stop = start + size
            if start > 0 and stop <= end:
                first = last = 0
                at = stop
                if at < end and raw[at] == _FIRST:
                    first, at = _read_varint(raw, at + 1, end)
                if 0 < at < end and raw[at] == _LAST:
                    last, at = _read_varint(raw, at + 1, end)
                if at == end and first < 1 << 64 and last < 1 << 64:
                    return RecordsResponse(memoryview(raw)[start:stop], first, last)
    return None


def decode_produce_request(raw: bytes) -> BatchRequest | fast.ProduceRequest:
    """A Batch request as a BatchRequest without copying its data; any other message through protobuf."""
    end = len(raw)
    if end >= 2 and raw[0] == _BATCH:
        length, at = _read_varint(raw, 1, end)
        if at > 0 and at + length == end:
            seq = 0
            if at < end and raw[at] == _SEQ:
                seq, at = _read_varint(raw, at + 1, end)
            if 0 < at < end and raw[at] == _BATCH and seq < 1 << 64:
                size, start = _read_varint(raw, at + 1, end)
                if start > 0 and start + size == end:
                    return BatchRequest(seq, memoryview(raw)[start:end])
    request: fast.ProduceRequest = fast.ProduceRequest.FromString(raw)
    return request

"""The fast API's Batch requests (FastApi.proto: `ProduceRequest{batch: Batch{seq, data}}`) written and read
without the protobuf runtime, so that a batch's bytes are copied once on each side instead of three times.

Hand-written because it is the hot path of large records (docs/WIRE.md, "The fast API"): the protobuf
runtime copies `data` into its arena when it parses a request and again on every access of the field, and
on the client once when the field is set and once when the message is serialised. Here the client joins a
few header bytes and the data (one copy), and the broker takes `data` as a memoryview into the message grpc
handed over (no copy).

Only the canonical form is read this way: field 2 (batch) holding field 1 (seq, a varint) then field 2
(data), each at most once, lengths exact. Anything else, including every Open request, goes to the protobuf
parser, so the set of accepted messages and their meaning are exactly protobuf's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from danube_fast.proto import FastApi_pb2 as fast

_BATCH = 0x12  # field 2, length-delimited: ProduceRequest.batch, and Batch.data
_SEQ = 0x08  # field 1, varint: Batch.seq


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
    """The Produce stream's request serializer: bytes from encode_batch_request as they are, messages
    through protobuf."""
    if isinstance(request, bytes):
        return request
    data: bytes = request.SerializeToString()
    return data


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

"""danube_fast/codec/replication_wire.py against the protobuf runtime: the FetchResponse bytes it writes are
protobuf's, and whatever it reads means what protobuf says it means, malformed input failing as protobuf
fails."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_fast.codec.replication_wire import FetchAnswer, decode_fetch_response, encode_fetch_response
from danube_fast.proto import Replication_pb2 as pb

INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)


def fields(m: pb.FetchResponse | FetchAnswer) -> tuple[bytes, int, int, int, bool]:
    return bytes(m.data), m.next_offset, m.start_offset, m.uploaded_through, m.reset


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(max_size=300), max_size=4), next_offset=INT64, start_offset=INT64,
       uploaded=INT64, reset=st.booleans())
def test_written_as_protobuf_writes_it_and_read_back(chunks: list[bytes], next_offset: int, start_offset: int,
                                                    uploaded: int, reset: bool) -> None:
    raw = encode_fetch_response(chunks, next_offset, start_offset, uploaded, reset)
    expected = pb.FetchResponse(data=b"".join(chunks), next_offset=next_offset, start_offset=start_offset,
                                uploaded_through=uploaded, reset=reset)
    assert raw == expected.SerializeToString()
    assert fields(decode_fetch_response(raw)) == fields(expected)


def test_the_data_is_a_view_into_the_message_not_a_copy() -> None:
    raw = encode_fetch_response([b"abc", b"def"], 6, 0, -1)
    got = decode_fetch_response(raw)
    assert got.data.obj is raw and bytes(got.data) == b"abcdef" and got.uploaded_through == -1


@pytest.mark.parametrize("raw", [
    # fields out of order, a field twice (protobuf keeps the last), an unknown field, padded varints
    bytes([0x10, 0x05, 0x0A, 0x02]) + b"xy",
    bytes([0x10, 0x05, 0x10, 0x07, 0x0A, 0x01]) + b"z",
    bytes([0x0A, 0x01]) + b"a" + bytes([0x0A, 0x01]) + b"b",
    bytes([0x0A, 0x01]) + b"a" + bytes([0x30, 0x01]),
    bytes([0x10, 0x85, 0x80, 0x00]),
    b"",
])
def test_any_other_encoding_means_what_protobuf_says(raw: bytes) -> None:
    assert fields(decode_fetch_response(raw)) == fields(pb.FetchResponse.FromString(raw))


@pytest.mark.parametrize("raw", [
    bytes([0x0A, 0x05]) + b"ab",  # data longer than the message
    bytes([0x10, 0x80]),  # a torn varint
    bytes([0x0B]),  # a wire type protobuf does not know here
])
def test_malformed_fails_as_protobuf_fails(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        pb.FetchResponse.FromString(raw)
    with pytest.raises(DecodeError):
        decode_fetch_response(raw)

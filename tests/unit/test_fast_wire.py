"""danube_fast/codec/fast_wire.py against the protobuf runtime: the bytes it writes are protobuf's, and every
input it reads (canonical Batch requests through its own path, anything else through protobuf) means what
protobuf says it means, malformed ones failing as protobuf fails."""

from __future__ import annotations

import random
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_fast.codec import frames
from danube_fast.codec.fast_wire import (
    PRODUCE_ROOM,
    RECORDS_ROOM,
    BatchRequest,
    RecordsResponse,
    decode_consume_response,
    decode_produce_request,
    decode_read_response,
    encode_batch_request,
    encode_read_response,
    encode_records_response,
    serialize_request,
)
from danube_fast.proto import FastApi_pb2 as fast


def protobuf_batch(seq: int, data: bytes) -> bytes:
    request = fast.ProduceRequest()
    request.batch.seq = seq
    request.batch.data = data
    out: bytes = request.SerializeToString()
    return out


def meaning(decoded: object) -> tuple[str, int, bytes] | fast.ProduceRequest:
    """What a decoded request says, in one comparable form."""
    if isinstance(decoded, BatchRequest):
        return ("batch", decoded.seq, bytes(decoded.data))
    assert isinstance(decoded, fast.ProduceRequest)
    if decoded.WhichOneof("kind") == "batch":
        return ("batch", decoded.batch.seq, decoded.batch.data)
    return decoded


# Large payloads are a short random pattern repeated: drawn whole, 20 KB exceeds Hypothesis's entropy budget
# often enough to fail its health check.
_LARGE = st.builds(lambda seed, n: (seed * (n // len(seed) + 1))[:n], st.binary(min_size=1, max_size=64),
                   st.integers(20_000, 20_010))


@settings(max_examples=150, deadline=None)
@given(seq=st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1)),
       data=st.one_of(st.binary(max_size=300), _LARGE))
def test_encoding_is_protobufs_and_reads_back_without_a_copy(seq: int, data: bytes) -> None:
    raw = encode_batch_request(seq, data)
    if data:  # protobuf leaves an empty data field out; ours writes it, which parses the same
        assert raw == protobuf_batch(seq, data)
    assert meaning(fast.ProduceRequest.FromString(raw)) == ("batch", seq, data)
    decoded = decode_produce_request(raw)
    assert meaning(decoded) == ("batch", seq, data)
    if data:
        assert isinstance(decoded, BatchRequest) and decoded.data.obj is raw  # a view, not a copy


def test_other_requests_and_other_encodings_go_to_protobuf() -> None:
    open_request = fast.ProduceRequest(open=fast.Open(topic="/default/t", producer_name="p", reliable=True))
    assert decode_produce_request(open_request.SerializeToString()) == open_request
    batch = fast.Batch(seq=7, data=b"abc").SerializeToString()
    reordered = b"\x12" + bytes([len(batch)]) + b"\x12\x03abc\x08\x07"  # data before seq
    duplicated = protobuf_batch(7, b"abc") + protobuf_batch(8, b"xyz")  # two batch fields: merged
    unknown = b"\x12" + bytes([len(batch) + 2]) + batch + b"\x18\x01"  # an unknown field 3 in Batch
    for raw in (reordered, duplicated, unknown):
        decoded = decode_produce_request(raw)
        assert isinstance(decoded, fast.ProduceRequest), raw.hex()
        assert decoded == fast.ProduceRequest.FromString(raw)


def test_malformed_requests_fail_as_protobuf_fails() -> None:
    cases = broken_copies(encode_batch_request(5, b"x" * 100), random.Random(1))
    cases += [b"\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x12\x02\x08\x80"]
    assert_read_as_protobuf(cases, fast.ProduceRequest.FromString, decode_produce_request, meaning)


def broken_copies(good: bytes, rng: random.Random) -> list[bytes]:
    """Every truncation of `good`, and 40 copies with one byte changed."""
    cases = [good[:cut] for cut in range(1, len(good))]
    cases += [bytes(b ^ rng.randint(1, 255) if i == pos else b for i, b in enumerate(good))
              for pos in rng.sample(range(len(good)), 40)]
    return cases


def assert_read_as_protobuf(cases: list[bytes], parse: Any, decode: Any, say: Any) -> None:
    """`decode` means what protobuf's `parse` means for each case, and fails where it fails."""
    for raw in cases:
        outcomes = []
        for read in (parse, decode):
            try:
                outcomes.append(say(read(raw)))
            except DecodeError:
                outcomes.append(DecodeError)
        assert outcomes[1] == outcomes[0], raw.hex()


def test_the_serializer_passes_bytes_and_serializes_messages() -> None:
    raw = encode_batch_request(1, b"data")
    assert serialize_request(raw) is raw
    request = fast.ProduceRequest(open=fast.Open(topic="/default/t", producer_name="p"))
    assert serialize_request(request) == request.SerializeToString()
    with pytest.raises(AttributeError):
        serialize_request(object())


def records_meaning(decoded: object) -> object:
    if isinstance(decoded, RecordsResponse):
        return ("records", bytes(decoded.data), decoded.first_offset, decoded.last_offset)
    assert isinstance(decoded, (fast.ConsumeResponse, fast.ReadResponse))
    if isinstance(decoded, fast.ReadResponse) or decoded.WhichOneof("kind") == "records":
        r = decoded.records
        return ("records", r.data, r.first_offset, r.last_offset)
    return decoded


# (encoder, decoder, message type) of the two responses that carry Records: a consumer's and a reader's.
RESPONSES = [(encode_records_response, decode_consume_response, fast.ConsumeResponse),
             (encode_read_response, decode_read_response, fast.ReadResponse)]


@settings(max_examples=100, deadline=None)
@given(data=st.one_of(st.binary(max_size=300), _LARGE),
       first=st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1)),
       last=st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1)))
def test_records_encoding_is_protobufs_and_reads_back_without_a_copy(data: bytes, first: int, last: int
                                                                     ) -> None:
    for encode, decode, message in RESPONSES:
        raw = encode(data, first, last)
        expected = message()
        expected.records.data = data
        expected.records.first_offset = first
        expected.records.last_offset = last
        assert raw == expected.SerializeToString()
        assert encode(memoryview(data), first, last) == raw
        decoded = decode(raw)
        assert records_meaning(decoded) == ("records", data, first, last)
        if data:
            assert isinstance(decoded, RecordsResponse) and decoded.data.obj is raw  # a view, not a copy


def test_other_responses_and_malformed_ones_are_protobufs() -> None:
    subscribed = fast.ConsumeResponse(subscribed=fast.Subscribed(consumer_id=3, start_offset=9))
    assert decode_consume_response(subscribed.SerializeToString()) == subscribed
    for encode, decode, message in RESPONSES:
        good = encode(b"y" * 100, 5, 104)
        cases = broken_copies(good, random.Random(2))
        cases.append(good[:-4] + b"\x20\x01" + good[-4:])  # an unknown field between data and the offsets
        cases.append(encode_records_response(b"z", 1, 1) if message is fast.ReadResponse
                     else encode_read_response(b"z", 1, 1))  # the other message's field number
        assert_read_as_protobuf(cases, message.FromString, decode, records_meaning)


# ----------------------------------------------------------------------------------------------------------
# Records framed in the room a WAL read leaves in front of its batches (frames.fill_room)

NATIVE = frames.IMPL == "native"


@settings(max_examples=100, deadline=None)
@given(data=st.one_of(st.binary(min_size=1, max_size=300), _LARGE),
       first=st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1)),
       last=st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1)))
def test_records_framed_in_the_room_in_front_are_protobufs_without_a_copy(data: bytes, first: int, last: int
                                                                          ) -> None:
    for encode, decode, message in RESPONSES:
        view = frames.join_after_room([data[:1], data[1:]], RECORDS_ROOM)
        raw = encode(view, first, last)
        if NATIVE:
            assert raw is view.obj  # the framing went into the room: nothing copied
            assert len(raw) == RECORDS_ROOM + len(data)
        assert bytes(view) == data  # the data itself is never written
        expected = ("records", data, first, last)
        assert records_meaning(message.FromString(raw)) == expected
        decoded = decode(raw)
        assert records_meaning(decoded) == expected
        assert isinstance(decoded, RecordsResponse) and decoded.data.obj is raw


def test_data_without_exactly_the_room_is_joined_behind_canonical_framing() -> None:
    data = b"batches" * 50
    cases = [
        frames.join_after_room([data], RECORDS_ROOM - 1),  # too little room
        frames.join_after_room([data], RECORDS_ROOM + 1),  # room of another size
        frames.join_after_room([data + b"tail"], RECORDS_ROOM)[:len(data)],  # not to the end of the object
        memoryview(bytearray(RECORDS_ROOM) + data)[RECORDS_ROOM:],  # not a bytes object: never written
        memoryview(bytes(RECORDS_ROOM) + data),  # the whole object: no room in front
    ]
    for view in cases:
        before = bytes(view.obj)
        records = fast.Records(data=bytes(view), first_offset=9, last_offset=20)
        expected = fast.ConsumeResponse(records=records)
        raw = encode_records_response(view, 9, 20)
        assert raw == expected.SerializeToString() and raw is not view.obj
        assert bytes(view.obj) == before
    strided = memoryview(bytes(RECORDS_ROOM) + data * 2)[RECORDS_ROOM::2]
    assert frames.fill_room(strided, b"x" * RECORDS_ROOM) is None


def test_fill_room_writes_the_room_only_when_the_view_covers_the_rest() -> None:
    view = frames.join_after_room([b"abc", b"", b"def"], 4)
    assert bytes(view) == b"abcdef" and view.obj == bytes(4) + b"abcdef"
    filled = frames.fill_room(view, b"HEAD")
    if NATIVE:
        assert filled is view.obj and filled == b"HEADabcdef"
    else:  # the pure codec cannot write into bytes: callers join instead
        assert filled is None
    assert frames.fill_room(view, b"HEADS") is None and frames.fill_room(view, b"HEA") is None
    assert frames.fill_room(b"HEADabcdef", b"HEAD") is None  # bytes, not a view of them
    assert frames.fill_room(frames.join_after_room([], 4), b"HEAD") is None  # no data
    with pytest.raises(ValueError):
        frames.join_after_room([b"x"], -1)


def test_records_fields_in_another_order_or_padding_read_without_a_copy_duplicates_through_protobuf() -> None:
    inner = b"\x18\x05\x10\x82\x80\x00\x0a\x02hi"  # last, then first (a padded 2), then data
    raw = b"\x12" + bytes([len(inner)]) + inner
    decoded = decode_consume_response(raw)
    assert isinstance(decoded, RecordsResponse) and decoded.data.obj is raw
    assert records_meaning(decoded) == records_meaning(fast.ConsumeResponse.FromString(raw)) == \
        ("records", b"hi", 2, 5)
    for twice in (inner + b"\x10\x03", inner + b"\x0a\x01x"):  # a field again: protobuf's last-one-wins
        raw = b"\x12" + bytes([len(twice)]) + twice
        decoded = decode_consume_response(raw)
        assert isinstance(decoded, fast.ConsumeResponse)
        assert decoded == fast.ConsumeResponse.FromString(raw)


@settings(max_examples=100, deadline=None)
@given(seq=st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1)),
       data=st.one_of(st.binary(min_size=1, max_size=300), _LARGE))
def test_a_batch_request_framed_in_the_room_is_protobufs_and_reframed_for_a_resend(seq: int, data: bytes
                                                                                   ) -> None:
    view = frames.join_after_room([data], PRODUCE_ROOM)
    for again in (seq, (seq + 1) % 2**64):  # a resend on a new stream frames the same batch anew
        raw = encode_batch_request(again, view)
        if NATIVE:
            assert raw is view.obj and len(raw) == PRODUCE_ROOM + len(data)
        assert bytes(view) == data
        assert meaning(fast.ProduceRequest.FromString(raw)) == ("batch", again, data)
        decoded = decode_produce_request(raw)
        assert meaning(decoded) == ("batch", again, data)
        assert isinstance(decoded, BatchRequest) and decoded.data.obj is raw


def test_a_batch_without_exactly_the_room_is_joined_as_protobuf_writes_it() -> None:
    data = b"batch" * 30
    for view in (frames.join_after_room([data], PRODUCE_ROOM + 1), memoryview(bytes(PRODUCE_ROOM) + data),
                 frames.join_after_room([data + b"x"], PRODUCE_ROOM)[:-1]):
        raw = encode_batch_request(5, view)
        assert raw == protobuf_batch(5, bytes(view)) and raw is not view.obj

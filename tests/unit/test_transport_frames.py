"""The native transport's frame layer (danube_fast/transport/frames.py, docs/TRANSPORT.md): headers and
bodies round trip, the decoder reassembles frames from any split of the bytes, and every bad input is a
FrameError that names it, refused before a body is buffered."""

from __future__ import annotations

import pytest

from danube_fast.transport import frames as f

FRAMES = [
    f.frame(f.FrameType.HELLO, f.Hello(1, 1, f.DEFAULT_MAX_FRAME, "a.jwt.token", "cli-1").encode(), 1),
    f.frame(f.FrameType.WELCOME, f.Welcome(1, 1 << 20, 42, 10_000, 64 << 20).encode(), 1),
    f.frame(f.FrameType.PING, f.ping_body(7), 0),
    f.frame(f.FrameType.ERROR, f.Error("UNAVAILABLE", True, "the broker is stopping: ünïcode").encode(), 9),
    f.frame(f.FrameType.PRODUCE, b"\x02\x00\x00\x00" + b"batches" * 100, 2**64 - 1, flags=0),
    f.frame(f.FrameType.GOODBYE, f.Goodbye("UNAVAILABLE", "stopping").encode(), 0),
]


def test_frames_round_trip_whatever_the_split() -> None:
    stream = b"".join(FRAMES)
    for step in (1, 3, 16, 17, 1000, len(stream)):
        decoder = f.FrameDecoder()
        got: list[f.Frame] = []
        for at in range(0, len(stream), step):
            got += decoder.feed(stream[at:at + step])
        assert [g.type for g in got] == [f.FrameType.HELLO, f.FrameType.WELCOME, f.FrameType.PING,
                                         f.FrameType.ERROR, f.FrameType.PRODUCE, f.FrameType.GOODBYE]
        assert [g.request_id for g in got] == [1, 1, 0, 9, 2**64 - 1, 0]
        assert decoder.buffered == 0
    hello = f.Hello.decode(got[0].body)
    assert hello == f.Hello(1, 1, f.DEFAULT_MAX_FRAME, "a.jwt.token", "cli-1")
    assert hello.agree(1 << 20) == (1, 1 << 20)
    assert f.Welcome.decode(got[1].body) == f.Welcome(1, 1 << 20, 42, 10_000, 64 << 20)
    assert f.decode_ping(got[2].body) == 7
    assert f.Error.decode(got[3].body) == f.Error("UNAVAILABLE", True, "the broker is stopping: ünïcode")
    assert bytes(got[4].body) == b"\x02\x00\x00\x00" + b"batches" * 100
    assert f.Goodbye.decode(got[5].body) == f.Goodbye("UNAVAILABLE", "stopping")


@pytest.mark.parametrize(("data", "words"), [
    (f.HEADER.pack(0xFFFF_FFFF, f.FrameType.PRODUCE, 0, 0, 1), "frame length 4294967295"),
    (f.HEADER.pack(11, f.FrameType.PING, 0, 0, 1), "frame length 11"),
    (f.HEADER.pack(20, f.FrameType.PING, 0, 7, 1), "reserved header field is 7"),
    (f.HEADER.pack(20, 0x7E, 0, 0, 1), "unknown frame type 0x7e"),
])
def test_a_bad_header_is_refused_before_its_body_is_buffered(data: bytes, words: str) -> None:
    decoder = f.FrameDecoder(max_frame=1 << 20)
    with pytest.raises(f.FrameError, match=words) as e:
        decoder.feed(data)  # only the 16 header bytes: the 4 GiB body is never waited for
    assert e.value.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize(("decode", "body", "words"), [
    (f.Hello.decode, b"XXXX" + b"\x00" * 12, "bad magic"),
    (f.Hello.decode, f.MAGIC + b"\x01\x00", "max_version needs 2 bytes"),
    (f.Hello.decode, f.Hello(2, 1, f.DEFAULT_MAX_FRAME, "", "").encode(), "min_version 2 is above"),
    (f.Hello.decode, f.Hello(1, 1, 100, "", "").encode(), "max_frame 100 is below"),
    (f.Hello.decode, f.Hello(1, 1, f.DEFAULT_MAX_FRAME, "", "c").encode() + b"!", "1 bytes after"),
    (f.Hello.decode, f.MAGIC + b"\x01\x00\x01\x00\x00\x00\x01\x00\x02\x00\xff\xfe\x00\x00", "not UTF-8"),
    (f.Error.decode, b"\x63\x00\x00\x00\x00", "unknown status code 99"),
    (f.Error.decode, b"\x0e\x00\x02\x00\x00", "retriable is 2"),
    (f.decode_ping, b"\x00" * 4, "nonce needs 8 bytes"),
])
def test_a_bad_body_names_its_frame_and_field(decode: object, body: bytes, words: str) -> None:
    with pytest.raises(f.FrameError, match=words):
        decode(body)  # type: ignore[operator]


def test_versions_must_meet() -> None:
    with pytest.raises(f.FrameError, match=r"versions 2\.\.3") as e:
        f.Hello(2, 3, f.DEFAULT_MAX_FRAME, "", "").agree()
    assert e.value.code == "FAILED_PRECONDITION"
    assert f.Hello(1, 5, 1 << 30, "", "").agree() == (1, f.DEFAULT_MAX_FRAME)


def test_a_long_string_is_refused_when_written() -> None:
    with pytest.raises(ValueError, match="65536 bytes"):
        f.BodyWriter().string("x" * 65536)


def test_the_fast_api_bodies_round_trip() -> None:
    opened = f.ProduceOpen("/default/orders", "p-1", True)
    assert f.ProduceOpen.decode(opened.encode()) == opened
    batches = b"\x01" * 300  # record batches are the codec's to check, not the frame layer's
    records, got = f.decode_produce(f.produce_head(7) + batches)
    assert (records, bytes(got)) == (7, batches)
    assert f.decode_offsets(f.offsets_body(10, 19), "ACK", "first_offset", "last_offset")[:2] == (10, 19)
    first, last, rest = f.decode_offsets(f.offsets_body(0, 9) + batches, "RECORDS", "first_offset",
                                         "last_offset", more=True)
    assert (first, last, bytes(rest)) == (0, 9, batches)
    sub = f.Subscribe("/default/orders", "billing", "c-1", 8 << 20, True)
    assert f.Subscribe.decode(sub.encode()) == sub
    for ack in (f.Acknowledge(41, [43, 45], [], 0), f.Acknowledge(None, [], [7], 250)):
        assert f.Acknowledge.decode(ack.encode(), ack.flags) == ack
    assert f.decode_string(f.string_body("10.0.0.7:6651"), "LOCATED", "address") == "10.0.0.7:6651"
    read = f.Read("/default/orders", 120, 0, 1 << 20)
    assert f.Read.decode(read.encode()) == read
    with pytest.raises(f.FrameError, match="READ"):
        f.Read.decode(read.encode()[:-1])


@pytest.mark.parametrize(("decode", "words"), [
    (lambda: f.ProduceOpen.decode(f.BodyWriter().string("t").string("p").u8(2).done()), "reliable is 2"),
    (lambda: f.decode_produce(f.produce_head(1)), "no record batch"),
    (lambda: f.decode_offsets(f.offsets_body(1, 2) + b"x", "ACK", "a", "b"), "1 bytes after"),
    (lambda: f.Subscribe.decode(f.Subscribe("t", "s", "c", 0, False).encode()[:-1] + b"\x05"),
     "initial_position is 5"),
    (lambda: f.Acknowledge.decode(f.Acknowledge(None, [], [], 0).encode(), 0x02), "flags 0x02"),
    (lambda: f.Acknowledge.decode(f.BodyWriter().u64(0).u32(f.MAX_ACK_OFFSETS + 1).done(), 0),
     "offsets has 1048577 items"),
    (lambda: f.Acknowledge.decode(f.BodyWriter().u64(0).u32(3).u64(1).done(), 0), "needs 24 bytes"),
])
def test_the_fast_api_bodies_refuse_what_does_not_fit(decode: object, words: str) -> None:
    with pytest.raises(f.FrameError, match=words):
        decode()  # type: ignore[operator]

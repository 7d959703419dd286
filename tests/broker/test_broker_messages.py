"""StreamMessage ⇄ one-record batch through a real WAL: every field, optional-field presence (docs/WIRE.md
D.5), `topic_offset` = the WAL offset (D.4), and records below the read position skipped."""

from __future__ import annotations

from pathlib import Path

from broker_support import Run

from danube_fast.broker import messages
from danube_fast.codec import frames
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.storage import SyncPolicy, Wal, WalConfig

U64_MAX = (1 << 64) - 1
TOPIC = "/default/orders-part-2"


async def open_wal(tmp_path: Path) -> Wal:
    return await Wal.open(tmp_path / "w", WalConfig(sync=SyncPolicy("none")))


async def read_from(wal: Wal, start: int) -> list[pb.StreamMessage]:
    """Decode everything committed from `start` on, read by read by as the reliable dispatcher does."""
    out: list[pb.StreamMessage] = []
    position = start
    while (got := await wal.read(position)) is not None:
        data, next_offset = got
        assert next_offset > position
        out.extend(messages.decode(data, TOPIC, position))
        position = next_offset
    assert position == wal.committed_offset
    return out


async def through_wal(tmp_path: Path, *msgs: pb.StreamMessage) -> list[pb.StreamMessage]:
    wal = await open_wal(tmp_path)
    try:
        for m in msgs:
            await wal.append(messages.encode(m))
        return await read_from(wal, 0)
    finally:
        await wal.close()


def full_message() -> pb.StreamMessage:
    return pb.StreamMessage(
        request_id=U64_MAX,
        msg_id=pb.MsgID(producer_id=U64_MAX - 1, topic_name=TOPIC, broker_addr="http://10.0.0.7:6650",
                        topic_offset=999),  # a producer's topic_offset is meaningless: the WAL's replaces it
        payload=b"\x00payload\xff" * 3,
        publish_time=1_723_456_789_012,
        producer_name="producer-ß",
        subscription_name="not stored",
        attributes={"k1": "v1", "ünï": "cödé", "empty": ""},
        schema_id=U64_MAX,
        schema_version=(1 << 32) - 1,
        routing_key="key/ä",
    )


def test_every_field_round_trips(tmp_path: Path, run: Run) -> None:
    (got,) = run(through_wal(tmp_path, full_message()))
    sent = full_message()
    assert got.request_id == sent.request_id
    assert got.payload == sent.payload
    assert got.publish_time == sent.publish_time
    assert got.producer_name == sent.producer_name
    assert dict(got.attributes) == dict(sent.attributes)
    assert got.HasField("routing_key") and got.routing_key == sent.routing_key
    assert got.HasField("schema_id") and got.schema_id == sent.schema_id
    assert got.HasField("schema_version") and got.schema_version == sent.schema_version
    assert got.msg_id == pb.MsgID(producer_id=U64_MAX - 1, topic_name=TOPIC,
                                  broker_addr="http://10.0.0.7:6650", topic_offset=0)
    assert got.subscription_name == ""  # not stored (the client sends and ignores "")
    expected = full_message()
    expected.msg_id.topic_offset = 0
    expected.subscription_name = ""
    assert got == expected


def test_unset_optional_fields_stay_unset(tmp_path: Path, run: Run) -> None:
    sent = pb.StreamMessage(payload=b"x", producer_name="p", msg_id=pb.MsgID(producer_id=1, topic_name=TOPIC))
    (got,) = run(through_wal(tmp_path, sent))
    assert not got.HasField("routing_key")
    assert not got.HasField("schema_id")
    assert not got.HasField("schema_version")
    assert len(got.attributes) == 0
    assert got.request_id == 0 and got.publish_time == 0 and got.msg_id.broker_addr == ""
    assert got.payload == b"x"


def test_optional_fields_set_to_zero_values_stay_set(tmp_path: Path, run: Run) -> None:
    sent = pb.StreamMessage(payload=b"", producer_name="p", msg_id=pb.MsgID(topic_name=TOPIC),
                            routing_key="", schema_id=0, schema_version=0)
    (got,) = run(through_wal(tmp_path, sent))
    assert got.HasField("routing_key") and got.routing_key == ""
    assert got.HasField("schema_id") and got.schema_id == 0
    assert got.HasField("schema_version") and got.schema_version == 0
    assert got.payload == b""


def test_only_some_optional_fields_set(tmp_path: Path, run: Run) -> None:
    a = pb.StreamMessage(payload=b"a", schema_id=5)
    b = pb.StreamMessage(payload=b"b", schema_version=2, attributes={"x": "y"})
    c = pb.StreamMessage(payload=b"c", routing_key="rk")
    got = run(through_wal(tmp_path, a, b, c))
    assert [(m.HasField("schema_id"), m.HasField("schema_version"), m.HasField("routing_key"))
            for m in got] == [(True, False, False), (False, True, False), (False, False, True)]
    assert (got[0].schema_id, got[1].schema_version, dict(got[1].attributes), got[2].routing_key) == (
        5, 2, {"x": "y"}, "rk")


def test_topic_offset_is_the_wal_offset(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal = await open_wal(tmp_path)
        try:
            appended = [await wal.append(messages.encode(pb.StreamMessage(payload=b"p%d" % i)))
                        for i in range(4)]
            assert appended == [(0, 0), (1, 1), (2, 2), (3, 3)]
            decoded = await read_from(wal, 0)
            assert [(m.msg_id.topic_offset, m.payload) for m in decoded] == [
                (0, b"p0"), (1, b"p1"), (2, b"p2"), (3, b"p3")]
            assert {m.msg_id.topic_name for m in decoded} == {TOPIC}
        finally:
            await wal.close()

    run(main())


def test_decode_skips_records_below_start(tmp_path: Path, run: Run) -> None:
    """A read returns whole batches, possibly starting before the requested offset: those records go."""

    async def main() -> None:
        wal = await open_wal(tmp_path)
        try:
            three = frames.encode_batch([frames.Record(b"r%d" % i, publish_time=10 + i) for i in range(3)],
                                        producer_id=3, producer_name="batcher", broker_addr="b")
            assert await wal.append(three) == (0, 2)
            assert await wal.append(messages.encode(pb.StreamMessage(payload=b"r3"))) == (3, 3)
            got = await wal.read(1)
            assert got is not None
            data, next_offset = got
            assert next_offset == 3  # the whole first batch, offsets 0..2
            for start, want in [(0, [0, 1, 2]), (1, [1, 2]), (2, [2]), (3, []), (4, [])]:
                decoded = messages.decode(data, TOPIC, start)
                assert [(m.msg_id.topic_offset, m.payload) for m in decoded] == [
                    (o, b"r%d" % o) for o in want], f"start {start}"
            for start, want in [(0, [0, 1, 2, 3]), (1, [1, 2, 3]), (2, [2, 3]), (3, [3])]:
                decoded = await read_from(wal, start)
                assert [(m.msg_id.topic_offset, m.payload) for m in decoded] == [
                    (o, b"r%d" % o) for o in want], f"start {start}"
            first = messages.decode(data, TOPIC, 1)[0]
            assert (first.producer_name, first.msg_id.producer_id, first.publish_time) == ("batcher", 3, 11)
        finally:
            await wal.close()

    run(main())


def test_routing_key_falls_back_to_the_producer_name() -> None:
    assert messages.routing_key(pb.StreamMessage(producer_name="p1", routing_key="k")) == "k"
    assert messages.routing_key(pb.StreamMessage(producer_name="p1")) == "p1"
    assert messages.routing_key(pb.StreamMessage(producer_name="p1", routing_key="")) == ""  # set, empty

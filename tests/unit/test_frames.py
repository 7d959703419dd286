"""The record-batch codec (docs/FORMAT.md), over the native module and its pure-Python twin.

Tests taking the `frames_impl` fixture run once per implementation (ids `native` and `pure`); the tests
whose names end in `_across_impls` import both modules and compare them with each other.
"""

from __future__ import annotations

import importlib
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_fast.errors import FrameCorrupt

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
HEADER_SIZE = 56

# The pure twin is ~100x slower than the native module; these counts keep every test well under 10 s.
FUZZ = settings(max_examples=200, deadline=None)
CORRUPT_INPUTS = {"native": 3000, "pure": 300}  # per corruption family; four families -> 12,000 / 1,200


def impl_name(frames: ModuleType) -> str:
    return "pure" if frames.__name__.endswith("_py") else "native"


def both_impls() -> tuple[ModuleType, ModuleType]:
    return (importlib.import_module("danube_fast.codec._frames"),
            importlib.import_module("danube_fast.codec._frames_py"))


def as_int64(value: int) -> int:
    return value - 2**64 if value >= 2**63 else value


# ----------------------------------------------------------------------------------------------------------
# Strategies and builders. Records are described by plain dicts so that either module can build them.

texts = st.text(max_size=12)  # unicode, empty included; hypothesis never draws lone surrogates
record_dicts = st.fixed_dictionaries({
    "payload": st.one_of(st.binary(max_size=40), st.binary(min_size=1000, max_size=4000)),
    "publish_delta": st.one_of(st.integers(0, 1000), st.integers(0, U32_MAX)),
    "request_id": st.one_of(st.just(0), st.integers(1, U64_MAX)),
    "routing_key": st.none() | texts,
    "attributes": st.none() | st.dictionaries(texts, st.text(max_size=40), max_size=4),
    "schema_id": st.none() | st.integers(0, U64_MAX) | st.just(U64_MAX),
    "schema_version": st.none() | st.integers(0, U32_MAX) | st.just(U32_MAX),
})


@dataclass
class BatchSpec:
    records: list[dict[str, Any]]
    base_time: int
    producer_id: int = 0
    producer_name: str = ""
    broker_addr: str = ""
    base_offset: int = 0
    payload_type: type = bytes
    extra: dict[str, Any] = field(default_factory=dict)
    session: int = 0  # with sequence: a sequenced batch (both 0: not sequenced)
    sequence: int = 0

    def publish_times(self) -> list[int]:
        return [self.base_time + r["publish_delta"] for r in self.records]

    def build(self, frames: ModuleType) -> list[Any]:
        return [
            frames.Record(
                self.payload_type(r["payload"]), self.base_time + r["publish_delta"], r["request_id"],
                r["routing_key"], r["attributes"], r["schema_id"], r["schema_version"],
            )
            for r in self.records
        ]

    def encode(self, frames: ModuleType) -> bytes:
        data: bytes = frames.encode_batch(
            self.build(frames), producer_id=self.producer_id, producer_name=self.producer_name,
            broker_addr=self.broker_addr, base_offset=self.base_offset, session=self.session,
            sequence=self.sequence,
        )
        return data

    def expected(self, frames: ModuleType, base_offset: int) -> list[Any]:
        """What decoding gives back: offsets assigned, an empty attribute map read as absent."""
        return [
            frames.Record(
                bytes(r["payload"]), self.base_time + r["publish_delta"], r["request_id"], r["routing_key"],
                r["attributes"] or None, r["schema_id"], r["schema_version"], base_offset + i,
            )
            for i, r in enumerate(self.records)
        ]


@st.composite
def batch_specs(draw: st.DrawFn, max_records: int = 8) -> BatchSpec:
    return BatchSpec(
        records=draw(st.lists(record_dicts, min_size=1, max_size=max_records)),
        base_time=draw(st.one_of(st.integers(0, 2**41), st.integers(0, U64_MAX - U32_MAX))),
        producer_id=draw(st.integers(0, U64_MAX)),
        producer_name=draw(texts),
        broker_addr=draw(texts),
        base_offset=draw(st.one_of(st.integers(0, 2**40), st.just(U64_MAX - max_records))),
        payload_type=draw(st.sampled_from([bytes, bytearray, memoryview])),
        **draw(st.one_of(st.just({}), st.fixed_dictionaries(
            {"session": st.integers(1, U64_MAX), "sequence": st.integers(1, U64_MAX)}))),
    )


def random_batch(frames: ModuleType, rng: random.Random) -> bytes:
    """A small valid batch (< ~600 bytes) exercising every optional field."""
    base_time = rng.choice([0, 1_700_000_000_000, rng.getrandbits(63)])
    records = [
        frames.Record(
            rng.randbytes(rng.choice([0, 1, 7, 60])),
            publish_time=base_time + rng.randint(0, 5000),
            request_id=rng.choice([0, rng.getrandbits(64)]),
            routing_key=rng.choice([None, "", "key", "clé-ключ"]),
            attributes=rng.choice([None, {}, {"a": "1"}, {"ключ": "", "": "значение"}]),
            schema_id=rng.choice([None, 0, rng.getrandbits(64)]),
            schema_version=rng.choice([None, rng.getrandbits(32)]),
        )
        for _ in range(rng.randint(1, 4))
    ]
    session = rng.choice([0, rng.getrandbits(64) | 1])  # half of them sequenced
    data: bytes = frames.encode_batch(
        records, producer_id=rng.getrandbits(64), producer_name=rng.choice(["", "producer-1", "прод"]),
        broker_addr=rng.choice(["", "10.0.0.1:6650"]), base_offset=rng.getrandbits(40),
        session=session, sequence=rng.getrandbits(64) | 1 if session else 0,
    )
    return data


def random_buffer(frames: ModuleType, rng: random.Random) -> tuple[bytearray, list[int]]:
    """1 to 3 valid batches back to back, and the start position of each plus the end of the buffer."""
    buf = bytearray()
    bounds = [0]
    for _ in range(rng.randint(1, 3)):
        buf += random_batch(frames, rng)
        bounds.append(len(buf))
    return buf, bounds


def decoders(frames: ModuleType) -> list[tuple[str, Callable[[Any, bool], Any]]]:
    def decode_arrow(buf: Any, verify: bool) -> pa.RecordBatch:
        batch = frames.decode_arrow(buf, verify=verify)
        batch.validate(full=True)  # a returned batch must be valid Arrow: strings are UTF-8, offsets fit
        return batch

    def decode_arrow_chunks(buf: Any, verify: bool) -> pa.RecordBatch:
        batch = frames.decode_arrow_chunks([b"", buf], verify=verify)  # positions are within `buf`
        batch.validate(full=True)
        return batch

    return [
        ("scan_batches", lambda buf, verify: frames.scan_batches(buf, verify=verify)),
        ("decode_records", lambda buf, verify: frames.decode_records(buf, verify=verify)),
        ("iter_records", lambda buf, verify: list(frames.iter_records(buf, verify=verify))),
        ("decode_arrow", decode_arrow),
        ("decode_arrow_chunks", decode_arrow_chunks),
    ]


def assert_corrupt_at(frames: ModuleType, buf: bytes | bytearray, position: int) -> None:
    """Every verifying decoder rejects `buf`, blaming the batch at `position`."""
    for name, decode in decoders(frames):
        with pytest.raises(FrameCorrupt) as info:
            decode(bytes(buf), True)
        assert info.value.position == position, f"{name}: {info.value} for {bytes(buf).hex()}"


def assert_only_frame_corrupt(frames: ModuleType, buf: bytes | bytearray, verify: bool) -> None:
    """Every decoder either succeeds or raises FrameCorrupt inside the buffer; anything else propagates."""
    for name, decode in decoders(frames):
        try:
            decode(bytes(buf), verify)
        except FrameCorrupt as e:
            assert 0 <= e.position <= len(buf), f"{name}: {e} for {bytes(buf).hex()}"


def arrow_columns(batch: pa.RecordBatch) -> dict[str, list[Any]]:
    """Columns as Python lists, timestamps as int64 (datetime cannot hold every u64 millisecond count)."""
    return {
        name: (column.cast(pa.int64()) if name == "timestamp" else column).to_pylist()
        for name, column in zip(batch.schema.names, batch.columns, strict=True)
    }


def header_tuple(header: Any) -> tuple[Any, ...]:
    return (
        header.position, header.base_offset, header.length, header.crc, header.record_count,
        header.base_timestamp, header.max_timestamp, header.producer_id, header.producer_name,
        header.broker_addr, header.last_offset, header.end, header.session, header.sequence,
    )


def record_tuple(record: Any) -> tuple[Any, ...]:
    return (
        bytes(record.payload), record.publish_time, record.request_id, record.routing_key, record.attributes,
        record.schema_id, record.schema_version, record.offset,
    )


# ----------------------------------------------------------------------------------------------------------
# CRC32C


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0),
        (b"123456789", 0xE3069283),
        (bytes(32), 0x8A9136AA),
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),  # RFC 3720 B.4 "incrementing"
    ],
)
def test_crc32c_known_vectors(frames_impl: ModuleType, data: bytes, expected: int) -> None:
    assert frames_impl.crc32c(data) == expected
    assert frames_impl.crc32c(bytearray(data)) == expected
    assert frames_impl.crc32c(memoryview(data)) == expected


@FUZZ
@given(a=st.binary(max_size=300), b=st.binary(max_size=300))
def test_crc32c_is_incremental(frames_impl: ModuleType, a: bytes, b: bytes) -> None:
    assert frames_impl.crc32c(b, frames_impl.crc32c(a)) == frames_impl.crc32c(a + b)


def test_crc32c_long_buffer_same_across_impls() -> None:
    native, pure = both_impls()
    data = random.Random(7).randbytes(100_000)
    expected = native.crc32c(data)
    assert pure.crc32c(data) == expected
    assert pure.crc32c(data[33_333:], pure.crc32c(data[:33_333])) == expected
    assert native.crc32c(memoryview(data)[1:]) == pure.crc32c(data[1:])


# ----------------------------------------------------------------------------------------------------------
# Round trips


@FUZZ
@given(spec=batch_specs())
def test_encode_batch_round_trip(frames_impl: ModuleType, spec: BatchSpec) -> None:
    data = spec.encode(frames_impl)
    assert frames_impl.decode_records(data) == spec.expected(frames_impl, spec.base_offset)
    assert list(frames_impl.iter_records(data, verify=False)) == spec.expected(frames_impl, spec.base_offset)

    [header] = frames_impl.scan_batches(data)
    times = spec.publish_times()
    assert header_tuple(header) == (
        0, spec.base_offset, len(data), struct.unpack_from("<I", data, 8)[0], len(spec.records),
        min(times), max(times), spec.producer_id, spec.producer_name, spec.broker_addr,
        spec.base_offset + len(spec.records) - 1, len(data), spec.session, spec.sequence,
    )
    assert header_tuple(frames_impl.verify_batch(data)) == header_tuple(header)
    assert header_tuple(frames_impl.parse_header(data)) == header_tuple(header)


@FUZZ
@given(
    payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=20),
    publish_time=st.integers(0, U64_MAX),
    producer_id=st.integers(0, U64_MAX),
    producer_name=texts,
    broker_addr=texts,
    base_offset=st.integers(0, U64_MAX),
)
def test_encode_payloads_matches_encode_batch(
    frames_impl: ModuleType, payloads: list[bytes], publish_time: int, producer_id: int, producer_name: str,
    broker_addr: str, base_offset: int,
) -> None:
    names = {"producer_id": producer_id, "producer_name": producer_name, "broker_addr": broker_addr,
             "base_offset": base_offset}
    records = [frames_impl.Record(p, publish_time) for p in payloads]
    fast = frames_impl.encode_payloads(payloads, publish_time=publish_time, **names)
    assert fast == frames_impl.encode_batch(records, **names)
    assert frames_impl.encode_payloads([bytearray(p) for p in payloads], publish_time=publish_time,
                                       **names) == fast


def test_encode_payloads_with_room_leaves_zero_bytes_before_the_same_batch(frames_impl: ModuleType) -> None:
    """`room`: the batch as a view of a bytes object that starts with that many zero bytes (a producer's
    request framing goes there, fast_wire.py); a compressed batch is a new object, so it comes as bytes."""
    payloads = [bytes([i]) * (100 + i) for i in range(20)]
    names = {"publish_time": 7, "producer_id": 3, "producer_name": "p", "session": 9, "sequence": 4}
    plain = frames_impl.encode_payloads(payloads, **names)
    for room in (1, 23, 4096):
        view = frames_impl.encode_payloads(payloads, room=room, **names)
        assert isinstance(view, memoryview) and type(view.obj) is bytes
        assert bytes(view) == plain and view.obj == bytes(room) + plain
        frames_impl.verify_batch(view)
    packed = frames_impl.encode_payloads(payloads, compression="zstd", room=23, **names)
    assert type(packed) is bytes
    assert frames_impl.decode_records(packed) == frames_impl.decode_records(plain)
    assert frames_impl.encode_payloads(payloads, room=0, **names) == plain
    with pytest.raises(ValueError, match="room"):
        frames_impl.encode_payloads(payloads, room=-1, **names)


@settings(max_examples=100, deadline=None)
@given(specs=st.lists(batch_specs(max_records=5), min_size=1, max_size=3), data=st.data())
def test_stamped_batches_decode_with_offsets_and_arrow_agrees(
    frames_impl: ModuleType, specs: list[BatchSpec], data: st.DataObject
) -> None:
    buf = bytearray()
    expected = []
    for spec in specs:
        position = len(buf)
        buf += spec.encode(frames_impl)
        base_offset = data.draw(st.integers(0, U64_MAX - 5), label="stamped base_offset")
        frames_impl.stamp_base_offset(buf, base_offset, position)
        expected += [(r, spec.producer_name) for r in spec.expected(frames_impl, base_offset)]

    headers = frames_impl.scan_batches(buf)
    assert [h.position for h in headers] == [0] + [h.end for h in headers[:-1]]
    records = frames_impl.decode_records(buf)
    assert records == [r for r, _ in expected]

    batch = frames_impl.decode_arrow(buf)
    assert batch.schema == frames_impl.ARROW_SCHEMA
    assert batch.num_rows == len(records)
    column = arrow_columns(batch)
    assert column["offset"] == [as_int64(r.offset) for r in records]
    assert column["timestamp"] == [as_int64(r.publish_time) for r in records]
    assert column["key"] == [r.routing_key for r in records]
    assert column["value"] == [r.payload for r in records]
    assert column["producer"] == [name for _, name in expected]
    assert [None if m is None else dict(m) for m in column["attributes"]] == [r.attributes for r in records]
    assert column["schema_id"] == [None if r.schema_id is None else as_int64(r.schema_id) for r in records]
    assert column["schema_version"] == [r.schema_version for r in records]
    assert batch.column("key").null_count == sum(r.routing_key is None for r in records)
    assert batch.column("attributes").null_count == sum(r.attributes is None for r in records)


@pytest.mark.parametrize("empty", [b"", bytearray(), memoryview(b"")], ids=["bytes", "bytearray", "view"])
def test_empty_buffer_holds_nothing(frames_impl: ModuleType, empty: Any) -> None:
    assert frames_impl.scan_batches(empty) == []
    assert frames_impl.decode_records(empty) == []
    assert list(frames_impl.iter_records(empty)) == []
    batch = frames_impl.decode_arrow(empty)
    assert batch.num_rows == 0
    assert batch.schema == frames_impl.ARROW_SCHEMA


def test_arrow_schema(frames_impl: ModuleType) -> None:
    schema = frames_impl.ARROW_SCHEMA
    assert schema.names == [
        "offset", "timestamp", "key", "value", "producer", "attributes", "schema_id", "schema_version",
    ]
    assert [schema.field(n).type for n in schema.names] == [
        pa.int64(), pa.timestamp("ms"), pa.string(), pa.binary(), pa.string(),
        pa.map_(pa.string(), pa.string()), pa.int64(), pa.int64(),
    ]
    nullable = [schema.field(n).nullable for n in schema.names]
    assert nullable == [False, False, True, False, False, True, True, True]


def test_constants(frames_impl: ModuleType) -> None:
    assert (frames_impl.MAGIC, frames_impl.VERSION, frames_impl.HEADER_SIZE) == (0xDB, 1, HEADER_SIZE)
    assert frames_impl.MAX_BATCH_BYTES == 64 * 1024 * 1024


def test_presence_is_kept(frames_impl: ModuleType) -> None:
    record = frames_impl.Record
    data = frames_impl.encode_batch([
        record(b"a", routing_key="", schema_id=0, schema_version=0),
        record(b"b", attributes={}),
        record(b"c", attributes={"": ""}, request_id=0),
    ])
    a, b, c = frames_impl.decode_records(data)
    assert (a.routing_key, a.schema_id, a.schema_version, a.attributes) == ("", 0, 0, None)
    assert (b.routing_key, b.schema_id, b.schema_version, b.attributes) == (None, None, None, None)
    assert (c.attributes, c.request_id) == ({"": ""}, 0)
    # an empty map is sent exactly like an absent one
    assert frames_impl.encode_batch([record(b"b", attributes={})]) == frames_impl.encode_batch([record(b"b")])


def test_decoders_accept_any_buffer_and_slices(frames_impl: ModuleType) -> None:
    data = frames_impl.encode_payloads([b"x", b"yz"], publish_time=5, base_offset=3)
    padded = b"\0" * 10 + data
    for buf in (data, bytearray(data), memoryview(data), memoryview(padded)[10:]):
        records = frames_impl.decode_records(buf)
        assert [(r.offset, r.payload, r.publish_time) for r in records] == [(3, b"x", 5), (4, b"yz", 5)]
    header = frames_impl.verify_batch(padded, 10)
    assert (header.position, header.end, header.last_offset) == (10, len(padded), 4)


def test_record_value_semantics(frames_impl: ModuleType) -> None:
    record = frames_impl.Record
    r = record(b"x")
    assert (r.payload, r.publish_time, r.request_id, r.routing_key, r.attributes, r.schema_id,
            r.schema_version, r.offset) == (b"x", 0, 0, None, None, None, None, -1)
    assert r == record(b"x")
    assert r != record(b"x", offset=0)
    assert r != record(b"x", attributes={"a": "b"})
    assert r.__eq__(b"x") is NotImplemented
    assert r != b"x"
    assert isinstance(repr(r), str)
    assert "BatchHeader" in repr(frames_impl.parse_header(frames_impl.encode_batch([r])))


# ----------------------------------------------------------------------------------------------------------
# The two implementations produce the same bytes


FIXED_BATCHES: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
    ([{"payload": b"hello"}], {}),
    (
        [
            {"payload": b"", "publish_time": 1_700_000_000_000},
            {"payload": b"\x00" * 300, "publish_time": 1_700_000_000_007, "request_id": 42,
             "routing_key": "order-17", "attributes": {"trace": "abc", "ключ": "значение"},
             "schema_id": U64_MAX, "schema_version": U32_MAX},
            {"payload": b"z", "publish_time": 1_700_000_000_003, "routing_key": "", "attributes": {},
             "schema_id": 0},
        ],
        {"producer_id": 9, "producer_name": "prod-é", "broker_addr": "10.1.2.3:6650", "base_offset": 2**40},
    ),
    # the last offsets wrap around u64, as u64 arithmetic does
    ([{"payload": bytes(range(256)), "publish_time": U64_MAX}] * 3,
     {"producer_id": U64_MAX, "base_offset": U64_MAX}),
    # sequenced (docs/FORMAT.md#sequenced-batches)
    ([{"payload": b"once", "routing_key": "k"}, {"payload": b"twice"}],
     {"producer_name": "p", "session": U64_MAX, "sequence": 1}),
    ([{"payload": b"x" * 4000}] * 4, {"session": 7, "sequence": U64_MAX, "compression": "zstd"}),
]


@pytest.mark.parametrize(("records", "options"), FIXED_BATCHES)
def test_encoding_byte_identical_across_impls(records: list[dict[str, Any]], options: dict[str, Any]) -> None:
    native, pure = both_impls()
    native_bytes = native.encode_batch([native.Record(**r) for r in records], **options)
    pure_bytes = pure.encode_batch([pure.Record(**r) for r in records], **options)
    assert native_bytes == pure_bytes
    assert [record_tuple(r) for r in native.decode_records(pure_bytes)] == [
        record_tuple(r) for r in pure.decode_records(native_bytes)
    ]
    assert native.decode_arrow(pure_bytes).equals(pure.decode_arrow(native_bytes))


@settings(max_examples=100, deadline=None)
@given(spec=batch_specs())
def test_random_batches_byte_identical_across_impls(spec: BatchSpec) -> None:
    native, pure = both_impls()
    assert spec.encode(native) == spec.encode(pure)


# ----------------------------------------------------------------------------------------------------------
# Encoder errors


Encoder = Callable[[ModuleType], Any]


def with_record(**fields: Any) -> Encoder:
    """encode_batch of one Record with `fields` (payload b"" unless given)."""
    return lambda f: f.encode_batch([f.Record(**{"payload": b"", **fields})])


def with_records(*records: dict[str, Any]) -> Encoder:
    return lambda f: f.encode_batch([f.Record(**{"payload": b"", **r}) for r in records])


def with_options(**options: Any) -> Encoder:
    """encode_batch of one empty Record with batch-level `options`."""
    return lambda f: f.encode_batch([f.Record(b"")], **options)


def with_payloads(payloads: list[Any], **options: Any) -> Encoder:
    return lambda f: f.encode_payloads(payloads, **options)


MAX_BATCH = 1 << 26
ENCODE_ERRORS = [
    pytest.param(lambda f: f.encode_batch([]), ValueError, "at least one record", id="empty"),
    pytest.param(with_payloads([]), ValueError, "at least one record", id="empty-payloads"),
    pytest.param(lambda f: f.encode_batch([f.Record(b""), b"raw"]), TypeError, None, id="not-a-record"),
    pytest.param(with_record(payload="text"), TypeError, None, id="payload-str"),
    pytest.param(with_record(payload=5), TypeError, None, id="payload-int"),
    pytest.param(with_payloads([b"ok", "text"]), TypeError, None, id="payloads-str"),
    pytest.param(with_record(publish_time=-1), ValueError, "publish_time", id="publish_time-negative"),
    pytest.param(with_record(publish_time=2**64), ValueError, "publish_time", id="publish_time-big"),
    pytest.param(with_record(publish_time=1.9), TypeError, None, id="publish_time-float"),
    pytest.param(with_payloads([b""], publish_time=2**64), ValueError, "publish_time", id="payloads-time"),
    pytest.param(with_record(request_id=-1), ValueError, "request_id", id="request_id-negative"),
    pytest.param(with_record(request_id=2**64), ValueError, "request_id", id="request_id-big"),
    pytest.param(with_record(schema_id=-1), ValueError, "schema_id", id="schema_id-negative"),
    pytest.param(with_record(schema_id=2**64), ValueError, "schema_id", id="schema_id-big"),
    pytest.param(with_record(schema_id=2.5), TypeError, None, id="schema_id-float"),
    pytest.param(with_record(schema_version=-1), ValueError, "schema_version", id="schema_version-negative"),
    pytest.param(with_record(schema_version=2**32), ValueError, "schema_version", id="schema_version-big"),
    pytest.param(with_options(producer_id=-1), ValueError, "producer_id", id="producer_id-negative"),
    pytest.param(with_payloads([b""], producer_id=2**64), ValueError, "producer_id", id="producer_id-big"),
    pytest.param(with_options(base_offset=-1), ValueError, "base_offset", id="base_offset-negative"),
    pytest.param(with_payloads([b""], base_offset=2**64), ValueError, "base_offset", id="base_offset-big"),
    pytest.param(with_records({"publish_time": 5}, {"publish_time": 5 + U32_MAX + 1}), ValueError, None,
                 id="spread"),
    pytest.param(with_record(routing_key="é" * 32768), ValueError, None, id="routing_key-long"),
    pytest.param(with_record(routing_key=5), TypeError, None, id="routing_key-int"),
    pytest.param(with_options(producer_name="x" * 65536), ValueError, None, id="producer_name-long"),
    pytest.param(with_options(producer_name=b"p"), TypeError, None, id="producer_name-bytes"),
    pytest.param(with_payloads([b""], broker_addr="x" * 65536), ValueError, None, id="broker_addr-long"),
    pytest.param(with_record(attributes={"k" * 65536: ""}), ValueError, None, id="attribute-key-long"),
    pytest.param(with_record(attributes={str(i): "" for i in range(65536)}), ValueError, None,
                 id="attribute-count"),
    pytest.param(with_record(attributes={1: "v"}), TypeError, None, id="attribute-key-int"),
    pytest.param(with_record(attributes={"k": b"v"}), TypeError, None, id="attribute-value-bytes"),
    pytest.param(with_record(attributes=[("k", "v")]), TypeError, None, id="attributes-list"),
    pytest.param(with_record(payload=bytes(MAX_BATCH)), ValueError, None, id="too-big"),
    pytest.param(with_payloads([bytes(MAX_BATCH // 2)] * 2), ValueError, None, id="too-big-payloads"),
    pytest.param(with_options(session=5), ValueError, "go together", id="session-without-sequence"),
    pytest.param(with_payloads([b""], sequence=5), ValueError, "go together", id="sequence-without-session"),
    pytest.param(with_options(session=-1, sequence=1), ValueError, "session", id="session-negative"),
    pytest.param(with_payloads([b""], session=1, sequence=2**64), ValueError, "sequence", id="sequence-big"),
]


@pytest.mark.parametrize(("call", "error", "match"), ENCODE_ERRORS)
def test_encode_errors(
    frames_impl: ModuleType, call: Encoder, error: type[Exception], match: str | None
) -> None:
    with pytest.raises(error, match=match):
        call(frames_impl)


def test_encode_limits_are_inclusive(frames_impl: ModuleType) -> None:
    record = frames_impl.Record
    spread = frames_impl.encode_batch([record(b"", U64_MAX - U32_MAX), record(b"", U64_MAX)])
    assert [r.publish_time for r in frames_impl.decode_records(spread)] == [U64_MAX - U32_MAX, U64_MAX]
    long_key = "é" * 32767 + "k"  # 65535 UTF-8 bytes
    many = {str(i): "" for i in range(65535)}
    data = frames_impl.encode_batch(
        [record(b"", routing_key=long_key), record(b"", attributes=many)],
        producer_name="p" * 65535, broker_addr="b" * 65535,
    )
    first, second = frames_impl.decode_records(data)
    assert first.routing_key == long_key
    assert second.attributes == many
    header = frames_impl.parse_header(data)
    assert (len(header.producer_name), len(header.broker_addr)) == (65535, 65535)


# ----------------------------------------------------------------------------------------------------------
# Header-only parsing, verification and stamping


def test_parse_header_skips_the_crc_and_verify_batch_does_not(frames_impl: ModuleType) -> None:
    first = frames_impl.encode_payloads([b"one"], base_offset=1)
    second = bytearray(frames_impl.encode_batch([frames_impl.Record(b"two", 7, routing_key="k")]))
    second[8] ^= 0x01  # the stored CRC
    buf = first + bytes(second)
    header = frames_impl.parse_header(buf, len(first))
    assert (header.position, header.record_count, header.base_timestamp) == (len(first), 1, 7)
    assert len(frames_impl.scan_batches(buf, verify=False)) == 2
    with pytest.raises(FrameCorrupt, match="CRC") as info:
        frames_impl.verify_batch(buf, len(first))
    assert info.value.position == len(first)
    assert_corrupt_at(frames_impl, buf, len(first))
    # without verify the CRC is ignored but the records still decode
    assert [r.payload for r in frames_impl.decode_records(buf, verify=False)] == [b"one", b"two"]

    payload_flipped = bytearray(first)
    payload_flipped[-1] ^= 0x80
    assert frames_impl.parse_header(payload_flipped).record_count == 1
    with pytest.raises(FrameCorrupt, match="CRC"):
        frames_impl.verify_batch(payload_flipped)


def test_torn_and_bad_magic_messages(frames_impl: ModuleType) -> None:
    data = frames_impl.encode_payloads([b"payload"])
    with pytest.raises(FrameCorrupt, match="torn") as info:
        frames_impl.parse_header(data[:-1])
    assert info.value.position == 0
    bad = bytearray(data)
    bad[16] = 0
    with pytest.raises(FrameCorrupt, match="magic"):
        frames_impl.parse_header(bad)
    with pytest.raises(FrameCorrupt):
        frames_impl.parse_header(data[:HEADER_SIZE - 1])


def test_scan_without_verify_reads_headers_only(frames_impl: ModuleType) -> None:
    """scan_batches(verify=False) is the cheap walk over headers (checks 1 and 2); records are not read."""
    buf = bytearray(frames_impl.encode_payloads([b"abc"]))
    buf[HEADER_SIZE + 4] = 0x80  # record 0 sets an unknown flag bit
    refresh_crc(frames_impl, buf, 0)
    [header] = frames_impl.scan_batches(buf, verify=False)
    assert (header.position, header.length, header.record_count) == (0, len(buf), 1)
    with pytest.raises(FrameCorrupt, match="flag"):
        frames_impl.scan_batches(buf)
    with pytest.raises(FrameCorrupt, match="flag"):
        frames_impl.decode_records(buf, verify=False)


@pytest.mark.parametrize("name_field", ["producer_name", "broker_addr"])
def test_names_must_be_utf8_for_every_reader(frames_impl: ModuleType, name_field: str) -> None:
    buf = bytearray(frames_impl.encode_payloads([b"abc"], **{name_field: "n"}))
    buf[HEADER_SIZE] = 0xFF  # the name's only byte; the CRC is made valid again
    refresh_crc(frames_impl, buf, 0)
    with pytest.raises(FrameCorrupt):
        frames_impl.parse_header(buf)
    for verify in (True, False):
        for name, decode in decoders(frames_impl):
            with pytest.raises(FrameCorrupt):
                decode(bytes(buf), verify)
                pytest.fail(f"{name}(verify={verify}) accepted a {name_field} that is not UTF-8")


def test_stamp_base_offset(frames_impl: ModuleType) -> None:
    first = frames_impl.encode_payloads([b"a", b"b"])
    second = frames_impl.encode_payloads([b"c"], publish_time=9)
    with pytest.raises(TypeError):
        frames_impl.stamp_base_offset(first, 5)
    with pytest.raises(TypeError):
        frames_impl.stamp_base_offset(memoryview(first), 5)

    buf = bytearray(first + second)
    original = bytes(buf)
    frames_impl.stamp_base_offset(buf, 100)
    frames_impl.stamp_base_offset(memoryview(buf), U64_MAX - 1, len(first))
    assert buf[8:len(first)] == original[8:len(first)]
    assert buf[len(first) + 8:] == original[len(first) + 8:]
    assert buf[:8] == (100).to_bytes(8, "little")
    assert [h.base_offset for h in frames_impl.scan_batches(buf)] == [100, U64_MAX - 1]
    assert [r.offset for r in frames_impl.decode_records(buf)] == [100, 101, U64_MAX - 1]

    with pytest.raises(ValueError, match="base_offset"):
        frames_impl.stamp_base_offset(buf, 2**64)
    with pytest.raises(FrameCorrupt):
        frames_impl.stamp_base_offset(buf, 1, 1)  # no batch starts there
    with pytest.raises(FrameCorrupt):
        frames_impl.stamp_base_offset(bytearray(HEADER_SIZE - 1), 1)
    assert buf[:8] == (100).to_bytes(8, "little")


# ----------------------------------------------------------------------------------------------------------
# Corrupt input: FrameCorrupt at the right batch, never another exception, never a hang


def test_random_bytes_raise_only_frame_corrupt(frames_impl: ModuleType) -> None:
    rng = random.Random(1)
    for _ in range(CORRUPT_INPUTS[impl_name(frames_impl)]):
        buf = rng.randbytes(rng.randint(0, 300))
        assert_only_frame_corrupt(frames_impl, buf, verify=True)
        assert_only_frame_corrupt(frames_impl, buf, verify=False)


def mutate(buf: bytearray, rng: random.Random, lo: int, hi: int) -> None:
    """Change 1 to 3 distinct bytes of buf[lo:hi]; every change really changes the byte."""
    for pos in rng.sample(range(lo, hi), min(hi - lo, rng.randint(1, 3))):
        buf[pos] ^= rng.randint(1, 255)


def test_mutated_batches_fail_at_their_position(frames_impl: ModuleType) -> None:
    rng = random.Random(2)
    for _ in range(CORRUPT_INPUTS[impl_name(frames_impl)]):
        buf, bounds = random_buffer(frames_impl, rng)
        k = rng.randrange(len(bounds) - 1)
        # bytes 0..7 (base_offset) are outside the CRC; anything else is caught by it or earlier
        mutate(buf, rng, bounds[k] + 8, bounds[k + 1])
        assert_corrupt_at(frames_impl, buf, bounds[k])
        assert_only_frame_corrupt(frames_impl, buf, verify=False)


def test_truncated_batches_fail_at_their_position(frames_impl: ModuleType) -> None:
    rng = random.Random(3)
    for _ in range(CORRUPT_INPUTS[impl_name(frames_impl)]):
        buf, bounds = random_buffer(frames_impl, rng)
        k = rng.randrange(len(bounds) - 1)
        cut = rng.randrange(bounds[k] + 1, bounds[k + 1])
        assert_corrupt_at(frames_impl, buf[:cut], bounds[k])
        assert_only_frame_corrupt(frames_impl, buf[:cut], verify=False)


def test_every_truncation_of_a_batch_fails(frames_impl: ModuleType) -> None:
    rng = random.Random(4)
    data = random_batch(frames_impl, rng)
    for cut in range(1, len(data)):
        assert_corrupt_at(frames_impl, data[:cut], 0)
        with pytest.raises(FrameCorrupt):
            frames_impl.scan_batches(data[:cut], verify=False)


def test_trailing_garbage_fails_at_its_position(frames_impl: ModuleType) -> None:
    rng = random.Random(5)
    for _ in range(CORRUPT_INPUTS[impl_name(frames_impl)]):
        buf, _ = random_buffer(frames_impl, rng)
        garbage = rng.randbytes(rng.randint(1, 200))
        if rng.random() < 0.3:  # garbage that starts like a batch header
            garbage = bytes(buf[:HEADER_SIZE]) + garbage
        assert_corrupt_at(frames_impl, buf + garbage, len(buf))
        assert_only_frame_corrupt(frames_impl, buf + garbage, verify=False)


def refresh_crc(frames: ModuleType, buf: bytearray, position: int) -> None:
    """Recompute the CRC of the batch at `position` if its (possibly mutated) length still fits."""
    (length,) = struct.unpack_from("<I", buf, position + 12)
    if 12 <= length <= len(buf) - position:
        struct.pack_into("<I", buf, position + 8, frames.crc32c(buf[position + 12:position + length]))


def test_mutated_batches_with_valid_crc_never_crash(frames_impl: ModuleType) -> None:
    """With the CRC fixed up, the record walk itself must catch (or accept) every structural change."""
    rng = random.Random(6)
    for _ in range(CORRUPT_INPUTS[impl_name(frames_impl)]):
        buf, bounds = random_buffer(frames_impl, rng)
        k = rng.randrange(len(bounds) - 1)
        mutate(buf, rng, bounds[k] + 12, bounds[k + 1])
        refresh_crc(frames_impl, buf, bounds[k])
        assert_only_frame_corrupt(frames_impl, buf, verify=True)
        try:
            records = frames_impl.decode_records(bytes(buf))
        except FrameCorrupt:
            continue
        headers = frames_impl.scan_batches(bytes(buf))
        assert len(records) == sum(h.record_count for h in headers)
        assert frames_impl.decode_arrow(bytes(buf)).num_rows == len(records)


def _outcome(decode: Callable[[Any, bool], Any], buf: bytes, verify: bool) -> Any:
    try:
        result = decode(buf, verify)
    except FrameCorrupt as e:
        return ("FrameCorrupt", e.position)
    except Exception as e:  # reported as a disagreement (or a bug in both)
        return (type(e).__name__, str(e))
    if isinstance(result, pa.RecordBatch):
        return arrow_columns(result)
    return [header_tuple(x) if hasattr(x, "record_count") else record_tuple(x) for x in result]


def test_corrupt_inputs_get_the_same_verdict_across_impls() -> None:
    """Both implementations reject the same inputs at the same position and accept the same ones."""
    native, pure = both_impls()
    rng = random.Random(8)
    inputs: list[bytes] = []
    for family in range(4):
        for _ in range(75):
            buf, bounds = random_buffer(native, rng)
            k = rng.randrange(len(bounds) - 1)
            if family == 0:
                inputs.append(rng.randbytes(rng.randint(0, 300)))
            elif family == 1:
                mutate(buf, rng, bounds[k] + 12, bounds[k + 1])
                refresh_crc(native, buf, bounds[k])
                inputs.append(bytes(buf))
            elif family == 2:
                inputs.append(bytes(buf[:rng.randrange(1, len(buf))]))
            else:
                mutate(buf, rng, bounds[k] + 8, bounds[k + 1])
                inputs.append(bytes(buf))
    disagreements = []
    for data in inputs:
        for (name, native_decode), (_, pure_decode) in zip(decoders(native), decoders(pure), strict=True):
            for verify in (True, False):
                native_says = _outcome(native_decode, data, verify)
                pure_says = _outcome(pure_decode, data, verify)
                if native_says != pure_says:
                    disagreements.append(
                        f"{name}(verify={verify}) on {data.hex()}: native {native_says!r}, pure {pure_says!r}"
                    )
    first = "\n".join(disagreements[:3])
    assert not disagreements, f"{len(disagreements)} disagreements, the first:\n{first}"


def test_sequenced_batches_carry_session_and_sequence_and_decode_as_plain_ones(frames_impl: ModuleType
                                                                              ) -> None:
    """A sequenced batch (flags bit 3) holds its producer session and sequence after the names, covered by
    the CRC; its records decode exactly as those of the same batch unsequenced, also compressed (the
    compressed batch keeps the bit), and a sequenced batch with session or sequence 0 is corrupt."""
    f = frames_impl
    payloads = [b"a" * 3000, b"b" * 3000, b""]
    for compression in ("none", "zstd", "lz4"):
        plain = f.encode_payloads(payloads, producer_name="p", compression=compression)
        seq = f.encode_payloads(payloads, producer_name="p", compression=compression, session=3, sequence=8)
        (h,) = f.scan_batches(seq)
        assert (h.session, h.sequence, h.compression) == (3, 8, compression)
        assert len(seq) == len(plain) + 16
        (p,) = f.scan_batches(plain)
        assert (p.session, p.sequence) == (0, 0)
        assert [record_tuple(r) for r in f.decode_records(seq)] == \
            [record_tuple(r) for r in f.decode_records(plain)]
        assert f.decode_arrow(seq).equals(f.decode_arrow(plain))
    seq = bytearray(f.encode_payloads([b"x"], session=3, sequence=8))
    zero = seq.copy()
    zero[56:64] = bytes(8)  # the session (no names here)
    refresh_crc(f, zero, 0)
    assert_corrupt_at(f, zero, 0)
    flipped = seq.copy()
    flipped[60] ^= 1  # the CRC covers the session
    assert_corrupt_at(f, flipped, 0)
    unknown = seq.copy()
    unknown[18] |= 0x10  # flags bit 4: still unknown
    refresh_crc(f, unknown, 0)
    assert_corrupt_at(f, unknown, 0)


def test_chunks_decode_as_one_buffer(frames_impl: ModuleType) -> None:
    """decode_arrow_chunks of a buffer cut at batch bounds (compressed batches among them) is decode_arrow of
    the whole; a bad CRC is named in the chunk that holds it."""
    rng = random.Random(7)
    chunks: list[bytes] = []
    for i in range(12):
        if i % 4 == 3:
            payloads = [rng.randbytes(rng.randint(0, 300)) for _ in range(rng.randint(1, 20))]
            chunks.append(bytes(frames_impl.encode_payloads(payloads, compression=("zstd", "lz4")[i % 2])))
        else:
            chunks.append(bytes(random_buffer(frames_impl, rng)[0]))
    chunks.insert(5, b"")
    whole = frames_impl.decode_arrow(b"".join(chunks))
    joined = frames_impl.decode_arrow_chunks([memoryview(c) for c in chunks])
    joined.validate(full=True)
    assert joined.equals(whole)
    assert joined.num_rows == sum(frames_impl.decode_arrow(c).num_rows for c in chunks) > 12
    assert frames_impl.decode_arrow_chunks([]).num_rows == 0

    good = bytes(frames_impl.encode_payloads([b"payload"] * 3))
    bad = bytearray(good + good)
    bad[-1] ^= 0xFF  # the last payload byte of the chunk's second batch: only its CRC catches it
    with pytest.raises(FrameCorrupt) as info:
        frames_impl.decode_arrow_chunks([chunks[0], chunks[1], bytes(bad), chunks[3]])
    assert info.value.position == len(good)
    assert frames_impl.decode_arrow_chunks([chunks[0], bytes(bad)], verify=False).num_rows > 6

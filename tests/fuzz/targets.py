"""Fuzz targets: each takes arbitrary bytes and fails (an exception other than the documented refusal, or a
crash of the process) only on a bug. `run.py` drives them with atheris (coverage-guided, bounded in time);
`test_fuzz.py` replays their seeds and every input a run once found (regressions/<target>/).

- frames: the record-batch decoders on untrusted bytes, native and pure-Python side by side. Both must
  refuse (FrameCorrupt) or both must decode the same records; with verify=False (no CRC: the bytes are
  parsed as they are) neither may read outside the buffer or crash. The first bytes choose between the
  raw input and the input made into a batch with a valid CRC, so the fuzzer gets past the checksum.
- object_footer: the .dnb1 footer parser (ObjectCorrupt only), also with a recomputed CRC.
- fast_wire: the hand-written protobuf decoders of the fast API (a DecodeError or ValueError only).
- metadata: every typed metadata resource's parser (BadValue only).
- schemas: schema definitions (InvalidSchema only) and, for the ones that register, the payload validators
  (a reason or None, never an exception).
- transport_frames: the native transport's frame decoder and body parsers (docs/TRANSPORT.md) on a byte
  stream cut at a point the input chooses (FrameError only; what decodes must encode back the same, and
  the decoder never holds more than one frame's worth); and the BufferedProtocol receiver
  (transport/receiver.py) fed the same stream in reads of other sizes gives the same frames, or fails where
  the decoder fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import struct
from collections.abc import Callable

from google.protobuf.message import DecodeError

from danube_fast.codec import _frames, _frames_py, fast_wire
from danube_fast.errors import FrameCorrupt, ObjectCorrupt
from danube_fast.meta import resources
from danube_fast.meta.resources_base import Resource
from danube_fast.meta.store import BadValue
from danube_fast.schema import InvalidSchema, SchemaType
from danube_fast.schema.types import build_definition
from danube_fast.schema.validators import validator_for
from danube_fast.storage.objects import format as objects
from danube_fast.transport import frames as transport
from danube_fast.transport import replica_frames
from danube_fast.transport.receiver import FrameReceiver

Target = Callable[[bytes], None]

# The CRC32C covers the batch from `attributes` (byte 21) on; stored at bytes 17..20 (docs/FORMAT.md).
_CRC_FROM, _CRC_AT = 21, 17


def _with_crc(data: bytes) -> bytes:
    """`data` with its batch CRC recomputed (when it is long enough to hold a header)."""
    if len(data) < _frames.HEADER_SIZE:
        return data
    crc = _frames.crc32c(data[_CRC_FROM:])
    return data[:_CRC_AT] + struct.pack("<I", crc) + data[_CRC_AT + 4:]


def _decoded(module: object, data: bytes, verify: bool) -> object:
    """What a codec makes of `data`: its records (as comparable tuples) or the refusal."""
    try:
        records = module.decode_records(data, verify=verify)  # type: ignore[attr-defined]
    except FrameCorrupt:
        return "refused"
    return [(r.offset, r.publish_time, r.payload, r.routing_key, r.attributes, r.schema_id, r.schema_version)
            for r in records]


def frames(data: bytes) -> None:
    if not data:
        return
    mode, body = data[0], data[1:]
    if mode & 1:
        body = _with_crc(body)
    verify = not mode & 2
    native, pure = _decoded(_frames, body, verify), _decoded(_frames_py, body, verify)
    if verify:  # without the CRC the twins may refuse at different points; both must still not crash
        assert native == pure, f"native {native!r:.200} != pure {pure!r:.200}"
    with contextlib.suppress(FrameCorrupt):
        _frames.scan_batches(body, verify=verify)


def object_footer(data: bytes) -> None:
    if len(data) > 8 and data[0] & 1:  # a footer whose CRC holds: its fields are judged next
        trailer = objects.TRAILER_SIZE
        footer = data[1:len(data) - trailer]
        if len(footer) >= 4:
            footer = footer[:-4] + struct.pack("<I", _frames.crc32c(footer[:-4]))
        data = footer + data[len(data) - trailer:]
    with contextlib.suppress(ObjectCorrupt):
        objects.parse_footer(data)
    with contextlib.suppress(ObjectCorrupt):
        objects.check_header(data)


def fast_wire_decoders(data: bytes) -> None:
    for decode in (fast_wire.decode_consume_response, fast_wire.decode_read_response,
                   fast_wire.decode_produce_request):
        with contextlib.suppress(DecodeError, ValueError):
            decode(data)


RESOURCES: list[type[Resource]] = sorted(
    {obj for obj in vars(resources).values() if isinstance(obj, type) and issubclass(obj, Resource)
     and obj is not Resource}, key=lambda cls: cls.__name__)


def metadata(data: bytes) -> None:
    if not data:
        return
    cls = RESOURCES[data[0] % len(RESOURCES)]
    try:
        value = cls.from_json(data[1:], key="/fuzz")
    except BadValue:
        return
    again = cls.from_json(value.to_json())  # what parses must write and read back the same
    assert again == value, f"{cls.__name__}: {value!r} read back as {again!r}"


def schemas(data: bytes) -> None:
    if len(data) < 2:
        return
    kind = (SchemaType.AVRO, SchemaType.JSON_SCHEMA)[data[0] & 1]
    split = 2 + data[1] % max(1, len(data) - 2)
    definition, payload = data[2:split], data[split:]
    try:
        checked = build_definition(kind, definition)
    except InvalidSchema:
        return
    try:
        check = validator_for(checked)
    except InvalidSchema:
        return
    outcome = check(payload)
    assert outcome is None or isinstance(outcome, str)


FUZZ_MAX_FRAME = 4096
BODIES: dict[transport.FrameType, Callable[[memoryview], object]] = {
    transport.FrameType.HELLO: transport.Hello.decode, transport.FrameType.WELCOME: transport.Welcome.decode,
    transport.FrameType.ERROR: transport.Error.decode, transport.FrameType.PING: transport.decode_ping,
    transport.FrameType.PONG: transport.decode_ping, transport.FrameType.GOODBYE: transport.Goodbye.decode,
    transport.FrameType.PRODUCE_OPEN: transport.ProduceOpen.decode,
    transport.FrameType.PRODUCE: transport.decode_produce,
    transport.FrameType.ACK: lambda b: transport.decode_offsets(b, "ACK", "first_offset", "last_offset"),
    transport.FrameType.RECORDS: lambda b: transport.decode_offsets(b, "RECORDS", "first_offset",
                                                                    "last_offset", more=True),
    transport.FrameType.SUBSCRIBE: transport.Subscribe.decode,
    transport.FrameType.ACKNOWLEDGE: lambda b: transport.Acknowledge.decode(b, transport.UP_TO),
    transport.FrameType.LOOKUP: lambda b: transport.decode_string(b, "LOOKUP", "topic"),
    transport.FrameType.OFFSETS: lambda b: transport.decode_string(b, "OFFSETS", "topic"),
    transport.FrameType.RANGE: lambda b: transport.decode_offsets(b, "RANGE", "start_offset", "next_offset"),
    transport.FrameType.READ: transport.Read.decode,
    transport.FrameType.REPLICA_FETCH: replica_frames.ReplicaFetch.decode,
    transport.FrameType.REPLICA_DATA: replica_frames.ReplicaData.decode}


def received(stream: bytes, read: int) -> list[transport.Frame]:
    """The frames transport/receiver.py delivers from `stream`, the "kernel" writing at most `read` bytes
    into each buffer it is given; FrameError as it raises it."""
    out: list[transport.Frame] = []
    receiver = FrameReceiver(out.append, FUZZ_MAX_FRAME)
    at = 0
    while at < len(stream):
        buf = receiver.get_buffer(-1)
        n = min(len(buf), read, len(stream) - at)
        buf[:n] = stream[at:at + n]
        at += n
        receiver.buffer_updated(n)
    return out


def transport_frames(data: bytes) -> None:
    if not data:
        return
    split = data[0] % max(1, len(data))
    decoder = transport.FrameDecoder(FUZZ_MAX_FRAME)
    try:
        got = decoder.feed(data[1:split + 1]) + decoder.feed(data[split + 1:])
    except transport.FrameError:
        try:
            received(data[1:], 1 + split)
        except transport.FrameError:
            return
        raise AssertionError("the receiver took a stream the decoder refused") from None
    assert decoder.buffered < FUZZ_MAX_FRAME
    assert [(f.type, f.flags, f.request_id, bytes(f.body)) for f in received(data[1:], 1 + split)] == \
        [(f.type, f.flags, f.request_id, bytes(f.body)) for f in got]
    for one in got:
        parse = BODIES.get(one.type)
        if parse is None:
            continue
        try:
            body = parse(one.body)
        except transport.FrameError:
            continue
        if dataclasses.is_dataclass(body):  # a body type of its own: what parses writes back the same
            assert body.encode() == bytes(one.body), (one.type, body)  # type: ignore[attr-defined]


TARGETS: dict[str, Target] = {"frames": frames, "object_footer": object_footer,
                              "fast_wire": fast_wire_decoders, "metadata": metadata, "schemas": schemas,
                              "transport_frames": transport_frames}


def seeds() -> dict[str, list[bytes]]:
    """Valid inputs of each target: where a fuzz run starts, and a first regression check."""
    records = [_frames.Record(b"hello", publish_time=1_700_000_000_000, routing_key="k",
                              attributes={"a": "b"}),
               _frames.Record(b"", publish_time=1_700_000_000_001)]
    batch = _frames.encode_batch(records, producer_id=7, producer_name="p")
    built = objects.build_object([batch])
    avro = json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "id", "type": "long"}, {"name": "tags", "type": {"type": "array", "items": "string"}}]})
    json_schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}},
                              "required": ["n"]})
    return {
        "frames": [b"\x00" + batch, b"\x01" + batch, b"\x02" + batch, b"\x00" + batch + batch],
        "object_footer": [built.data, b"\x01" + built.data[-200:]],
        "fast_wire": [fast_wire.encode_records_response(batch, 0, 1),
                      fast_wire.encode_read_response(batch, 0, 1), fast_wire.encode_batch_request(3, batch)],
        "metadata": [bytes([RESOURCES.index(resources.Policy)]) + resources.Policy().to_json(),
                     bytes([RESOURCES.index(resources.SubscriptionCursor)]) + b'{"cursor": 5}'],
        "schemas": [b"\x00" + bytes([len(avro)]) + avro.encode() + b"\x02\x00",
                    b"\x01" + bytes([len(json_schema) % 256]) + json_schema.encode() + b'{"n": 1}'],
        "transport_frames": [b"\x05" + transport.frame(transport.FrameType.HELLO, transport.Hello(
            1, 1, transport.MIN_MAX_FRAME, "token", "fuzz").encode(), 1) + transport.frame(
            transport.FrameType.ERROR, transport.Error("NOT_FOUND", False, "no topic").encode(), 2)
            + transport.frame(transport.FrameType.PING, transport.ping_body(3)),
            b"\x11" + transport.frame(transport.FrameType.SUBSCRIBE, transport.Subscribe(
                "/default/t", "s", "c", 1 << 20, True).encode(), 4) + transport.frame(
                transport.FrameType.ACKNOWLEDGE, transport.Acknowledge(3, [5, 6], [9], 100).encode(), 4,
                transport.UP_TO),
            b"\x09" + transport.frame(transport.FrameType.REPLICA_FETCH, replica_frames.ReplicaFetch(
                "/default/t", 7, 3, -1, 1 << 20, 1000, -1).encode(), 5) + transport.frame(
                transport.FrameType.REPLICA_DATA, replica_frames.data_fields(10, 0, -1, False) + batch, 5)],
    }

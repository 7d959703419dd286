"""Danube API messages to record batches and back (docs/WIRE.md C.6: the broker fills in nothing but
`msg_id.topic_offset` on reliable topics).

A StreamMessage becomes a one-record batch: payload, publish_time, request_id, routing_key, attributes and
the schema fields with presence per record; producer id and name and broker_addr per batch. Delivery rebuilds
the message with `topic_offset` set to the record's WAL offset. `subscription_name` is not stored: the
client sends and ignores "" (B.9), and a delivery from the WAL carries "".
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from danube_fast.codec import frames
from danube_fast.proto import DanubeApi_pb2 as pb

Buffer = bytes | bytearray | memoryview


def encode(msg: pb.StreamMessage) -> bytes:
    """One-record batch for the WAL (the base offset is stamped at append)."""
    record = frames.Record(
        msg.payload,
        publish_time=msg.publish_time,
        request_id=msg.request_id,
        routing_key=msg.routing_key if msg.HasField("routing_key") else None,
        attributes=dict(msg.attributes) if msg.attributes else None,
        schema_id=msg.schema_id if msg.HasField("schema_id") else None,
        schema_version=msg.schema_version if msg.HasField("schema_version") else None,
    )
    mid = msg.msg_id
    return frames.encode_batch([record], producer_id=mid.producer_id, producer_name=msg.producer_name,
                               broker_addr=mid.broker_addr)


def decode_some(data: Buffer, topic: str, wanted: Sequence[int]) -> list[tuple[pb.StreamMessage, int]]:
    """The messages at the offsets `wanted` (ascending) in `data` (whole batches), each with its share of its
    batch's bytes (as dispatch/reliable.py record_sizes counts them): a message is built only for those, and
    only the batches holding one are decoded."""
    out: list[tuple[pb.StreamMessage, int]] = []
    view = memoryview(data)
    chosen = set(wanted)
    for header in frames.scan_batches(view, verify=False):
        at = bisect.bisect_left(wanted, header.base_offset)
        if at == len(wanted) or wanted[at] > header.last_offset:
            continue
        share = header.length // header.record_count
        for r in frames.iter_records(view[header.position:header.end], verify=False):
            if r.offset in chosen:
                out.append((_message(r, header, topic), share))
    return out


def decode(data: Buffer, topic: str, start: int) -> list[pb.StreamMessage]:
    """The messages at offsets >= `start` in `data` (whole batches from the WAL; already CRC-checked
    when they were appended and when the log was recovered, so not verified again here)."""
    out: list[pb.StreamMessage] = []
    view = memoryview(data)
    for header in frames.scan_batches(view, verify=False):
        if header.last_offset < start:
            continue
        for r in frames.iter_records(view[header.position:header.end], verify=False):
            if r.offset >= start:
                out.append(_message(r, header, topic))
    return out


def _message(r: frames.Record, header: frames.BatchHeader, topic: str) -> pb.StreamMessage:
    msg = pb.StreamMessage(
        request_id=r.request_id,
        msg_id=pb.MsgID(producer_id=header.producer_id, topic_name=topic, broker_addr=header.broker_addr,
                        topic_offset=r.offset),
        payload=r.payload, publish_time=r.publish_time, producer_name=header.producer_name,
        attributes=r.attributes)
    if r.routing_key is not None:
        msg.routing_key = r.routing_key
    if r.schema_id is not None:
        msg.schema_id = r.schema_id
    if r.schema_version is not None:
        msg.schema_version = r.schema_version
    return msg


def routing_key(msg: pb.StreamMessage) -> str:
    """Key-Shared's key: `routing_key`, falling back to the producer name (as upstream v0.12 does)."""
    return msg.routing_key if msg.HasField("routing_key") else msg.producer_name

"""Records as the console shows them (console/values.py): Avro values decoded by the record's schema version,
and a hostile payload of a recursive schema refused with a reason instead of overflowing the C stack (the
broker serves the console: its process must survive what a producer wrote)."""

from __future__ import annotations

import asyncio
import io
import json

import fastavro

from danube_fast.console.values import Decoder
from danube_fast.proto import SubscriptionAdmin_pb2 as pb

NODE = {"type": "record", "name": "Node", "fields": [{"name": "v", "type": "int"},
                                                      {"name": "next", "type": ["null", "Node"]}]}


def shown(payload: bytes) -> dict[str, object]:
    async def lookup(schema_id: int, version: int | None) -> tuple[str, bytes]:
        assert (schema_id, version) == (7, 1)
        return "Avro", json.dumps(NODE).encode()

    record = pb.PeekedRecord(stored_topic="/default/t", offset=3, payload=payload, schema_id=7,
                             schema_version=1)
    return asyncio.run(Decoder(lookup).record(record))


def test_an_avro_value_is_decoded_with_its_schema() -> None:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(NODE), {"v": 1, "next": {"v": 2, "next": None}})
    got = shown(out.getvalue())
    assert got["decoded"] == {"v": 1, "next": {"v": 2, "next": None}} and got["schema_type"] == "avro"


def test_a_deeply_nested_payload_of_a_recursive_schema_is_shown_raw_with_why() -> None:
    payload = b"\x02\x02" * 50_000 + b"\x02\x00"  # v=1, next=Node ... 50,000 levels deep
    got = shown(payload)
    assert "decoded" not in got and "nested too deeply" in str(got["decode_error"])
    assert got["size"] == len(payload)

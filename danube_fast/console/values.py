"""A record as the console's message browser shows it: its fields as JSON, the value as base64 (the page
renders text, JSON or hex from the bytes itself), and the value decoded by the topic's registered Avro
schema when the record names one (with the writer's own version, read as the registry's payload check reads
it: schema/avro.py, safe for recursive schemas; docs/SCHEMAS.md). A value that does not decode is shown raw
with the reason, never dropped.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from danube_fast.errors import ApiError
from danube_fast.proto import SubscriptionAdmin_pb2 as pb
from danube_fast.schema import avro
from danube_fast.schema.errors import InvalidSchema

# (schema id, version) -> (schema type, definition), asked of the registry as the user
SchemaLookup = Callable[[int, int | None], Awaitable[tuple[str, bytes]]]


def jsonable(value: Any) -> Any:
    """An Avro datum in JSON's types: bytes as base64, times as ISO 8601, decimals and UUIDs as text."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    return value


class Decoder:
    """Avro values by the schema their record names, each schema parsed once per request."""

    def __init__(self, lookup: SchemaLookup) -> None:
        self._lookup = lookup
        self._parsed: dict[tuple[int, int | None], tuple[str, avro.AvroSchema | None]] = {}

    async def record(self, r: pb.PeekedRecord) -> dict[str, Any]:
        out: dict[str, Any] = {
            "stored_topic": r.stored_topic, "offset": r.offset, "publish_time_ms": r.publish_time_ms,
            "producer_name": r.producer_name, "key": r.key if r.HasField("key") else None,
            "attributes": dict(r.attributes), "size": len(r.payload),
            "value_b64": base64.b64encode(r.payload).decode(),
            "schema_id": r.schema_id if r.HasField("schema_id") else None,
            "schema_version": r.schema_version if r.HasField("schema_version") else None,
        }
        if r.HasField("schema_id"):
            out.update(await self._decoded(r.schema_id, out["schema_version"], r.payload))
        return out

    async def _decoded(self, schema_id: int, version: int | None, payload: bytes) -> dict[str, Any]:
        try:
            kind, parsed = await self._schema(schema_id, version)
        except (ApiError, InvalidSchema) as e:  # an unknown or refused schema leaves the value raw
            return {"decode_error": f"schema {schema_id} v{version}: {e}"}
        if parsed is None:
            return {"schema_type": kind}
        try:
            datum = avro.read_datum(parsed, payload)
        except avro.NotADatum as e:  # a record that does not match its schema is shown raw
            return {"schema_type": kind, "decode_error": f"schema {schema_id} v{version}: {e}"}
        return {"schema_type": kind, "decoded": jsonable(datum)}

    async def _schema(self, schema_id: int, version: int | None) -> tuple[str, avro.AvroSchema | None]:
        found = self._parsed.get((schema_id, version))
        if found is None:
            kind, definition = await self._lookup(schema_id, version)
            kind = kind.lower()
            parsed = avro.parse(json.loads(definition)) if kind == "avro" else None
            found = self._parsed[(schema_id, version)] = (kind, parsed)
        return found

"""`valueFormat=avro|json`: the `value` column decoded with the topics' registered schema.

Resolution, on the driver (`DataSource.schema()`, when the DataFrame is loaded): every stored topic of the
query must have a schema subject (`/topics/{ns}/{topic}/schema`), the same one for all of them, whose latest
version is of the kind valueFormat names (Avro, or JSON Schema). That version, the latest when the DataFrame
is loaded, fixes the column's Spark type (`value_type`) for the DataFrame's whole life; later versions are not
seen by it. The subject's definitions travel to the executors inside the options (RESOLVED_VALUE_SCHEMA, set
by `declared_schema`; reader() runs on the DataSource instance schema() returned), so executors never read
the metadata: an embedded store is a file on the driver's machine.

Decoding, on the executors, per decoded Arrow batch (fetch.py), is done by danube_fast.schema.arrow_values,
which maps the schema to an Arrow type (pyspark's `from_arrow_type` makes the Spark type of it) and decodes
the values into that; its docstring says how older Avro versions and JSON are read, and what it costs.
A value that does not decode (not valid Avro or JSON, bytes left over, a field of another type, a value
Spark's type cannot hold) is null, and counted in a warning per batch: not data loss (the record was read; its
bytes are not what the schema says), so failOnDataLoss does not apply.

Avro to Spark, as Spark's own Avro source (spark-avro's SchemaConverters) maps it:

| Avro                                          | Spark                                               |
|-----------------------------------------------|-----------------------------------------------------|
| null, boolean, int, long, float, double       | null, boolean, int, long, float, double             |
| bytes, fixed                                  | binary                                              |
| string, enum                                  | string                                              |
| record                                        | struct (fields not null unless a union with null)   |
| array, map                                    | array, map<string, T>                               |
| union [null, T]                               | T, nullable                                         |
| union of int and long / of float and double   | long / double (nullable with null)                  |
| any other union                               | struct<member0, ..., memberN> over the non-null     |
|                                               | branches, each nullable: the branch read is set     |
| timestamp-millis, timestamp-micros            | timestamp                                           |
| local-timestamp-millis, -micros               | timestamp_ntz                                       |
| date                                          | date                                                |
| decimal(p, s) on bytes or fixed (p <= 38)     | decimal(p, s)                                       |
| time-millis / time-micros                     | int / long (ms / us after midnight)                 |
| uuid on string                                | string                                              |
A recursive record has no Spark type: resolution fails.

JSON Schema to Spark (every field nullable): `object` with `properties` -> struct of them in their order,
`string` -> string, `integer` -> long, `number` -> double, `boolean` -> boolean, `array` with one `items`
schema -> array, `"type": [X, "null"]` -> X. Anything else (no type, several types, oneOf/anyOf/allOf/not/
$ref, an object without properties, tuple items, a boolean schema) -> string holding the JSON text of that
part: the payload itself at the top, a compact re-serialisation (json.dumps) inside.
"""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.types import DataType, StructType

from danube_fast.access.metadata import MetadataReader, SchemaKind, SchemaMetadata, TopicSchemaConfig, keys
from danube_fast.access.tables import AvroDecoder, JsonDecoder, Resolved, ValueSchemaError, arrow_values
from pyspark_danube import columns, options
from pyspark_danube.plan import stored_topics

_KIND = {"avro": SchemaKind.AVRO, "json": SchemaKind.JSON_SCHEMA}
_KIND_NAME = {SchemaKind.AVRO: "avro", SchemaKind.JSON_SCHEMA: "json_schema"}


# -- the driver: resolution ----------------------------------------------------------------------------------


def declared_schema(raw: MutableMapping[str, str]) -> StructType:
    """The DataFrame's columns for the user's options `raw`. With valueFormat avro or json, `value` is typed
    by the subject resolved now, and the resolution is stored into `raw` (RESOLVED_VALUE_SCHEMA) for the
    readers that Spark makes from this DataSource instance."""
    value_format = next((v for k, v in raw.items() if k.lower() == "valueformat"), "binary")
    if value_format.lower() == "binary":
        return columns.SCHEMA
    opts = options.parse(raw)
    resolved = asyncio.run(_resolve(opts))
    raw[options.RESOLVED_VALUE_SCHEMA] = resolved.to_json()
    return columns.with_value(value_type(resolved))


async def _resolve(opts: options.Options) -> Resolved:
    from danube_fast.access.metadata import open_reader

    meta = await open_reader(opts.metadata_store, access=opts.etcd)
    try:
        return await resolve(meta, opts)
    finally:
        await meta.close()


async def resolve(meta: MetadataReader, opts: options.Options) -> Resolved:
    """The subject of the topics `opts` names, checked against valueFormat (ValueSchemaError, naming the
    topics, when it cannot be used)."""
    fmt = opts.value_format
    by_subject: dict[str | None, list[str]] = {}
    for s in await stored_topics(meta, opts):
        kv = await meta.get(keys.topic_schema(s.namespace, s.short))
        subject = TopicSchemaConfig.from_json(kv.value, key=kv.key).schema_subject if kv else None
        by_subject.setdefault(subject, []).append(s.name)
    if None in by_subject:
        raise ValueSchemaError(
            f"valueFormat={fmt}: topic {', '.join(by_subject[None])} has no schema subject, so its values "
            "have no schema to decode with (a producer with a schema subject, or ConfigureTopicSchema, "
            "sets one); read it with valueFormat=binary")
    if len(by_subject) > 1:
        listed = "; ".join(f"{', '.join(topics)} use {subject!r}" for subject, topics in by_subject.items())
        raise ValueSchemaError(f"valueFormat={fmt}: the topics of one query must share a schema subject, "
                               f"and {listed}: read them in separate queries")
    ((subject, topics),) = by_subject.items()
    assert subject is not None
    kv = await meta.get(keys.schema_metadata(subject))
    if kv is None:
        raise ValueSchemaError(f"valueFormat={fmt}: schema subject {subject!r} of topic {', '.join(topics)} "
                               "is not registered")
    registered = SchemaMetadata.from_json(kv.value, key=kv.key)
    latest = max(registered.versions, key=lambda v: v.version)
    kind = _KIND[fmt]
    if latest.schema_def.kind is not kind:
        found = latest.schema_def.kind
        other = next((f for f, k in _KIND.items() if k is found), None)
        raise ValueSchemaError(
            f"valueFormat={fmt}: schema subject {subject!r} of topic {', '.join(topics)} holds "
            f"{_KIND_NAME.get(found, found.value.lower())} schemas (version {latest.version})" +
            (f"; use valueFormat={other}" if other else ""))
    kept = registered.versions if fmt == "avro" else (latest,)
    definitions = {v.version: v.schema_def.raw_schema for v in kept
                   if v.schema_def.kind is kind and v.schema_def.raw_schema is not None}
    resolved = Resolved(fmt, subject, registered.id, latest.version, definitions)
    try:
        value_type(resolved)
    except ValueSchemaError as e:
        raise ValueSchemaError(f"valueFormat={fmt}: schema subject {subject!r} version {latest.version}: "
                               f"{e}") from e
    return resolved


def value_type(resolved: Resolved) -> DataType:
    """The Spark type of the `value` column: pyspark's conversion of the latest version's Arrow type, which
    gives the types the module docstring lists."""
    return from_arrow_type(arrow_values.arrow_type(resolved))


# -- the executors -------------------------------------------------------------------------------------------


def decoder(opts: options.Options, value_type: pa.DataType) -> AvroDecoder | JsonDecoder | None:
    """The value decoder of a chunk whose `value` column has Arrow type `value_type`; None for binary."""
    if opts.value_format == "binary":
        return None
    if opts.value_schema is None:
        raise ValueSchemaError(f"valueFormat={opts.value_format}: no value schema was resolved on the "
                               "driver; a schema given with .schema(...) cannot be used with valueFormat")
    return arrow_values.decoder_for(opts.value_schema, value_type)

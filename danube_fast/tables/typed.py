"""Schema mode's columns (docs/TABLES.md, "Schema mode"): the envelope without `value`, plus the value decoded
with the topic's registered Avro or JSON Schema as typed columns; a record that does not decode goes whole,
in envelope form, to the dead-letter table.

- The value's Arrow type is the schema registry's latest version mapped as the Spark source maps it
  (danube_fast/schema/arrow_values.py). A record (struct) becomes its fields, one column each; any other
  type one column `value`. A field named like an envelope column is renamed `value_<name>`.
- Every value column is optional, nested fields too: a later version may drop a field, and Iceberg only
  lets a table gain optional columns. The table's columns are the union, by name, of every version the
  writer has seen (pyiceberg's `union_by_name`): a version's new fields become new columns, a wider type
  (int to long, float to double) widens its column, anything else is refused with the two types named.
- Rows are then conformed to the table's current columns: a column a version lacks is null.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from danube_fast.meta import keys
from danube_fast.meta.resources import SchemaKind, SchemaMetadata, TopicSchemaConfig
from danube_fast.schema.arrow_values import Resolved, ValueSchemaError, arrow_type, decoder_for
from danube_fast.tables.envelope import ARROW_SCHEMA
from danube_fast.tables.errors import SchemaModeError

if TYPE_CHECKING:
    from danube_fast.meta.store import MetadataStore

ENVELOPE_COLUMNS = [f for f in ARROW_SCHEMA if f.name != "value"]
RESERVED = {f.name for f in ARROW_SCHEMA}
_FORMATS = {SchemaKind.AVRO: "avro", SchemaKind.JSON_SCHEMA: "json"}


async def resolve(store: MetadataStore, namespace: str, short: str) -> Resolved:
    """The schema subject of stored topic `short` with every version's definition (the writer schemas of
    older records) and its latest version (the columns)."""
    kv = await store.get(keys.topic_schema(namespace, short))
    subject = TopicSchemaConfig.from_json(kv.value, key=kv.key).schema_subject if kv else None
    if not subject:
        raise SchemaModeError(f"/{namespace}/{short} has no schema subject: table mode schema needs one (a "
                              "producer with a schema subject, or ConfigureTopicSchema, sets it); use table "
                              "mode envelope for untyped values")
    got = await store.get(keys.schema_metadata(subject))
    if got is None:
        raise SchemaModeError(f"schema subject {subject!r} of /{namespace}/{short} is not registered")
    registered = SchemaMetadata.from_json(got.value, key=got.key)
    latest = max(registered.versions, key=lambda v: v.version)
    kind = latest.schema_def.kind
    if kind not in _FORMATS:
        raise SchemaModeError(f"schema subject {subject!r} of /{namespace}/{short} holds {kind.value} "
                              f"schemas (version {latest.version}): table mode schema reads Avro and JSON "
                              "Schema; use table mode envelope")
    definitions = {v.version: v.schema_def.raw_schema for v in registered.versions
                   if v.schema_def.kind is kind and v.schema_def.raw_schema is not None}
    resolved = Resolved(_FORMATS[kind], subject, registered.id, latest.version, definitions)
    value_columns(resolved)  # refused now, with the version named, rather than at the first commit
    return resolved


def value_columns(resolved: Resolved) -> pa.Schema:
    """The value's columns (module docstring), all optional."""
    try:
        value = arrow_type(resolved)
    except ValueSchemaError as e:
        raise SchemaModeError(f"schema subject {resolved.subject!r} version {resolved.version}: {e}") from e
    if not pa.types.is_struct(value):
        return pa.schema([pa.field("value", _optional(value, f"{resolved.subject}'s values"))])
    return pa.schema([pa.field(column_name(f.name), _optional(f.type, f"{resolved.subject} field {f.name}"))
                      for f in value])


def column_name(field: str) -> str:
    """The column of a record's field: its name, or `value_<name>` when an envelope column has that name."""
    return f"value_{field}" if field in RESERVED else field


def _optional(t: pa.DataType, where: str) -> pa.DataType:
    if pa.types.is_null(t):
        raise SchemaModeError(f"{where} is always null (Avro type null): an Iceberg column cannot have that "
                              "type")
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _optional(f.type, f"{where}.{f.name}")) for f in t])
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _optional(t.value_type, f"{where}[]")))
    if pa.types.is_map(t):
        return pa.map_(t.key_type, pa.field(t.item_field.name, _optional(t.item_type, f"{where}{{}}")))
    return t


@dataclass(frozen=True)
class Split:
    """One commit's records, decoded."""

    typed: pa.Table  # the envelope's columns but `value`, then the value columns (value_columns' names)
    dead: pa.Table  # the records that did not decode, in envelope form
    reason: str | None  # why the first of them did not


def split(rows: pa.Table, resolved: Resolved, columns: pa.Schema) -> Split:
    """`rows` (envelope form) decoded with `resolved` into its `columns` (value_columns)."""
    value_type = arrow_type(resolved)
    decoder = decoder_for(resolved.to_json(), value_type)
    typed_batches, dead_batches = [], []
    reason = None
    schema = pa.schema([*ENVELOPE_COLUMNS, *columns])
    for batch in rows.to_batches():
        decoded = decoder.decode(batch)
        good = pc.invert(_mask(decoded.bad, batch.num_rows))
        if decoded.failed:
            dead_batches.append(batch.take(decoded.bad))
            reason = reason or decoded.reason
        values = decoded.values
        if pa.types.is_struct(value_type):
            parts = [pc.struct_field(values, [i]) for i in range(value_type.num_fields)]
        else:
            parts = [values]
        arrays = [batch.column(f.name) for f in ENVELOPE_COLUMNS]
        arrays += [p.cast(f.type) if p.type != f.type else p for p, f in zip(parts, columns, strict=True)]
        typed_batches.append(pa.RecordBatch.from_arrays(arrays, schema=schema).filter(good))
    return Split(pa.Table.from_batches(typed_batches, schema=schema),
                 pa.Table.from_batches(dead_batches, schema=ARROW_SCHEMA), reason)


def _mask(bad: pa.Array, n: int) -> pa.BooleanArray:
    flags = np.zeros(n, dtype=bool)
    flags[bad.to_numpy(zero_copy_only=False)] = True
    return pa.array(flags)


def newest_version(rows: pa.Table) -> int | None:
    """The highest schema version among `rows`: a writer that knows an older latest reads the registry
    again before it decodes (else the newer records would look undecodable)."""
    got = pc.max(rows.column("schema_version")).as_py() if rows.num_rows else None
    return None if got is None else int(got)


def conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """`rows` with exactly `schema`'s columns (the table's): missing ones null, narrower types widened."""
    arrays = []
    for f in schema:
        if f.name in rows.column_names:
            arrays.append(_conform(rows.column(f.name).combine_chunks(), f.type))
        else:
            arrays.append(pa.nulls(rows.num_rows, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _conform(array: pa.Array, t: pa.DataType) -> pa.Array:
    if array.type == t:
        return array
    if pa.types.is_struct(t) and pa.types.is_struct(array.type):
        names = {array.type.field(i).name: i for i in range(array.type.num_fields)}
        children = [_conform(pc.struct_field(array, [names[f.name]]), f.type) if f.name in names
                    else pa.nulls(len(array), f.type) for f in t]
        return pa.StructArray.from_arrays(children, fields=list(t), mask=array.is_null())
    if pa.types.is_list(t) and pa.types.is_list(array.type):
        offsets = pc.subtract(array.offsets, array.offsets[0]) if len(array) else array.offsets
        values = array.values.slice(array.offsets[0].as_py(), array.offsets[-1].as_py() -
                                    array.offsets[0].as_py()) if len(array) else array.values
        return pa.ListArray.from_arrays(offsets, _conform(values, t.value_type), type=t,
                                        mask=array.is_null())
    return array.cast(t)

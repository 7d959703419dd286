"""Topic tables and schema-typed values, for readers outside the package (danube_fast/access). Importing it
imports pyarrow and pyiceberg (the typed values, the envelope's Iceberg schema)."""

from danube_fast.schema import arrow_values
from danube_fast.schema.arrow_values import AvroDecoder, JsonDecoder, Resolved, ValueSchemaError
from danube_fast.tables.catalog import (
           FORMAT_PROPERTY,
           MODE_PROPERTY,
           committed_offsets,
           file_io,
           open_catalog,
           snapshot_offsets,
)
from danube_fast.tables.commit import snapshots
from danube_fast.tables.typed import column_name

__all__ = ["FORMAT_PROPERTY", "MODE_PROPERTY", "AvroDecoder", "JsonDecoder", "Resolved",
           "ValueSchemaError", "arrow_values", "column_name", "committed_offsets", "file_io", "open_catalog",
           "snapshot_offsets", "snapshots"]

"""The codec's Arrow side, shared by both cores (_frames.pyx and _frames_py.py): pyarrow imported on first
use, and ARROW_SCHEMA, the schema of `decode_arrow`'s batches (docs/FORMAT.md, "Arrow view").

Why lazily: only decoding to Arrow needs pyarrow, and importing it cost every `danube-fast` call and every
broker start about 65 ms (`danube-fast admin --help` took 0.41 s; 0.23 s without it and the broker's own
imports).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

_schema: pa.Schema | None = None


def pyarrow() -> Any:
    import pyarrow

    return pyarrow


def arrow_schema() -> pa.Schema:
    """ARROW_SCHEMA, built on first use."""
    global _schema
    if _schema is None:
        pa = pyarrow()
        _schema = pa.schema([
            pa.field("offset", pa.int64(), nullable=False),
            pa.field("timestamp", pa.timestamp("ms"), nullable=False),
            pa.field("key", pa.string()),
            pa.field("value", pa.binary(), nullable=False),
            pa.field("producer", pa.string(), nullable=False),
            pa.field("attributes", pa.map_(pa.string(), pa.string())),
            pa.field("schema_id", pa.int64()),
            pa.field("schema_version", pa.int64()),
        ])
    return _schema

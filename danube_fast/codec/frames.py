"""The record-batch codec: native (Cython) unless DANUBE_FAST_PURE=1 selects the pure-Python twin.

Import the codec from here, never from `_frames` or `_frames_py` directly, so the switch applies everywhere.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

PURE = os.environ.get("DANUBE_FAST_PURE", "") == "1"

# The type checker reads the native module's .pyi; the twin implements the same API.
if PURE and not TYPE_CHECKING:
    from danube_fast.codec._frames_py import (
        COMPRESSIONS,
        HEADER_SIZE,
        MAGIC,
        MAX_BATCH_BYTES,
        VERSION,
        BatchHeader,
        Record,
        arrow_schema,
        crc32c,
        decode_arrow,
        decode_arrow_chunks,
        decode_records,
        encode_batch,
        encode_payloads,
        fill_room,
        iter_records,
        join_after_room,
        parse_header,
        scan_batches,
        span,
        stamp_base_offset,
        verify_batch,
    )
else:
    from danube_fast.codec._frames import (
        COMPRESSIONS,
        HEADER_SIZE,
        MAGIC,
        MAX_BATCH_BYTES,
        VERSION,
        BatchHeader,
        Record,
        arrow_schema,
        crc32c,
        decode_arrow,
        decode_arrow_chunks,
        decode_records,
        encode_batch,
        encode_payloads,
        fill_room,
        iter_records,
        join_after_room,
        parse_header,
        scan_batches,
        span,
        stamp_base_offset,
        verify_batch,
    )

IMPL = "pure" if PURE else "native"

if TYPE_CHECKING:
    import pyarrow as pa

    ARROW_SCHEMA: pa.Schema


def __getattr__(name: str) -> object:
    """ARROW_SCHEMA on first use: pyarrow is imported only by what decodes to Arrow (see _frames.pyx)."""
    if name == "ARROW_SCHEMA":
        return arrow_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "ARROW_SCHEMA", "COMPRESSIONS", "HEADER_SIZE", "IMPL", "MAGIC", "MAX_BATCH_BYTES", "VERSION",
    "BatchHeader", "Record", "arrow_schema", "crc32c", "decode_arrow", "decode_arrow_chunks",
    "decode_records", "encode_batch", "encode_payloads", "fill_room", "iter_records", "join_after_room",
    "parse_header", "scan_batches", "span", "stamp_base_offset", "verify_batch",
]

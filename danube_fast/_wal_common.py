"""Plain result types shared by the native WAL engine (_wal.pyx) and its twin (_wal_py.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".idx"
INDEX_ENTRY_BYTES = 8  # relative offset u32 + file position u32, little-endian


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


@dataclass
class RecoveryReport:
    """What opening the log found and did. A cut is also logged as a warning."""

    segments: int = 0
    next_offset: int = 0
    scanned_bytes: int = 0
    truncated_segment: int | None = None
    truncated_from: int | None = None
    truncated_bytes: int = 0
    cut_reason: str | None = None
    rebuilt_indexes: list[int] = field(default_factory=list)


@dataclass
class AppendResult:
    """One group append: per input buffer its (first, last) offsets or the error that rejected it, and the
    stamped bytes exactly as written (records first_offset .. next_offset - 1), None if nothing was valid."""

    ranges: list[tuple[int, int] | Exception]
    data: bytes | None
    first_offset: int
    next_offset: int

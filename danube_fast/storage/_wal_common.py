"""Result types and file naming shared by the WAL policy (storage/segmented_log.py) and its two cores."""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from danube_fast.codec import _frames_py
from danube_fast.codec.fast_wire import RECORDS_ROOM

if TYPE_CHECKING:
    from typing_extensions import Buffer

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".idx"
INDEX_ENTRY_BYTES = 8  # relative offset u32 + file position u32, little-endian
INDEX_RESERVE_MAX_STEP = 64 * 1024  # the index's reservation grows by at most this much at a time
# Free bytes in front of the batches of a buffered read of the native engine, in the same bytes object: a fast
# API response writes its framing there instead of copying 1 MiB behind it.
READ_ROOM = RECORDS_ROOM


# The header fields needed to walk a log without decoding it: base_offset (byte 0), batch_length (12),
# magic (16), version (17) and record_count (20); the pad bytes skip crc and flags. Layout: docs/FORMAT.md.
PEEK_HEADER = struct.Struct("<Q4xIBB2xI")
AHEAD = 4 << 20  # read-ahead step of sequential reads (see _wal.pyx, Segment.read)


def plausible(magic: int, version: int, length: int, count: int) -> bool:
    """A header walked without its CRC (sealed data, already verified once) must at least look like one; a
    zero length would otherwise walk in place forever."""
    return (magic == _frames_py.MAGIC and version == _frames_py.VERSION and length >= _frames_py.HEADER_SIZE
            and count > 0)


def advise_ahead(fd: int, pos: int, end: int, size: int) -> None:
    """A sequential reader that read [pos, end) of a file of `size` bytes gets the next AHEAD..2*AHEAD bytes
    asked of the device once per step, as _wal.pyx's Segment.read does (direct appends leave recent data
    out of the page cache, and the kernel's own read-ahead fell far behind the device)."""
    step = end // AHEAD * AHEAD
    if (pos < step or pos % AHEAD == 0) and step < size:
        os.posix_fadvise(fd, step, min(2 * AHEAD, size - step), os.POSIX_FADV_WILLNEED)


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def index_reservation(reserved: int, needed: int, size: int) -> int:
    """How far from its start the active index file must have disk blocks (posix_fallocate from `reserved`)
    so that its first `needed` bytes can be written; at most `size`, the file's length.

    The index is a sparse file written through a shared mapping, and a store into a page that has no block on
    a full disk is answered with SIGBUS, which kills the process. So the engines reserve the
    blocks of every page before an entry goes into it, and ENOSPC becomes an error the caller gets. The whole
    index is not reserved up front: that would cost `index_max_bytes` of disk per open segment (10 GB at
    10,000 topics with the default 1 MiB). The reservation starts at one page, the one the first entry would
    fault in anyway, and doubles, in whole pages (a store faults in a whole page), up to steps of
    INDEX_RESERVE_MAX_STEP: a quiet topic holds what it did before, a busy one calls posix_fallocate a few
    times per segment.
    """
    step = min(max(reserved, mmap.PAGESIZE), max(INDEX_RESERVE_MAX_STEP, mmap.PAGESIZE))
    return min(size, -(-needed // step) * step)


@dataclass
class AppendResult:
    """One group append: per input buffer its (first, last) offsets or the error that rejected it, and the
    stamped bytes exactly as written (records first_offset .. next_offset - 1), None if nothing was valid."""

    ranges: list[tuple[int, int] | Exception]
    data: Buffer | None  # bytes, or (native, direct appends) a read-only bytes-like laid out for O_DIRECT
    first_offset: int
    next_offset: int

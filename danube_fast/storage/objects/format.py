"""The `.dnb1` object: a slice of a topic's WAL as uploaded to the object tier.

The byte layout (header, body of WAL batches, footer with a sparse index and a CRC, trailer) is written once,
in docs/FORMAT.md, section "Object tier"; the constants below name its sizes.

A reader finds the footer with one ranged GET of the object's tail (FOOTER_GUESS bytes hold the trailer and
the footer of any object with up to ~4,000 index entries; a longer footer takes a second GET of exactly its
length). Index positions are absolute, so the object descriptor's `offset_index` (the same pairs) turns an
offset into a ranged GET without reading the footer at all: each range between two index positions, or from
one to body_end, holds whole batches.

Owner: nothing here holds state; the uploader builds objects, readers parse them.
"""

from __future__ import annotations

import bisect
import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from danube_fast.codec import frames
from danube_fast.errors import FrameCorrupt, ObjectCorrupt

Buffer = bytes | bytearray | memoryview

MAGIC = b"DNB1"
VERSION = 1
_HEADER = struct.Struct("<4sHH")
_FOOTER_FIXED = struct.Struct("<QQQQQII")
_INDEX_ENTRY = struct.Struct("<QQ")
_CRC = struct.Struct("<I")
_TRAILER = struct.Struct("<I4s")
HEADER_SIZE = _HEADER.size  # 8
HEADER = _HEADER.pack(MAGIC, VERSION, 0)  # the first bytes of every object, and of every WAL segment
FOOTER_FIXED_SIZE = _FOOTER_FIXED.size  # 48
TRAILER_SIZE = _TRAILER.size  # 8
FOOTER_GUESS = 64 * 1024
DEFAULT_INDEX_INTERVAL = 256 * 1024  # a cloud read fetches at most this much before the wanted batch


@dataclass(frozen=True)
class Footer:
    min_offset: int
    max_offset: int
    min_time: int
    max_time: int
    body_end: int
    batch_count: int
    index: tuple[tuple[int, int], ...]

    @property
    def length(self) -> int:
        """Bytes of the footer, CRC included (the trailer's footer_length)."""
        return FOOTER_FIXED_SIZE + _INDEX_ENTRY.size * len(self.index) + _CRC.size

    @property
    def object_size(self) -> int:
        return self.body_end + self.length + TRAILER_SIZE


@dataclass(frozen=True)
class BuiltObject:
    """An object as the parts it is stored from: its header, the body's chunks as they were given (not
    copied), and the footer with the trailer; `size` bytes in all. An object store writes the parts without
    joining them (ObjectStore.put_parts)."""

    parts: tuple[Buffer, ...]
    footer: Footer

    @property
    def size(self) -> int:
        return self.footer.object_size

    @functools.cached_property
    def data(self) -> bytes:
        """The object's bytes in one buffer (joined on first use: a copy of the whole object)."""
        return b"".join(self.parts)


def build_object(body: Buffer | Sequence[Buffer], index_interval: int = DEFAULT_INDEX_INTERVAL, *,
                 verify: bool = True) -> BuiltObject:
    """An object holding the whole batches of `body`: one buffer, or chunks of whole batches that follow each
    other (kept as they are: the object is not joined). Every batch's framing is checked, and its CRC and
    records too when `verify`. Raises FrameCorrupt for a bad body (the position counts from the body's
    start) and ValueError for an empty one or one whose offsets are not contiguous."""
    if index_interval <= 0:
        raise ValueError(f"index_interval must be positive, not {index_interval}")
    chunks = [body] if isinstance(body, bytes | bytearray | memoryview) else list(body)
    index: list[tuple[int, int]] = []
    indexed_at = -index_interval
    first: frames.BatchHeader | None = None
    expected = min_time = max_time = batch_count = base = 0
    for chunk in chunks:
        for h in _scan_chunk(chunk, base, verify):
            position = base + h.position
            if first is None:
                first, expected = h, h.base_offset
                min_time, max_time = h.base_timestamp, h.max_timestamp
            elif h.base_offset != expected:
                raise ValueError(f"batch at byte {position} starts at offset {h.base_offset}, not "
                                 f"{expected}: an object's offsets are contiguous")
            expected = h.base_offset + h.record_count
            min_time, max_time = min(min_time, h.base_timestamp), max(max_time, h.max_timestamp)
            batch_count += 1
            if position - indexed_at >= index_interval:
                index.append((h.base_offset, HEADER_SIZE + position))
                indexed_at = position
        base += memoryview(chunk).nbytes
    if first is None:
        raise ValueError("an object holds at least one batch")
    footer = Footer(first.base_offset, expected - 1, min_time, max_time, HEADER_SIZE + base, batch_count,
                    tuple(index))
    parts = [HEADER, *(c for c in chunks if memoryview(c).nbytes),
             encode_footer(footer)]
    return BuiltObject(tuple(parts), footer)


def _scan_chunk(chunk: Buffer, base: int, verify: bool) -> list[frames.BatchHeader]:
    """scan_batches of one body chunk that starts at body byte `base`; a FrameCorrupt names the body
    position."""
    try:
        return frames.scan_batches(chunk, verify=verify)
    except FrameCorrupt as e:
        if not base:
            raise
        message = str(e).removesuffix(f" (batch at byte {e.position})")
        raise FrameCorrupt(f"{message}, in the body chunk at byte {base}", base + e.position) from e


def encode_footer(footer: Footer) -> bytes:
    """The footer, its CRC and the trailer: the bytes that follow the body."""
    fixed = _FOOTER_FIXED.pack(footer.min_offset, footer.max_offset, footer.min_time, footer.max_time,
                               footer.body_end, footer.batch_count, len(footer.index))
    entries = b"".join(_INDEX_ENTRY.pack(offset, position) for offset, position in footer.index)
    crc = frames.crc32c(entries, frames.crc32c(fixed))
    return b"".join([fixed, entries, _CRC.pack(crc), _TRAILER.pack(footer.length, MAGIC)])


def footer_length(tail: Buffer) -> int:
    """How many bytes from the object's end hold the footer and the trailer, from the trailer at the end of
    `tail` (the last bytes of the object). Raises ObjectCorrupt."""
    view = memoryview(tail)
    if len(view) < TRAILER_SIZE:
        raise ObjectCorrupt(f"an object tail of {len(view)} bytes holds no trailer")
    length, magic = _TRAILER.unpack_from(view, len(view) - TRAILER_SIZE)
    if magic != MAGIC or length < FOOTER_FIXED_SIZE + _INDEX_ENTRY.size + _CRC.size:
        raise ObjectCorrupt(f"not a .dnb1 trailer: magic {magic!r}, footer length {length}")
    return int(length) + TRAILER_SIZE


def parse_footer(tail: Buffer) -> Footer:
    """The footer from the last bytes of an object (at least `footer_length(tail)` of them), CRC checked.
    Raises ObjectCorrupt."""
    view = memoryview(tail)
    need = footer_length(view)
    if len(view) < need:
        raise ObjectCorrupt(f"the footer needs the last {need} bytes of the object, got {len(view)}")
    footer = view[len(view) - need : len(view) - TRAILER_SIZE]
    (stored,) = _CRC.unpack_from(footer, len(footer) - _CRC.size)
    if frames.crc32c(footer[: len(footer) - _CRC.size]) != stored:
        raise ObjectCorrupt("the object footer fails its CRC32C")
    min_offset, max_offset, min_time, max_time, body_end, batches, count = _FOOTER_FIXED.unpack_from(footer)
    if FOOTER_FIXED_SIZE + _INDEX_ENTRY.size * count + _CRC.size != len(footer):
        raise ObjectCorrupt(f"the footer's {count} index entries do not fill its {len(footer)} bytes")
    index = tuple(_INDEX_ENTRY.iter_unpack(footer[FOOTER_FIXED_SIZE : len(footer) - _CRC.size]))
    if max_offset < min_offset or not batches or index[0] != (min_offset, HEADER_SIZE) or \
            any(not HEADER_SIZE <= pos < body_end for _, pos in index):
        raise ObjectCorrupt(f"inconsistent object footer: offsets {min_offset}..{max_offset}, "
                            f"body_end {body_end}, index {index[:3]}...")
    return Footer(min_offset, max_offset, min_time, max_time, body_end, batches, index)


def check_header(data: Buffer) -> None:
    """ObjectCorrupt unless `data` starts with a .dnb1 header of a version this reader knows."""
    view = memoryview(data)
    if len(view) < HEADER_SIZE:
        raise ObjectCorrupt(f"an object of {len(view)} bytes holds no header")
    magic, version, flags = _HEADER.unpack_from(view)
    if magic != MAGIC or version != VERSION or flags != 0:
        raise ObjectCorrupt(f"not a .dnb1 v{VERSION} object: magic {magic!r}, version {version}, "
                            f"flags {flags}")


def scan_body(body: Buffer) -> list[frames.BatchHeader]:
    """Headers of the whole batches filling `body` (a byte range of an object that starts and ends at batch
    boundaries), each verified. Raises ObjectCorrupt: the store returned bytes the uploader did not write."""
    try:
        return frames.scan_batches(body, verify=True)
    except FrameCorrupt as e:
        raise ObjectCorrupt(f"an object's batches fail validation: {e}") from e


def select_batches(body: Buffer, headers: list[frames.BatchHeader], offset: int,
                   max_bytes: int) -> tuple[memoryview, int] | None:
    """Whole batches of `body` (described by `headers`, from scan_body) from the one holding `offset` (or the
    first one after it), about max_bytes but at least one batch; with the offset after the last record
    returned. None when every batch lies below `offset`."""
    i = max(bisect.bisect_right(headers, offset, key=lambda h: h.base_offset) - 1, 0)
    if i < len(headers) and headers[i].base_offset + headers[i].record_count <= offset:
        i += 1
    if i == len(headers):
        return None
    start = headers[i].position
    # j: one past the last batch that ends within max_bytes of start (at least batch i).
    j = max(bisect.bisect_right(headers, start + max_bytes, key=lambda h: h.position + h.length, lo=i), i + 1)
    last = headers[j - 1]
    return memoryview(body)[start : last.position + last.length], last.base_offset + last.record_count


def clip_batches(data: Buffer, low: int, limit: int, room: int, whole: bool) -> tuple[memoryview, int]:
    """The whole batches of `data` (a WAL read: it may begin before `low`) that hold offsets at or after `low`
    and start below `limit`, within `room` bytes (the first one regardless when `whole`: an object holds at
    least one batch); with the offset after the last record kept. Headers only: no CRC, no record walk."""
    start = end = -1
    next_offset = low
    for h in frames.scan_batches(data, verify=False):
        if h.base_offset + h.record_count <= low:
            continue
        if h.base_offset >= limit:
            break
        if start < 0:
            start = h.position
        if h.end - start > room and not (whole and end < 0):
            break
        end = h.end
        next_offset = h.base_offset + h.record_count
    if end < 0:
        return memoryview(b""), low
    return memoryview(data)[start:end], next_offset

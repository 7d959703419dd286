"""Whole batches named as a byte range of their segment file instead of read into memory, for a connection
that sends them with sendfile() (docs/TRANSPORT.md, "Catch-up with sendfile").

A consumer far behind the tail reads from segment files: a buffered read copies the batches from the page
cache into a bytes object, and the socket write copies them again into the kernel. Named as (descriptor,
position, length), they go from the page cache to the socket in the kernel (the native transport's
`services/native_sendfile.py`), neither copy in the broker's process.

`find` walks the batch headers alone (a pread of one header per batch), so it is for large batches: it
gives up (None: read the usual way) when the batch holding the offset is smaller than MIN_BATCH_BYTES, and
stops at MAX_BATCHES headers. The span holds a descriptor of its own (a dup), so retention unlinking the
segment or the log closing meanwhile does not change what it sends; the descriptor is closed by `close`,
or when the span is collected unsent (a dropped read-ahead).
"""

from __future__ import annotations

import os
import struct
import weakref
from typing import TYPE_CHECKING

from danube_fast.codec import frames
from danube_fast.errors import WalCorrupt
from danube_fast.storage._wal_common import PEEK_HEADER, advise_ahead, plausible

if TYPE_CHECKING:
    from typing_extensions import Buffer

_U64 = struct.Struct("<Q")  # base_offset at byte 0, base_timestamp at 24 of a header (docs/FORMAT.md)
MIN_BATCH_BYTES = 64 * 1024  # smaller batches: one pread of many costs less than a header walk
MAX_BATCHES = 64  # headers walked per span at most


class FileSpan:
    """`length` bytes of whole batches at `position` of a segment file (`fd`, this span's own descriptor);
    the first batch may begin before the offset asked for. `head`: the first batch's header (`first_batch`
    reads it: frames.parse_header would want the whole batch in memory)."""

    def __init__(self, fd: int, position: int, length: int, head: bytes) -> None:
        self.fd = fd
        self.position = position
        self.length = length
        self.head = head
        self._closer = weakref.finalize(self, os.close, fd)

    def __len__(self) -> int:
        return self.length

    def read(self, skip: int = 0) -> bytes:
        """The span's bytes from `skip` on (what a transport that cannot send the file gets)."""
        want = self.length - skip
        parts: list[bytes] = []
        while want > 0:
            got = os.pread(self.fd, want, self.position + self.length - want)
            if not got:
                raise WalCorrupt(f"a segment file ended {want} bytes before a span of it")
            parts.append(got)
            want -= len(got)
        return b"".join(parts)

    def close(self) -> None:
        self._closer()


def first_batch(buf: Buffer | FileSpan) -> tuple[int, int]:
    """(base offset, base timestamp) of the first batch of a read: its header parsed (frames.parse_header,
    which wants the whole batch in memory), or a span's, checked when the span was found."""
    if isinstance(buf, FileSpan):
        base, = _U64.unpack_from(buf.head, 0)
        timestamp, = _U64.unpack_from(buf.head, 24)
        return base, timestamp
    h = frames.parse_header(buf)
    return h.base_offset, h.base_timestamp


def find(fd: int, pos: int, size: int, offset: int, max_bytes: int, limit: int, path: str
         ) -> tuple[FileSpan, int] | None:
    """A span of the whole batches from the one holding `offset`, walking from the indexed batch at `pos`
    within the file's first `size` bytes (`fd`, not taken: the span dups it): at most max_bytes (at least one
    batch), all below `limit`; with the offset after its last record. None when there is no such batch, or
    the batch holding `offset` is small (read it instead)."""
    while True:  # to the batch holding `offset`
        got = _head(fd, pos, size, path)
        if got is None:
            return None
        base, length, count, head = got
        if base >= limit:
            return None
        if base + count > offset:
            break
        pos += length
    if length < MIN_BATCH_BYTES:
        return None
    start, first_head, end, next_offset = pos, head, pos + length, base + count
    for _ in range(MAX_BATCHES - 1):  # then the batches that fit in max_bytes, as Segment.read cuts them
        got = _head(fd, end, size, path)
        if got is None:
            break
        base, length, count, _ = got
        if base >= limit or end + length - start > max_bytes:
            break
        end += length
        next_offset = base + count
    # (without it, sendfile of data direct appends left out of the page cache ran at ~40% of a buffered read)
    advise_ahead(fd, start, end, size)
    return FileSpan(os.dup(fd), start, end - start, first_head), next_offset


def _head(fd: int, pos: int, size: int, path: str) -> tuple[int, int, int, bytes] | None:
    """(base offset, length, count, header bytes) of the batch at `pos`; None past `size`."""
    if pos + frames.HEADER_SIZE > size:
        return None
    head = os.pread(fd, frames.HEADER_SIZE, pos)
    if len(head) != frames.HEADER_SIZE:
        return None
    base, length, magic, version, count = PEEK_HEADER.unpack_from(head)
    if not plausible(magic, version, length, count):
        raise WalCorrupt(f"segment {path} is damaged at byte {pos}")
    if pos + length > size:
        return None
    return base, length, count, head

"""The data files a table commit names are made durable before the commit, a few MiB at a time.

Two reasons, both measured (docs/TABLES.md, "Freshness and pacing"):
- A commit must not name files a power loss can take back: the catalog's swap is durable (SQLite or the
  metadata store), the Parquet files pyiceberg writes through its FileIO are not fsynced by it.
- Left to the kernel, a commit's hundred-odd MB of Parquet are written back in one burst by the periodic
  flusher (every 5 s here), and the broker's WAL writes, on the same disk, waited up to 170 ms behind it
  (publish acks with them). Written back here in CHUNK pieces, each waited for before the next, a WAL write
  waits behind one piece at most.

Hand-written because no library does paced writeback: `sync_file_range` (Linux) through ctypes, with
fdatasync to finish (the file's size and blocks) and to stand in where sync_file_range is missing. Files
that are not local (an object store's) are durable once written and are left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterable
from urllib.parse import unquote, urlparse

CHUNK = 4 * 1024 * 1024
# sync_file_range(2): wait for writeback already under way, start it for the range, wait for it.
WAIT_BEFORE, WRITE, WAIT_AFTER = 1, 2, 4

_libc = ctypes.CDLL(None, use_errno=True)
_sync_file_range = getattr(_libc, "sync_file_range", None)
if _sync_file_range is not None:
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    _sync_file_range.restype = ctypes.c_int


def local_path(location: str) -> str | None:
    """The local file a FileIO location names (a plain path or file://), else None."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return unquote(parsed.path)
    if parsed.scheme == "" and location.startswith("/"):
        return location
    return None


def flush(locations: Iterable[str], chunk: int = CHUNK) -> int:
    """Make the local files among `locations` durable, `chunk` bytes of writeback at a time, and their
    directories' entries; the bytes flushed. Raises OSError (a disk error: the commit must not happen)."""
    flushed = 0
    directories = set()
    for location in locations:
        path = local_path(location)
        if path is None:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if _sync_file_range is not None:
                for offset in range(0, size, chunk):
                    if _sync_file_range(fd, offset, chunk, WAIT_BEFORE | WRITE | WAIT_AFTER) != 0:
                        errno = ctypes.get_errno()
                        raise OSError(errno, f"writing back {path}: {os.strerror(errno)}")
            os.fdatasync(fd)
        finally:
            os.close(fd)
        flushed += size
        directories.add(os.path.dirname(path))
    for directory in directories:
        fd = os.open(directory, os.O_RDONLY)
        try:
            with contextlib.suppress(OSError):  # a file system that cannot fsync a directory
                os.fsync(fd)
        finally:
            os.close(fd)
    return flushed

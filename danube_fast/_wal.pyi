# Typed Python view of danube_fast._wal (and its pure-Python twin danube_fast._wal_py).
#
# SegmentedLog is the synchronous engine behind danube_fast.storage.Wal. One thread owns it for writing
# (append, sync, roll, delete_before, close); any thread may call read() and lookup() concurrently for offsets
# below the committed limit the owner publishes.
from typing_extensions import Buffer

from danube_fast._wal_common import AppendResult, RecoveryReport

class SegmentedLog:
    directory: str
    segment_bytes: int
    segment_ms: int
    index_interval_bytes: int
    index_max_bytes: int
    recovery: RecoveryReport
    def __init__(
        self,
        directory: str,
        *,
        segment_bytes: int = 128 * 1024 * 1024,
        segment_ms: int = 0,
        index_interval_bytes: int = 4096,
        index_max_bytes: int = 1024 * 1024,
        initial_offset: int = 0,
    ) -> None: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def start_offset(self) -> int: ...
    @property
    def segment_bases(self) -> list[int]: ...
    @property
    def unsynced_bytes(self) -> int: ...
    # Validates each buffer (whole batches, structure and CRC); writes the valid ones in one write, stamping
    # contiguous base offsets. ranges[i] is (first, last) for buffers[i], or the FrameCorrupt that rejected
    # it (nothing of that buffer was written). Raises WalWriteError if the write fails; the file is then cut
    # back to its size before the call (if that fails too, the log refuses appends until reopened). Also
    # raises WalWriteError, before writing anything, when the index cannot get disk space for the entries.
    # A failed sync() always leaves the log refusing appends until reopened.
    def append(self, buffers: list[Buffer]) -> AppendResult: ...
    # fdatasync; returns the next offset it covered (safe on a second thread alongside append).
    def sync(self) -> int: ...
    # Whole batches starting with the one that holds `offset`, at most max_bytes (but always one whole batch),
    # none at or past `limit` (the committed next offset). None when offset >= limit.
    # Raises OffsetOutOfRange when offset < start_offset.
    def read(self, offset: int, max_bytes: int, limit: int) -> bytes | memoryview | None: ...
    # (segment base offset, byte position of the indexed batch at or before offset)
    def lookup(self, offset: int) -> tuple[int, int]: ...
    def roll(self) -> None: ...
    def delete_before(self, offset: int) -> int: ...
    def close(self) -> None: ...

"""A test hook that makes power loss testable: with DANUBE_FAST_SYNC_LEDGER=<file> in the environment, the
WAL appends one line `<bytes> <path>` to that file each time an fdatasync (or the directory fsync of a new
segment, with 0 bytes) has made the first <bytes> of a segment file durable. After a kill -9, a test cuts
every segment to the largest size its ledger lines name (and deletes the ones never named): the files as a
machine that lost power at that moment would have kept them (tests/faults/test_power_loss.py).

Unset (always, outside those tests), it costs one attribute test per fdatasync.
"""

from __future__ import annotations

import os

PATH = os.environ.get("DANUBE_FAST_SYNC_LEDGER") or None


def record(path: str, size: int) -> None:
    """`size` bytes of `path` are durable now."""
    if PATH is not None:
        with open(PATH, "a", encoding="utf-8") as f:  # one short append: lines never interleave
            f.write(f"{size} {path}\n")

"""One exactly-once append to a topic table (docs/TABLES.md, "Exactly once").

The rule: a writer appends the records of offsets [start, end) of one stored topic only in a commit whose
base snapshot says that stored topic's next offset is `start`, and that commit says `end`. Both halves are
checked by the catalog atomically: the append's commit asserts that the table's `main` branch still points
at the snapshot the writer read `start` from (pyiceberg's AssertRefSnapshotId; the SQL catalog swaps the
metadata location only where it is still the one read), and the table's property `commit.retry.num-retries
= 0` keeps pyiceberg from replaying a failed commit on top of the winner. So whatever crashes, moves or
races happen, an offset is in the table once: a commit that lost a race is refused (its files deleted by
pyiceberg), and the writer plans again from the table as it now is. A writer killed after writing Parquet
and before the commit leaves files no snapshot names: invisible to every reader (which plan from
snapshots), removed by the orphan sweep.

Runs in a worker thread: pyiceberg is synchronous (Parquet encoding and zstd release the GIL).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from danube_fast.tables.catalog import OFFSETS, committed_offsets, dump_offsets

if TYPE_CHECKING:
    from pyiceberg.table import Table


class OffsetsMoved(Exception):
    """The table does not hold what the writer planned from: another writer (an old owner) committed this
    stored topic's offsets. Plan again from the table."""


@dataclass(frozen=True)
class Committed:
    """What a table holds after a commit."""

    offsets: dict[str, int]
    metadata_location: str
    files: int
    bytes: int


def state(table: Table) -> Committed:
    snapshot = table.current_snapshot()
    summary = snapshot.summary.additional_properties if snapshot is not None and snapshot.summary else {}
    return Committed(committed_offsets(table), table.metadata_location,
                     int(summary.get("total-data-files", 0)), int(summary.get("total-files-size", 0)))


def append_range(table: Table, stored: str, start: int, end: int, rows: pa.Table,
                 before_commit: Callable[[], None] = lambda: None) -> Committed:
    """Commit `rows`, the records of `stored`'s offsets [start, end), to `table` as one snapshot. Raises
    OffsetsMoved when the table (as loaded) does not end `stored` at `start`, and pyiceberg's
    CommitFailedException when another commit landed since it was loaded (reload it and call again).
    `before_commit` runs once the data files are written (a crash point for the tests)."""
    offsets = committed_offsets(table)
    held = offsets.get(stored)
    if held is not None and held != start:
        raise OffsetsMoved(f"{stored}: the table holds offsets up to {held}, not {start}")
    offsets[stored] = end
    tx = table.transaction()
    tx.append(rows, snapshot_properties={OFFSETS: dump_offsets(offsets)})
    before_commit()
    return state(tx.commit_transaction())

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

Runs in the table worker process (tables/worker.py), never in the broker's.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa

from danube_fast.tables.catalog import (
    FORMAT_PROPERTY,
    OFFSETS,
    SCHEMA_PROPERTY,
    committed_offsets,
    dump_offsets,
    snapshot_offsets,
)
from danube_fast.tables.flush import flush
from danube_fast.tables.worker_messages import Committed, SnapshotInfo

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.partitioning import PartitionKey
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.transforms import Transform

ROW_GROUP_LIMIT = "write.parquet.row-group-limit"  # the table property: rows per Parquet row group


class OffsetsMoved(Exception):
    """The table does not hold what the writer planned from: another writer (an old owner) committed this
    stored topic's offsets. Plan again from the table."""


def state(table: Table) -> Committed:
    from danube_fast.tables.partitions import describe

    snapshot = table.current_snapshot()
    summary = snapshot.summary.additional_properties if snapshot is not None and snapshot.summary else {}
    return Committed(committed_offsets(table), table.metadata_location,
                     int(summary.get("total-data-files", 0)), int(summary.get("total-files-size", 0)),
                     describe(table.spec(), table.schema()))


def snapshots(table: Table) -> list[SnapshotInfo]:
    """The snapshots `table` keeps, oldest first, with the offsets each held (time travel: docs/TABLES.md,
    "Reading")."""
    listed = []
    for snapshot in sorted(table.snapshots(), key=lambda s: (s.timestamp_ms, s.sequence_number or 0)):
        summary = snapshot.summary
        extra = summary.additional_properties if summary is not None else {}
        listed.append(SnapshotInfo(snapshot.snapshot_id, snapshot.timestamp_ms,
                                   summary.operation.value if summary is not None else "",
                                   snapshot_offsets(snapshot), int(extra.get("total-records", 0)),
                                   int(extra.get("total-data-files", 0))))
    return listed


def append_range(table: Table, stored: str, start: int, end: int, rows: pa.Table,
                 before_commit: Callable[[], None] = lambda: None, slices: int = 1) -> Committed:
    """Commit `rows`, the records of `stored`'s offsets [start, end), to `table` as one snapshot. Raises
    OffsetsMoved when the table (as loaded) does not end `stored` at `start`, and pyiceberg's
    CommitFailedException when another commit landed since it was loaded (reload it and call again).
    `before_commit` runs once the data files are written (a crash point for the tests); `slices`: the files
    each partition's rows may be split into, written at once (data_files)."""
    offsets = committed_offsets(table)
    held = offsets.get(stored)
    if held is not None and held != start:
        raise OffsetsMoved(f"{stored}: the table holds offsets up to {held}, not {start}")
    offsets[stored] = end
    return _append(table, offsets, rows, before_commit, slices)


def append_dead_letters(table: Table, stored: str, start: int, end: int, rows: pa.Table) -> Committed | None:
    """Commit the records of [start, end) of `stored` that did not decode (`rows`) to the dead-letter table,
    before the main table's commit of the same range; None when there is nothing to commit.

    The dead-letter table's `danube.offsets` is a watermark: every dead record of `stored` below it is in
    the table. Its writer commits a range before the main table does, so after a crash between the two (or
    a race lost on the main table) the range is planned again with the watermark already past some of it:
    only the records at or above the watermark are appended, and none when it is at `end` or past."""
    import pyarrow.compute as pc

    offsets = committed_offsets(table)
    low = max(start, offsets.get(stored, start))
    if low >= end:
        return None
    if low > start:
        rows = rows.filter(pc.greater_equal(rows.column("offset"), low))
    if rows.num_rows == 0:
        return None
    offsets[stored] = end
    return _append(table, offsets, rows)


def _append(table: Table, offsets: dict[str, int], rows: pa.Table,
            before_commit: Callable[[], None] = lambda: None, slices: int = 1) -> Committed:
    """`rows` as one fast-append snapshot whose summary says `offsets`, conditional on the table's current
    snapshot (module docstring)."""
    tx = table.transaction()
    with tx.update_snapshot(snapshot_properties={OFFSETS: dump_offsets(offsets)}).fast_append() as append:
        for data_file in data_files(tx.table_metadata, table.io, rows, append.commit_uuid, slices):
            append.append_data_file(data_file)
    before_commit()
    return state(tx.commit_transaction())


def evolve(table: Table, columns: pa.Schema, version: str, value_format: str) -> bool:
    """Add `columns` (tables/typed.py: a schema version's value columns, optional) to the table's schema by
    name, widening where Iceberg allows, unless the table says it has `version`'s columns already (table
    property SCHEMA_PROPERTY); whether it changed. pyiceberg's ValidationError names what Iceberg refuses.
    `value_format` (avro or json) is kept too (FORMAT_PROPERTY): how a reader decodes the records after the
    table's."""
    if table.properties.get(SCHEMA_PROPERTY) == version:
        return False
    tx = table.transaction()
    with tx.update_schema() as update:
        update.union_by_name(columns)
    tx.set_properties({SCHEMA_PROPERTY: version, FORMAT_PROPERTY: value_format})
    tx.commit_transaction()
    return True


def data_files(metadata: TableMetadata, io: FileIO, rows: pa.Table, write_uuid: uuid.UUID,
               slices: int = 1) -> list[DataFile]:
    """`rows` written as Parquet data files of the table, one per partition they fall in (or up to `slices`
    per partition, each of consecutive rows and at least one whole row group, which pyiceberg's executor
    writes at once: `_sliced`), and made durable (tables/flush.py) before any commit can name them.

    pyiceberg's own path (`Table.append`, `_dataframe_to_data_files`) partitions any table by filtering it
    once per partition and copying each part (combine_chunks): for 64 MB of 256 B records in one hour it
    took 0.5 of its 0.65 s. Here rows of one stored topic fall in one `partition` and, but for an hour (day,
    month) boundary, one period: the periods are computed once, and a chunk within one is written as it is.
    The files, their names, metrics and partition values are pyiceberg's (write_file, WriteTask,
    PartitionKey). A table with tablePartitionBy's fields is cut by `_by_fields` instead.
    """
    from pyiceberg.io.pyarrow import pyarrow_to_schema, write_file
    from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
    from pyiceberg.table import WriteTask

    from danube_fast.tables.partitions import TIME_TRANSFORMS, fast_path, time_unit

    if rows.num_rows == 0:  # a commit that only moves the offsets past a hole
        return []
    spec, schema = metadata.spec(), metadata.schema()
    task_schema = pyarrow_to_schema(rows.schema, name_mapping=schema.name_mapping,
                                    format_version=metadata.format_version)
    parts: list[tuple[PartitionKey | None, pa.Table]]
    if spec.is_unpartitioned():
        parts = [(None, rows)]
    elif not fast_path(spec, schema):  # tablePartitionBy's fields
        parts = _by_fields(rows, metadata)
    else:
        unit, partition_id = time_unit(spec, schema), schema.find_field("partition").field_id
        parts = []
        for period, part in _by_period(rows, TIME_TRANSFORMS.get(unit)):
            values = []
            for field in spec.fields:
                if field.source_id == partition_id:  # identity(partition): one stored topic, one value
                    values.append(PartitionFieldValue(field, part.column("partition")[0].as_py()))
                else:
                    values.append(PartitionFieldValue(field, period))
            parts.append((PartitionKey(values, spec, schema), part))
    counter = itertools.count()
    group_rows = int(metadata.properties.get(ROW_GROUP_LIMIT, 0)) or 1
    tasks = (WriteTask(write_uuid=write_uuid, task_id=next(counter), schema=task_schema,
                       record_batches=piece.to_batches(), partition_key=key)
             for key, part in parts for piece in _sliced(part, slices, group_rows))
    written = list(write_file(io, metadata, tasks))
    flush(f.file_path for f in written)  # durable before any snapshot names them (tables/flush.py)
    return written


def _by_fields(rows: pa.Table, metadata: TableMetadata) -> list[tuple[PartitionKey | None, pa.Table]]:
    """`rows` by the values of every field of the table's spec (pyiceberg's transforms, computed once over
    the rows), each part in offset order. pyiceberg's own `_determine_partitions` filters all of the rows
    once per partition; grouping the row numbers and taking each group copies them once (1 M of bench
    tables' records into 12 partitions: 0.2-0.3 s, and data_files 1.4-1.8 s against 2.1 s that way and
    1.0-1.4 s for the same rows by the hour alone, docs/TABLES.md "Partitioning")."""
    import numpy as np
    import pyarrow.compute as pc
    from pyiceberg.io.pyarrow import _get_field_from_arrow_table
    from pyiceberg.partitioning import PartitionFieldValue, PartitionKey

    spec, schema = metadata.spec(), metadata.schema()
    names = [f"_p{i}" for i in range(len(spec.fields))]
    keys = {}
    for name, field in zip(names, spec.fields, strict=True):
        column = schema.find_column_name(field.source_id)
        assert column is not None  # the spec's sources are the schema's
        source = _get_field_from_arrow_table(rows, column)
        keys[name] = field.transform.pyarrow_transform(schema.find_field(field.source_id).field_type)(source)
    keys["_row"] = pa.array(np.arange(rows.num_rows, dtype=np.int64))
    groups = pa.table(keys).group_by(names, use_threads=False).aggregate([("_row", "list")])
    members = groups.column("_row_list").combine_chunks()
    parts: list[tuple[PartitionKey | None, pa.Table]] = []
    for index, group in enumerate(groups.select(names).to_pylist()):
        taken = members[index].values
        taken = pc.take(taken, pc.sort_indices(taken))  # the part's rows in offset order
        values = [PartitionFieldValue(f, group[name]) for name, f in zip(names, spec.fields, strict=True)]
        parts.append((PartitionKey(values, spec, schema), rows.take(taken)))
    return parts


def _by_period(rows: pa.Table, transform: Transform | None) -> list[tuple[int | None, pa.Table]]:  # type: ignore[type-arg]
    """`rows` by the value of the table's time `transform` (hour, day or month; None: not by time) of their
    publish time, computed once by Iceberg's own transform, and rows of one period (a commit's usual case)
    kept whole."""
    import pyarrow.compute as pc
    from pyiceberg.types import TimestamptzType

    if transform is None:
        return [(None, rows)]
    periods = transform.pyarrow_transform(TimestamptzType())(rows.column("timestamp"))
    first, last = pc.min(periods).as_py(), pc.max(periods).as_py()
    if first == last:
        return [(first, rows)]
    return [(p, rows.filter(pc.equal(periods, p))) for p in pc.unique(periods).to_pylist()]


def _sliced(part: pa.Table, slices: int, group_rows: int) -> list[pa.Table]:
    """`part` as up to `slices` runs of consecutive rows (so each file's offsets are a range) to encode at
    once, none under one row group (`group_rows`): a file of fewer rows is one compaction would rewrite
    (maintenance.py: under an eighth of a compaction group's rows), which cost more than the split saved.
    Two files in two threads encoded 1 M of bench tables' records into Parquet+zstd in 0.51 s against 0.90 s
    as one (an idle 2-core machine)."""
    count = max(1, min(slices, part.num_rows // group_rows))
    n = part.num_rows
    return [part.slice(i * n // count, (i + 1) * n // count - i * n // count) for i in range(count)]

"""Keeping a topic table fast to read and bounded on disk (docs/TABLES.md, "Maintenance"): compaction of small
files, snapshot expiry and the orphan sweep.

A table committed every few seconds gets a few small files per commit (one per hour partition it touches),
and a scan pays per file. pyiceberg 0.12 expires snapshots but has neither a compaction (Iceberg's
rewrite_data_files) nor an orphan-file removal, so both are written here over its public transaction API:

- **Compaction**: in one partition, the files smaller than half the target are read back (pyarrow), joined,
  sorted by offset and written as files of about the target size, and one overwrite commit deletes the old
  files from the table and adds the new ones. The commit carries `danube.offsets` unchanged and, like every
  commit here, is refused if another landed since it was planned (commit.retry.num-retries = 0): a writer's
  append and a compaction never both win over the same snapshot. Readers of the old snapshot keep their
  files until the snapshot expires.
- **Retention**: rows published before the table's retention (the policy's; rounded down to the table's
  time partition, an hour by default, so that partitions go whole: a metadata-only delete, no file
  rewritten) are deleted in one commit that carries `danube.offsets` unchanged.
- **Expiry**: snapshots older than `snapshot_keep_ms` go from the metadata (never the current one).
- **Orphan sweep**: files under the table's location that no remaining snapshot or metadata file names and
  that are older than `orphan_grace_ms` are deleted: the files of expired snapshots (compacted away) and
  those of commits that never happened (a writer killed between Parquet and commit, a refused commit). The
  grace keeps a commit in progress from losing its files to a sweep.

Runs in the table worker process (tables/worker.py), never in the broker's.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from danube_fast.tables.catalog import OFFSETS, committed_offsets, dump_offsets

if TYPE_CHECKING:
    from pyarrow import fs as pafs
    from pyiceberg.catalog import Catalog
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table


US_PER_HOUR = 3_600_000_000


def period_start(us: int, unit: str) -> int:
    """The start (µs since the epoch) of the hour, day or month (the table's time partition; an hour for
    "none") that holds `us`."""
    moment = datetime.datetime.fromtimestamp(us / 1e6, tz=datetime.UTC)
    if unit == "month":
        moment = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    elif unit == "day":
        moment = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    else:
        return us - us % US_PER_HOUR
    return int(moment.timestamp()) * 1_000_000


def next_period(start: int, unit: str) -> int:
    """The start of the period after the one starting at `start`."""
    if unit != "month":
        return start + (24 if unit == "day" else 1) * US_PER_HOUR
    moment = datetime.datetime.fromtimestamp(start / 1e6, tz=datetime.UTC)
    moment = moment.replace(year=moment.year + moment.month // 12, month=moment.month % 12 + 1)
    return int(moment.timestamp()) * 1_000_000


@dataclass(frozen=True)
class Done:
    compacted_files: int  # files replaced
    written_files: int  # files that replaced them
    expired_snapshots: int
    swept_files: int
    retained_files: int = 0  # files retention removed from the table


def retain(table: Table, retention_ms: int, now: float | None = None) -> int:
    """Delete the rows published before `retention_ms` ago, rounded down to the table's time partition (an
    hour, day or month); the files removed. Raises pyiceberg's CommitFailedException when another commit
    landed first."""
    from danube_fast.tables.partitions import time_unit

    cutoff_us = int(((time.time() if now is None else now) * 1000 - retention_ms) * 1000)
    return _delete_before(table, period_start(cutoff_us, time_unit(table.spec(), table.schema())))


def retain_size(table: Table, max_bytes: int) -> int:
    """While the table's data files hold more than `max_bytes`, delete its oldest whole period (the table's
    time partition: hour, day or month) of rows by publish time, never the newest; the files removed. Files
    are dated by their largest publish time (the column statistics): with time partitions each file is in
    one period (one of an earlier, finer partitioning too), and a whole period goes in one metadata-only
    delete. Raises pyiceberg's CommitFailedException when another commit landed first."""
    from danube_fast.tables.partitions import time_unit

    unit = time_unit(table.spec(), table.schema())
    by_period: dict[int, int] = defaultdict(int)  # period start (µs) -> bytes of the files ending in it
    for task in table.scan().plan_files():
        f = task.file
        newest = _newest_us(table, f)
        if newest is None:
            return 0  # a file without statistics: its rows cannot be dated, so nothing is cut by size
        by_period[period_start(newest, unit)] += f.file_size_in_bytes
    periods = sorted(by_period)
    total = sum(by_period.values())
    keep_from = None
    for period in periods[:-1]:
        if total <= max_bytes:
            break
        total -= by_period[period]
        keep_from = next_period(period, unit)
    if keep_from is None:
        return 0
    return _delete_before(table, keep_from)


def _newest_us(table: Table, f: DataFile) -> int | None:
    """The largest publish time (µs) in data file `f`, from its upper bound statistic."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import PrimitiveType

    field = table.schema().find_field("timestamp")
    bound = (f.upper_bounds or {}).get(field.field_id)
    assert isinstance(field.field_type, PrimitiveType)  # the envelope's timestamp column
    return None if bound is None else int(from_bytes(field.field_type, bound))


def _delete_before(table: Table, cutoff_us: int) -> int:
    """Delete the rows published before `cutoff_us` (a period's start), keeping the table's offsets in the
    snapshot; the files removed."""
    older = f"timestamp < '{datetime.datetime.fromtimestamp(cutoff_us / 1e6, tz=datetime.UTC).isoformat()}'"
    doomed = [t.file for t in table.scan(row_filter=older).plan_files()]
    if not doomed:
        return 0
    offsets = committed_offsets(table)
    with table.transaction() as tx:
        tx.delete(older, snapshot_properties={OFFSETS: dump_offsets(offsets)})
    return len(doomed)


def small_groups(table: Table, target_bytes: int, min_files: int,
                 group_rows: int = 0) -> list[list[DataFile]]:
    """Per partition of the current snapshot, the small files when there are at least `min_files` of them,
    cut into groups of at most about `target_bytes` (and, when `group_rows`, of at most that many rows), each
    of two files or more. A file is small under half `target_bytes`, and, when `group_rows`, under an eighth
    of it in rows too: a busy topic's commits are files of a quarter of a million rows and more, which a
    scan reads well, and whose rewriting would cost the writer as much as writing them did (records that
    compress well make small files of many rows)."""
    by_partition: dict[tuple[Any, ...], list[DataFile]] = defaultdict(list)
    for task in table.scan().plan_files():
        f = task.file
        if f.file_size_in_bytes < target_bytes // 2 and (not group_rows or f.record_count < group_rows // 8):
            by_partition[(f.spec_id, repr(f.partition))].append(f)  # Record: equal partitions, equal repr
    groups = []
    for files in by_partition.values():
        if len(files) < min_files:
            continue
        group: list[DataFile] = []
        size = rows = 0
        for f in sorted(files, key=lambda f: f.file_path):
            if group and (size + f.file_size_in_bytes > target_bytes or
                          (group_rows and rows + f.record_count > group_rows)):
                if len(group) > 1:
                    groups.append(group)
                group, size, rows = [], 0, 0
            group.append(f)
            size += f.file_size_in_bytes
            rows += f.record_count
        if len(group) > 1:
            groups.append(group)
    return groups


def compact(table: Table, files: list[DataFile]) -> int:
    """Replace `files` (one partition's) with their rows in offset order, in one commit; the files written.
    Raises pyiceberg's CommitFailedException (or ValidationException) when another commit landed first."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from danube_fast.tables.commit import data_files

    parts = []
    for f in files:
        with table.io.new_input(f.file_path).open() as stream:
            parts.append(_large(pq.read_table(stream)))
    rows = pa.concat_tables(parts).sort_by([("partition", "ascending"), ("offset", "ascending")])
    offsets = committed_offsets(table)
    written = 0
    with table.transaction() as tx:
        update = tx.update_snapshot(snapshot_properties={OFFSETS: dump_offsets(offsets)})
        with update.overwrite() as overwrite:
            for f in files:
                overwrite.delete_data_file(f)
            for new in data_files(tx.table_metadata, table.io, rows, overwrite.commit_uuid):
                overwrite.append_data_file(new)
                written += 1
    return written


def _large(rows: Any) -> Any:
    """`rows` with binary and string columns as their 64-bit-offset kinds: sorting joins a column's chunks
    into one array, and values of well-compressed files add up to more than the 2 GiB 32-bit offsets hold."""
    import pyarrow as pa

    fields = [f.with_type(pa.large_binary()) if pa.types.is_binary(f.type) else
              f.with_type(pa.large_string()) if pa.types.is_string(f.type) else f for f in rows.schema]
    return rows.cast(pa.schema(fields, metadata=rows.schema.metadata))


def expire(table: Table, keep_ms: int, now: float | None = None) -> int:
    """Expire the snapshots older than `keep_ms` (the current one stays); how many went."""
    cutoff_ms = int(((time.time() if now is None else now) * 1000) - keep_ms)
    current = table.current_snapshot()
    old = [s.snapshot_id for s in table.metadata.snapshots
           if s.timestamp_ms < cutoff_ms and (current is None or s.snapshot_id != current.snapshot_id)]
    if not old:
        return 0
    table.maintenance.expire_snapshots().older_than(
        datetime.datetime.fromtimestamp(cutoff_ms / 1000, tz=datetime.UTC)).commit()
    return len(old)


def referenced(table: Table) -> set[str]:
    """Every file the table's metadata names: metadata files, manifest lists, manifests, and the data files
    live in a snapshot it keeps. A file a kept snapshot lists only as deleted (what compaction or retention
    replaced) is named by no reader's plan once the snapshots that still held it expired."""
    names = {table.metadata_location, *(e.metadata_file for e in table.metadata.metadata_log)}
    for snapshot in table.metadata.snapshots:
        names.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            names.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                names.add(entry.data_file.file_path)
    return {_key(n) for n in names}


def sweep(table: Table, grace_ms: int, now: float | None = None) -> int:
    """Delete the files under the table's location that its metadata does not name, older than `grace_ms`;
    how many."""
    from pyarrow import fs

    keep = referenced(table)
    filesystem, root = _file_system(table.io, table.location())
    cutoff = (time.time() if now is None else now) - grace_ms / 1000
    deleted = 0
    for info in filesystem.get_file_info(fs.FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type != fs.FileType.File or _key(info.path) in keep:
            continue
        if info.mtime is not None and info.mtime.timestamp() < cutoff:
            filesystem.delete_file(info.path)
            deleted += 1
    return deleted


def drop(catalog: Catalog, identifier: tuple[str, str]) -> int:
    """Drop the table from the catalog (no reader plans it any more), then delete every file under its
    location: data, manifests, metadata and orphans alike; how many files. None there: 0."""
    from pyarrow import fs
    from pyiceberg.exceptions import NoSuchTableError

    try:
        table = catalog.load_table(identifier)
        catalog.drop_table(identifier)
    except NoSuchTableError:  # another broker dropped it first
        return 0
    filesystem, root = _file_system(table.io, table.location())
    deleted = 0
    for info in filesystem.get_file_info(fs.FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type == fs.FileType.File:
            with contextlib.suppress(FileNotFoundError):
                filesystem.delete_file(info.path)
                deleted += 1
    with contextlib.suppress(OSError):  # the folders of a local warehouse (S3 has none to delete)
        filesystem.delete_dir(root)
    return deleted


def _file_system(io: FileIO, location: str) -> tuple[pafs.FileSystem, str]:
    """The file system holding `location`, opened with the table's FileIO settings (an S3 warehouse's
    endpoint and keys, which pyarrow's own `from_uri` would not know), and the path in it."""
    from pyarrow import fs
    from pyiceberg.io.pyarrow import PyArrowFileIO

    if isinstance(io, PyArrowFileIO):
        scheme, netloc, path = PyArrowFileIO.parse_location(location, io.properties)
        return io.fs_by_scheme(scheme, netloc), path
    filesystem, path = fs.FileSystem.from_uri(location)
    return filesystem, str(path)


def _key(name: str) -> str:
    """A file's name without its scheme: `file:///a/b` and `/a/b` are one file, `s3://b/k` and `b/k` too."""
    parsed = urlparse(name)
    return (parsed.netloc + parsed.path) if parsed.scheme else name


def maintain(table: Table, target_bytes: int, min_files: int, keep_ms: int, grace_ms: int,
             retention_ms: int = 0, max_groups: int = 4, retention_bytes: int = 0,
             group_rows: int = 0) -> Done:
    """One maintenance round: retention (by time when `retention_ms`, by size when `retention_bytes`),
    compact up to `max_groups` groups of small files, expire, sweep. A step that lost a race to another
    commit is left for the next round."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    retained = 0
    for cut, limit in ((retain, retention_ms), (retain_size, retention_bytes)):
        if limit:
            try:
                retained += cut(table, limit)
                table = table.refresh()
            except (CommitFailedException, ValidationException):
                table = table.refresh()
    compacted = written = 0
    for group in small_groups(table, target_bytes, min_files, group_rows)[:max_groups]:
        try:
            written += compact(table, group)
            compacted += len(group)
        except (CommitFailedException, ValidationException):
            table = table.refresh()
            break
    expired = expire(table, keep_ms)
    return Done(compacted, written, expired, sweep(table, grace_ms), retained)

"""The exactly-once append of a topic table (danube_fast/tables/commit.py) and its maintenance, on both
catalogs: pyiceberg's SQL catalog (SQLite) and ours on the metadata store (tables/meta_catalog.py, over a real
embedded store on its own event loop, as a broker runs it), with real Parquet files: a commit based on a
stale snapshot is refused, a writer that planned from offsets another writer already committed is refused,
every stored topic's offsets are carried forward, files written by a commit that never happened are in no
scan, and compaction keeps every row."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import EqualTo

from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.resources_storage import TableCatalog
from danube_fast.tables import catalog, commit, envelope
from danube_fast.tables.pointers import LoopPointers
from danube_fast.testing.moto import ACCESS_KEY, REGION, SECRET_KEY, MotoServer

TOPIC = "/default/orders"


def rows(topic: str, partition: int, start: int, end: int) -> pa.Table:
    n = end - start
    batch = pa.RecordBatch.from_arrays([
        pa.array([b"k"] * n, pa.binary()),
        pa.array([b"v%d" % i for i in range(start, end)], pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array(range(start, end), pa.int64()),
        pa.array([1_700_000_000_000_000 + i * 1000 for i in range(start, end)], pa.timestamp("us", tz="UTC")),
        pa.array([0] * n, pa.int32()),
        pa.array(["p"] * n, pa.string()),
        pa.array([[("a", "b")]] * n, pa.map_(pa.string(), pa.string())),
        pa.array([None] * n, pa.int64()),
        pa.array([None] * n, pa.int64()),
    ], schema=envelope.ARROW_SCHEMA)
    return pa.Table.from_batches([batch])


@pytest.fixture(params=["sql", "metadata"])
def cat(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Catalog]:
    if request.param == "sql":
        yield catalog.open_catalog(catalog.standalone_catalog(str(tmp_path)))
        return
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def call(coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)

    store = call(EmbeddedStore.open(str(tmp_path / "metadata.db")))
    try:
        yield catalog.open_catalog(catalog.cluster_catalog(str(tmp_path / "objects")),
                                   pointers=LoopPointers(store, call))
    finally:
        call(store.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def offsets_in(table) -> list[int]:  # type: ignore[no-untyped-def]
    return sorted(table.scan(selected_fields=("offset",)).to_arrow().column("offset").to_pylist())


def test_a_stale_writer_is_refused_and_every_offset_is_in_the_table_once(cat) -> None:  # type: ignore[no-untyped-def]
    table = catalog.load_or_create(cat, "default", "orders", False, "hour", 1 << 20)
    first = commit.append_range(table, TOPIC, 0, 100, rows(TOPIC, -1, 0, 100))
    assert first.offsets == {TOPIC: 100} and first.files == 1 and first.bytes > 0
    a = cat.load_table(("default", "orders"))
    b = cat.load_table(("default", "orders"))
    commit.append_range(a, TOPIC, 100, 200, rows(TOPIC, -1, 100, 200))
    with pytest.raises(CommitFailedException):  # b planned from the snapshot a replaced
        commit.append_range(b, TOPIC, 100, 200, rows(TOPIC, -1, 100, 200))
    again = cat.load_table(("default", "orders"))
    with pytest.raises(commit.OffsetsMoved):  # reloaded, it sees that 100..199 are there already
        commit.append_range(again, TOPIC, 100, 200, rows(TOPIC, -1, 100, 200))
    assert offsets_in(cat.load_table(("default", "orders"))) == list(range(200))
    assert catalog.committed_offsets(cat.load_table(("default", "orders"))) == {TOPIC: 200}


def test_partitions_share_a_table_and_each_keeps_its_offsets(cat) -> None:  # type: ignore[no-untyped-def]
    table = catalog.load_or_create(cat, "default", "clicks", True, "hour", 1 << 20)
    p0, p1 = "/default/clicks-part-0", "/default/clicks-part-1"
    commit.append_range(table, p0, 0, 10, rows("/default/clicks", 0, 0, 10))
    commit.append_range(table, p1, 0, 5, rows("/default/clicks", 1, 0, 5))
    state = commit.append_range(table, p0, 10, 20, rows("/default/clicks", 0, 10, 20))
    assert state.offsets == {p0: 20, p1: 5}
    got = cat.load_table(("default", "clicks")).scan().to_arrow()
    pairs = sorted(zip(got.column("partition").to_pylist(), got.column("offset").to_pylist(), strict=True))
    assert pairs == [(0, i) for i in range(20)] + [(1, i) for i in range(5)]
    # identity(partition) under hour(timestamp): a file holds one partition's records
    for task in cat.load_table(("default", "clicks")).scan().plan_files():
        assert "/partition=" in task.file.file_path


def test_files_of_a_commit_that_never_happened_are_in_no_scan(cat) -> None:  # type: ignore[no-untyped-def]
    table = catalog.load_or_create(cat, "default", "orders", False, "hour", 1 << 20)
    commit.append_range(table, TOPIC, 0, 50, rows(TOPIC, -1, 0, 50))

    class Crash(Exception):
        pass

    def crash() -> None:
        raise Crash

    with pytest.raises(Crash):
        commit.append_range(cat.load_table(("default", "orders")), TOPIC, 50, 100, rows(TOPIC, -1, 50, 100),
                            before_commit=crash)
    table = cat.load_table(("default", "orders"))
    written = {str(p) for p in Path(table.location().removeprefix("file://")).rglob("*.parquet")}
    planned = {t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()}
    assert len(written) == 2 and len(planned) == 1  # the crashed commit's file is on disk, in no snapshot
    assert offsets_in(table) == list(range(50))
    commit.append_range(table, TOPIC, 50, 100, rows(TOPIC, -1, 50, 100))  # the writer resumes from the table
    assert offsets_in(cat.load_table(("default", "orders"))) == list(range(100))


def test_a_reader_opens_the_sql_catalog_read_only(tmp_path: Path) -> None:
    cat = catalog.open_catalog(catalog.standalone_catalog(str(tmp_path)))
    table = catalog.load_or_create(cat, "default", "orders", False, "none", 1 << 20)
    commit.append_range(table, TOPIC, 0, 10, rows(TOPIC, -1, 0, 10))
    location = catalog.standalone_catalog(str(tmp_path))
    reader = catalog.open_catalog(location, read_only=True)
    assert offsets_in(reader.load_table(("default", "orders"))) == list(range(10))
    with pytest.raises(Exception, match="readonly"):
        reader.create_namespace("other")
    with pytest.raises(FileNotFoundError, match="no table was written yet"):
        catalog.open_catalog(catalog.standalone_catalog(str(tmp_path / "none")), read_only=True)


def test_compaction_leaves_files_of_many_rows_and_caps_a_group_by_rows(cat) -> None:  # type: ignore[no-untyped-def]
    from danube_fast.tables import maintenance

    table = catalog.load_or_create(cat, "default", "busy", False, "hour", 1 << 20)
    for low in range(0, 1200, 100):
        commit.append_range(table, TOPIC, low, low + 100, rows(TOPIC, -1, low, low + 100))
    commit.append_range(table, TOPIC, 1200, 3200, rows(TOPIC, -1, 1200, 3200))  # one file of 2000 rows
    # Files under an eighth of group_rows in rows are small; a group holds at most group_rows rows.
    groups = maintenance.small_groups(table, 64 << 20, 2, group_rows=1000)
    assert sorted(len(g) for g in groups) == [2, 10]
    assert all(sum(f.record_count for f in g) <= 1000 for g in groups)
    assert all(f.record_count == 100 for g in groups for f in g)
    assert maintenance.small_groups(table, 64 << 20, 2, group_rows=800) == []  # 100 rows: not under 800 / 8
    # Large types when joining: the rows of the rewritten files are the same.
    before = offsets_in(table)
    for group in groups:
        maintenance.compact(table, group)
        table = cat.load_table(("default", "busy"))
    assert offsets_in(table) == before == list(range(3200))
    assert len(list(table.scan().plan_files())) == 3


def test_compaction_keeps_every_row_and_offsets_then_expiry_and_the_sweep_free_the_old_files(
        cat) -> None:  # type: ignore[no-untyped-def]
    from danube_fast.tables import maintenance

    table = catalog.load_or_create(cat, "default", "orders", False, "hour", 1 << 20)
    for low in range(0, 1000, 100):  # ten small commits: ten small files in one hour partition
        commit.append_range(table, TOPIC, low, low + 100, rows(TOPIC, -1, low, low + 100))
    before = {t.file.file_path for t in table.scan().plan_files()}
    assert len(before) == 10
    groups = maintenance.small_groups(table, 64 << 20, 8)
    assert [len(g) for g in groups] == [10]
    assert maintenance.compact(table, groups[0]) == 1
    table = cat.load_table(("default", "orders"))
    after = [t.file for t in table.scan().plan_files()]
    assert len(after) == 1 and after[0].record_count == 1000
    assert offsets_in(table) == list(range(1000))
    assert catalog.committed_offsets(table) == {TOPIC: 1000}  # the offsets survive the rewrite
    # A writer that planned before the compaction is refused, and resumes after it.
    commit.append_range(table, TOPIC, 1000, 1100, rows(TOPIC, -1, 1000, 1100))
    # Nothing is old enough yet: the compacted-away files stay for the readers of older snapshots.
    assert maintenance.expire(table, keep_ms=3_600_000) == 0
    assert maintenance.sweep(table, grace_ms=3_600_000) == 0
    on_disk = {str(p) for p in Path(table.location().removeprefix("file://")).rglob("*.parquet")}
    assert {p.removeprefix("file://") for p in before} <= on_disk
    # Later: every snapshot but the current expires, and the files only they named go.
    table = cat.load_table(("default", "orders"))
    snapshots = len(table.metadata.snapshots)
    assert snapshots == 12 and maintenance.expire(table, keep_ms=0) == snapshots - 1
    table = cat.load_table(("default", "orders"))
    assert len(table.metadata.snapshots) == 1
    assert maintenance.sweep(table, grace_ms=0) >= 10
    left = {str(p) for p in Path(table.location().removeprefix("file://")).rglob("*.parquet")}
    assert left == {t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()}
    assert offsets_in(table) == list(range(1100))
    assert catalog.committed_offsets(table) == {TOPIC: 1100}


def test_a_compaction_that_lost_a_race_changes_nothing(cat) -> None:  # type: ignore[no-untyped-def]
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    from danube_fast.tables import maintenance

    table = catalog.load_or_create(cat, "default", "orders", False, "hour", 1 << 20)
    for low in range(0, 500, 100):
        commit.append_range(table, TOPIC, low, low + 100, rows(TOPIC, -1, low, low + 100))
    stale = cat.load_table(("default", "orders"))
    commit.append_range(table, TOPIC, 500, 600, rows(TOPIC, -1, 500, 600))  # lands first
    group = maintenance.small_groups(stale, 64 << 20, 2)[0]
    with pytest.raises((CommitFailedException, ValidationException)):
        maintenance.compact(stale, group)
    table = cat.load_table(("default", "orders"))
    assert offsets_in(table) == list(range(600))
    assert len(list(table.scan().plan_files())) == 6


def test_retention_drops_whole_old_hours_and_keeps_the_offsets(cat) -> None:  # type: ignore[no-untyped-def]
    from danube_fast.tables import maintenance

    table = catalog.load_or_create(cat, "default", "orders", False, "hour", 1 << 20)
    old = rows(TOPIC, -1, 0, 100)  # published in 2023
    now_us = int(time.time() * 1_000_000)
    recent = rows(TOPIC, -1, 100, 200)
    recent = recent.set_column(5, "timestamp", pa.array([now_us - 1000] * 100, pa.timestamp("us", tz="UTC")))
    commit.append_range(table, TOPIC, 0, 100, old)
    commit.append_range(table, TOPIC, 100, 200, recent)
    assert maintenance.retain(table, retention_ms=24 * 3_600_000) == 1  # the 2023 hour's file
    table = cat.load_table(("default", "orders"))
    assert offsets_in(table) == list(range(100, 200))
    assert catalog.committed_offsets(table) == {TOPIC: 200}  # the writer goes on from the table's end
    assert maintenance.retain(table, retention_ms=24 * 3_600_000) == 0  # nothing more is that old


def test_size_retention_drops_the_oldest_whole_hours_never_the_newest(cat) -> None:  # type: ignore[no-untyped-def]
    from danube_fast.tables import maintenance

    table = catalog.load_or_create(cat, "default", "orders", False, "hour", 1 << 20)
    for hour in range(3):  # three hours two hours apart, a file each
        part = rows(TOPIC, -1, hour * 100, hour * 100 + 100)
        stamps = [1_700_000_000_000_000 + hour * 7_200_000_000 + i for i in range(100)]
        part = part.set_column(5, "timestamp", pa.array(stamps, pa.timestamp("us", tz="UTC")))
        commit.append_range(table, TOPIC, hour * 100, hour * 100 + 100, part)
        if hour == 0:
            [oldest] = [t.file.file_size_in_bytes for t in table.scan().plan_files()]
    total = sum(t.file.file_size_in_bytes for t in table.scan().plan_files())
    assert maintenance.retain_size(table, total) == 0  # within the limit
    assert maintenance.retain_size(table, total - oldest) == 1  # the oldest hour's file
    table = cat.load_table(("default", "orders"))
    assert offsets_in(table) == list(range(100, 300))
    assert maintenance.retain_size(table, 1) == 1  # the middle hour; the newest stays whatever its size
    table = cat.load_table(("default", "orders"))
    assert offsets_in(table) == list(range(200, 300))
    assert maintenance.retain_size(table, 1) == 0
    assert catalog.committed_offsets(table) == {TOPIC: 300}


def test_a_dropped_table_leaves_the_catalog_and_its_folder_and_the_others_stay(  # type: ignore[no-untyped-def]
        cat) -> None:
    from danube_fast.tables import maintenance

    gone = catalog.load_or_create(cat, "default", "gone", False, "hour", 1 << 20)
    kept = catalog.load_or_create(cat, "default", "kept", False, "hour", 1 << 20)
    for table in (gone, kept):
        commit.append_range(table, TOPIC, 0, 100, rows(TOPIC, -1, 0, 100))
    folder = Path(gone.location().removeprefix("file://"))
    assert any(folder.rglob("*.parquet")) and any(folder.rglob("*.metadata.json"))
    assert maintenance.drop(cat, ("default", "gone")) >= 3  # data, manifest list, manifest, metadata
    assert not folder.exists()
    assert cat.list_tables("default") == [("default", "kept")]
    assert maintenance.drop(cat, ("default", "gone")) == 0  # dropped already (another broker): nothing to do
    assert offsets_in(cat.load_table(("default", "kept"))) == list(range(100))


def test_maintenance_on_an_s3_warehouse_sweeps_and_drops_there(moto_server: MotoServer,
                                                                 tmp_path: Path) -> None:
    """The orphan sweep and a drop list and delete through the table's own FileIO settings (the S3
    endpoint and keys of the warehouse), not pyarrow's defaults, which would go to AWS."""
    from danube_fast.tables import maintenance

    bucket = moto_server.create_bucket()
    io = catalog.file_io(moto_server.endpoint, REGION, ACCESS_KEY, SECRET_KEY)
    location = TableCatalog(uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"s3://{bucket}/tables",
                            kind="sql")
    cat = catalog.open_catalog(location, io=io)
    table = catalog.load_or_create(cat, "default", "on_s3", False, "hour", 1 << 20)
    for low in range(0, 300, 100):
        commit.append_range(table, TOPIC, low, low + 100, rows(TOPIC, -1, low, low + 100))
    table = cat.load_table(("default", "on_s3"))
    assert maintenance.compact(table, maintenance.small_groups(table, 64 << 20, 2)[0]) == 1
    table = cat.load_table(("default", "on_s3"))
    assert maintenance.expire(table, keep_ms=0) == 3
    table = cat.load_table(("default", "on_s3"))
    assert maintenance.sweep(table, grace_ms=0) >= 3  # the three files compaction replaced, at least
    listed = s3_keys(moto_server.endpoint, bucket)
    parquet = {k for k in listed if k.endswith(".parquet")}
    assert parquet == {t.file.file_path.removeprefix("s3://" + bucket + "/")
                       for t in table.scan().plan_files()}
    assert offsets_in(table) == list(range(300))
    assert maintenance.drop(cat, ("default", "on_s3")) == len([k for k in listed if not k.endswith("/")])
    # Nothing of the table is left, not even the folder markers pyarrow wrote (the namespace's stays).
    assert s3_keys(moto_server.endpoint, bucket) == ["tables/default/"]


def s3_keys(endpoint: str, bucket: str) -> list[str]:
    import boto3  # type: ignore[import-untyped]

    client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                          aws_secret_access_key=SECRET_KEY)
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))
    finally:
        client.close()


def test_a_commits_files_are_flushed_before_the_commit_and_a_failed_flush_commits_nothing(
        cat, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    table = catalog.load_or_create(cat, "default", "orders", False, "hour", 1 << 20)
    commit.append_range(table, TOPIC, 0, 50, rows(TOPIC, -1, 0, 50))
    seen: list[tuple[list[str], int]] = []  # (the flushed files, the table's files when they were flushed)
    real = commit.flush

    def recorded(locations: Any) -> int:
        paths = list(locations)
        seen.append((paths, len(list(cat.load_table(("default", "orders")).scan().plan_files()))))
        return real(paths)

    monkeypatch.setattr(commit, "flush", recorded)
    commit.append_range(cat.load_table(("default", "orders")), TOPIC, 50, 100, rows(TOPIC, -1, 50, 100))
    [(flushed, files_then)] = seen
    planned = {t.file.file_path for t in cat.load_table(("default", "orders")).scan().plan_files()}
    assert files_then == 1 and len(flushed) == 1 and flushed[0] in planned  # flushed, then committed

    def failing(locations: Any) -> int:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(commit, "flush", failing)
    with pytest.raises(OSError):
        commit.append_range(cat.load_table(("default", "orders")), TOPIC, 100, 150, rows(TOPIC, -1, 100, 150))
    assert offsets_in(cat.load_table(("default", "orders"))) == list(range(100))


def test_flush_writes_back_local_files_and_leaves_object_store_ones(tmp_path: Path) -> None:
    from danube_fast.tables import flush

    a, b = tmp_path / "a.parquet", tmp_path / "b c.parquet"
    a.write_bytes(b"x" * (flush.CHUNK * 2 + 5))
    b.write_bytes(b"y" * 10)
    assert flush.flush([str(a), f"file://{str(b).replace(' ', '%20')}", "s3://bucket/t/c.parquet"],
                       chunk=flush.CHUNK) == flush.CHUNK * 2 + 15
    assert flush.local_path("s3://bucket/x") is None and flush.local_path("relative/x") is None
    with pytest.raises(FileNotFoundError):
        flush.flush([str(tmp_path / "missing.parquet")])



def test_a_commit_split_for_parallel_encoding_is_files_of_consecutive_offsets(cat) -> None:  # type: ignore[no-untyped-def]
    """With slices (`[tables] worker_threads`), a partition's rows go into up to that many files, each of
    consecutive offsets and none under one row group (the table's row-group-limit); every row is in the
    table once."""
    table = catalog.load_or_create(cat, "default", "orders", False, "hour", 1024)
    state = commit.append_range(table, TOPIC, 0, 3 * 1024, rows(TOPIC, -1, 0, 3 * 1024), slices=3)
    assert state.files == 3
    table = cat.load_table(("default", "orders"))
    spans = []
    for task in table.scan().plan_files():
        with table.io.new_input(task.file.file_path).open() as stream:
            offsets = pq.read_table(stream, columns=["offset"]).column("offset").to_pylist()
        assert offsets == list(range(offsets[0], offsets[-1] + 1))  # consecutive, in order
        spans.append((offsets[0], offsets[-1]))
    assert sorted(spans) == [(0, 1023), (1024, 2047), (2048, 3071)]
    assert offsets_in(table) == list(range(3 * 1024))
    # Under two row groups: one file, whatever the slices.
    small = commit.append_range(table, TOPIC, 3072, 5000, rows(TOPIC, -1, 3072, 5000), slices=3)
    assert small.files == 4


@pytest.mark.parametrize("codec, parquet_name", [("lz4", "LZ4"), ("uncompressed", "UNCOMPRESSED"),
                                                 ("zstd", "ZSTD")])
def test_a_new_tables_files_are_in_its_codec_and_an_existing_table_keeps_its_own(
        cat, codec: str, parquet_name: str) -> None:  # type: ignore[no-untyped-def]
    """`[tables] compression` is a new table's codec (Iceberg's write.parquet.compression-codec); a table
    that exists keeps the codec it has (a user may change it with any Iceberg tool)."""
    table = catalog.load_or_create(cat, "default", "orders", False, "hour", 1 << 20, compression=codec)
    commit.append_range(table, TOPIC, 0, 100, rows(TOPIC, -1, 0, 100))
    again = catalog.load_or_create(cat, "default", "orders", False, "hour", 1 << 20,
                                   compression="gzip" if codec != "gzip" else "zstd")
    assert again.properties["write.parquet.compression-codec"] == codec
    commit.append_range(again, TOPIC, 100, 200, rows(TOPIC, -1, 100, 200))
    table = cat.load_table(("default", "orders"))
    codecs = set()
    for task in table.scan().plan_files():
        with table.io.new_input(task.file.file_path).open() as stream:
            meta = pq.ParquetFile(stream).metadata
            codecs |= {meta.row_group(g).column(c).compression for g in range(meta.num_row_groups)
                       for c in range(meta.num_columns)}
    assert codecs == {parquet_name}
    assert offsets_in(table) == list(range(200))
    # Changed by another Iceberg client: not a conflict (Iceberg applies the append to the table as it now
    # is), so the writer's handle commits once more in the codec it knew, and follows the change after.
    with cat.load_table(("default", "orders")).transaction() as tx:
        tx.set_properties({"write.parquet.compression-codec": "snappy"})
    commit.append_range(again, TOPIC, 200, 300, rows(TOPIC, -1, 200, 300))
    commit.append_range(again, TOPIC, 300, 400, rows(TOPIC, -1, 300, 400))
    table = cat.load_table(("default", "orders"))
    assert offsets_in(table) == list(range(400))
    by_start = {}
    for task in table.scan().plan_files():
        with table.io.new_input(task.file.file_path).open() as stream:
            file = pq.ParquetFile(stream)
            by_start[file.read(columns=["offset"]).column(0)[0].as_py()] = \
                file.metadata.row_group(0).column(0).compression
    assert by_start == {0: parquet_name, 100: parquet_name, 200: parquet_name, 300: "SNAPPY"}


def at(table: pa.Table, *moments: str) -> pa.Table:
    """`table` with its rows' publish times spread evenly over `moments` (ISO times, UTC), in order."""
    import datetime

    stamps = [int(datetime.datetime.fromisoformat(m).replace(tzinfo=datetime.UTC).timestamp() * 1e6)
              for m in moments]
    n = table.num_rows
    values = [stamps[i * len(stamps) // n] + i for i in range(n)]
    return table.set_column(table.schema.get_field_index("timestamp"), "timestamp",
                            pa.array(values, pa.timestamp("us", tz="UTC")))


def partitions(table) -> dict[str, list[tuple[int, int]]]:  # type: ignore[no-untyped-def]
    """Each data file's partition record (as text) -> its (lowest, highest) offset, from the manifests."""
    got: dict[str, list[tuple[int, int]]] = {}
    for task in table.scan().plan_files():
        with table.io.new_input(task.file.file_path).open() as stream:
            offsets = pq.read_table(stream, columns=["offset"]).column("offset").to_pylist()
        got.setdefault(repr(task.file.partition), []).append((min(offsets), max(offsets)))
    return got


@pytest.mark.parametrize("unit, periods", [
    ("day", ["20484", "20485", "20515"]),  # days since 1970-01-01 of 2026-01-31, 2026-02-01, 2026-03-03
    ("month", ["672", "673", "674"]),  # months since 1970-01: 2026-01, 2026-02, 2026-03
    ("none", []),
])
def test_day_month_and_no_time_partitions_put_each_period_in_its_own_files(
        cat, unit: str, periods: list[str]) -> None:  # type: ignore[no-untyped-def]
    table = catalog.load_or_create(cat, "default", "orders", False, unit, 1 << 20)
    records = at(rows(TOPIC, -1, 0, 300), "2026-01-31T23:30", "2026-02-01T00:30", "2026-03-03T12:00")
    state = commit.append_range(table, TOPIC, 0, 300, records)
    assert state.partitioning == unit
    files = partitions(cat.load_table(("default", "orders")))
    if unit == "none":
        assert list(files.values()) == [[(0, 299)]]
    else:
        assert sorted(files) == [f"Record[{p}]" for p in periods]
        assert sorted(files.values()) == [[(0, 99)], [(100, 199)], [(200, 299)]]
    table = cat.load_table(("default", "orders"))
    february = table.scan(row_filter="timestamp >= '2026-02-01T00:00:00+00:00'", selected_fields=("offset",))
    assert len(list(february.plan_files())) == (1 if unit == "none" else 2)  # January's file pruned
    assert sorted(february.to_arrow().column("offset").to_pylist()) == list(range(100, 300))
    assert offsets_in(table) == list(range(300))


def test_a_table_evolved_to_day_partitions_keeps_every_row_compacts_per_spec_and_retains_whole_days(
        cat) -> None:  # type: ignore[no-untyped-def]
    """Partition evolution (the policy's tablePartitioning changed): the hour files stay, new files are per
    day, every offset is in the table once; compaction joins small files within one spec's partition, and
    size retention cuts the oldest whole day, its hour and day files alike."""
    from danube_fast.tables import maintenance

    table = catalog.load_or_create(cat, "default", "orders", False, "hour", 1 << 20)
    for low in range(0, 300, 100):  # three commits in one hour of 2026-01-31
        records = at(rows(TOPIC, -1, low, low + 100), "2026-01-31T10:00")
        commit.append_range(table, TOPIC, low, low + 100, records)
    table = catalog.load_or_create(cat, "default", "orders", False, "day", 1 << 20)
    assert commit.state(table).partitioning == "day"
    for low, moment in ((300, "2026-01-31T15:00"), (400, "2026-01-31T20:00"), (500, "2026-02-01T08:00"),
                        (600, "2026-02-01T09:00")):
        commit.append_range(table, TOPIC, low, low + 100, at(rows(TOPIC, -1, low, low + 100), moment))
    table = cat.load_table(("default", "orders"))
    assert offsets_in(table) == list(range(700))
    by_spec = sorted((task.file.spec_id, repr(task.file.partition)) for task in table.scan().plan_files())
    hour_spec, day_spec = by_spec[0][0], by_spec[-1][0]
    assert hour_spec != day_spec and by_spec.count((hour_spec, by_spec[0][1])) == 3  # the hour files stay
    assert [p for s, p in by_spec if s == day_spec] == ["Record[20484]"] * 2 + ["Record[20485]"] * 2

    groups = maintenance.small_groups(table, 128 << 20, 2)
    assert sorted(len(g) for g in groups) == [2, 2, 3]  # per spec and partition: never an hour with a day
    for group in groups:
        maintenance.compact(table, group)
    table = cat.load_table(("default", "orders"))
    assert offsets_in(table) == list(range(700)) and len(list(table.scan().plan_files())) == 3

    newest_day = next(t.file for t in table.scan().plan_files() if repr(t.file.partition) == "Record[20485]")
    assert maintenance.retain_size(table, newest_day.file_size_in_bytes) == 2  # all of 2026-01-31 went
    table = cat.load_table(("default", "orders"))
    assert offsets_in(table) == list(range(500, 700))
    assert commit.committed_offsets(table) == {TOPIC: 700}


def with_producers(table: pa.Table) -> pa.Table:
    """`table` with its records from three producers in turn and keys k0..k9."""
    n = table.num_rows
    table = table.set_column(table.schema.get_field_index("producer_name"), "producer_name",
                             pa.array([f"p{i % 3}" for i in range(n)], pa.string()))
    return table.set_column(table.schema.get_field_index("key"), "key",
                            pa.array([b"k%d" % (i % 10) for i in range(n)], pa.binary()))


def test_partition_by_fields_split_files_by_their_values_and_a_change_evolves_the_table(
        cat) -> None:  # type: ignore[no-untyped-def]
    """tablePartitionBy's fields (here an envelope table's producer_name and bucket(4, key)) beside the hour:
    every file holds one value of each, pyiceberg prunes by them, every offset is in the table once;
    compaction joins a partition's files only; a changed policy evolves the spec and the next files follow
    it."""
    by = "producer_name, bucket(4, key)"
    table = catalog.load_or_create(cat, "default", "orders", False, "hour", 1 << 20, partition_by=by)
    state = commit.append_range(table, TOPIC, 0, 300, with_producers(rows(TOPIC, -1, 0, 300)))
    assert state.partitioning == "hour, producer_name, bucket(4, key)"
    table = cat.load_table(("default", "orders"))
    tasks = list(table.scan().plan_files())
    for task in tasks:
        with table.io.new_input(task.file.file_path).open() as stream:
            got = pq.read_table(stream, columns=["producer_name", "offset"])
        assert len(set(got.column("producer_name").to_pylist())) == 1  # one producer per file
        offsets = got.column("offset").to_pylist()
        assert offsets == sorted(offsets)  # each file in offset order
    assert len(tasks) == len({repr(t.file.partition) for t in tasks}) > 3  # one file per partition
    one = table.scan(row_filter="producer_name = 'p1'", selected_fields=("offset",))
    assert len(list(one.plan_files())) < len(tasks)  # the other producers' files pruned
    assert sorted(one.to_arrow().column("offset").to_pylist()) == list(range(1, 300, 3))
    keyed = table.scan(row_filter=EqualTo("key", b"k3"), selected_fields=("offset",))
    assert len(list(keyed.plan_files())) < len(tasks)  # by the key's bucket, as Iceberg computes it
    assert sorted(keyed.to_arrow().column("offset").to_pylist()) == list(range(3, 300, 10))
    assert offsets_in(table) == list(range(300))
    commit.append_range(table, TOPIC, 300, 600, with_producers(rows(TOPIC, -1, 300, 600)))
    from danube_fast.tables import maintenance

    table = cat.load_table(("default", "orders"))
    groups = maintenance.small_groups(table, 128 << 20, 2)
    assert len(groups) == len(tasks) and all(len(g) == 2 for g in groups)  # two commits' files per partition
    for group in groups:
        maintenance.compact(table, group)
    table = cat.load_table(("default", "orders"))
    assert len(list(table.scan().plan_files())) == len(tasks) and offsets_in(table) == list(range(600))

    table = catalog.load_or_create(cat, "default", "orders", False, "hour", 1 << 20, partition_by="")
    assert commit.state(table).partitioning == "hour"
    commit.append_range(table, TOPIC, 600, 700, with_producers(rows(TOPIC, -1, 600, 700)))
    table = cat.load_table(("default", "orders"))
    newest = [t for t in table.scan().plan_files() if t.file.spec_id == table.spec().spec_id]
    assert len(newest) == 1  # all of one hour, every producer: one file
    assert offsets_in(table) == list(range(700))


def test_partition_by_a_column_the_table_lacks_or_a_type_its_transform_does_not_take_is_refused(
        cat) -> None:  # type: ignore[no-untyped-def]
    from danube_fast.tables import partitions
    from danube_fast.tables.errors import PartitionSpecError

    table = catalog.load_or_create(cat, "default", "orders", False, "hour", 1 << 20, partition_by="region")
    assert commit.state(table).partitioning == "hour"  # not strict at load: a schema table gets columns later
    with pytest.raises(PartitionSpecError, match=r"names region, which the table has no column for \(its "
                                                 r"columns: key, value, topic"):
        partitions.fit(table, "hour", "region")
    with pytest.raises(PartitionSpecError, match=r"day\(key\) does not apply to column key of type binary"):
        partitions.fit(table, "hour", "day(key)")
    assert cat.load_table(("default", "orders")).spec().fields == table.spec().fields  # unchanged

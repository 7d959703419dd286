"""`read_table(spark, topic, **options)`: a topic as one DataFrame, its Iceberg table (docs/TABLES.md) scanned
by Spark's own Parquet reader, plus the records the table does not hold yet from `format("danube")`.

Planning, on the driver: the metadata store (read-only) names the catalog; the table's current snapshot gives
the data files (pyiceberg's scan planning: never a folder listing, which would see uncommitted or
compacted-away files) and, in its summary, the next offset the table lacks for each stored topic. The
DataFrame is the union of
- `spark.read.parquet(files)`: every row of the snapshot, columnar, with Spark's column pruning and
  Parquet row-group skipping on `offset` and `timestamp` filters, no Python per row;
- `format("danube")` from those offsets to each stored topic's committed offset, asked of its broker right
  after the snapshot was read (startingOffsets and endingOffsets JSON): what reached the topic after the
  snapshot; left out when the table holds everything.
Each offset is in exactly one side, so every acknowledged record appears once, in one consistent view fixed
when `read_table` is called (call it again to see newer records).

Time travel: with `snapshotId` (a snapshot's id, `table_snapshots` lists them) or `asOfTimestamp` (ms since
the epoch, or ISO 8601 with its zone: the snapshot current then), the DataFrame is that snapshot's rows
alone, no tail: the same rows at every read, for as long as the table keeps the snapshot (`[tables]
snapshot_keep_ms`).

A table of mode schema has the table's columns (its Iceberg schema: every version's fields); its tail is
read with valueFormat (the subject's kind, a table property) and its value's fields become the same
columns; a column of the table the tail's version lacks is null there. A tail record that does not decode is
left out, as the writer leaves it out of the table (it goes to the dead-letter table).
"""

from __future__ import annotations

import asyncio
import datetime
import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.types import StructType

from pyspark_danube import columns, options
from pyspark_danube.plan import CommittedOffsets, PlanError, Stored, owners, stored_topics

if TYPE_CHECKING:
    from pyiceberg.table import DataScan, Table
    from pyiceberg.table.snapshots import Snapshot
    from pyspark.sql import DataFrame, SparkSession

    from danube_fast.access.metadata import TableCatalog

# Options that choose rows: read_table reads a whole topic; filter the DataFrame instead (Spark pushes
# offset and timestamp filters into the Parquet scan).
NOT_FOR_TABLES = ("topic", "topics", "topicPattern", "startingOffsets", "endingOffsets", "startingTimestamp",
                  "endingTimestamp", "valueFormat")


class TableError(ValueError):
    """The topic has no table, or its catalog cannot be read, or it does not keep the snapshot asked for."""


@dataclass(frozen=True)
class TimeTravel:
    """Which snapshot to read instead of the current one (and its tail): by id, or the one current at a
    time (ms since the epoch)."""

    snapshot_id: int | None = None
    as_of_ms: int | None = None


TRAVEL_OPTIONS = ("snapshotId", "asOfTimestamp")


def time_travel(opts: dict[str, str]) -> tuple[TimeTravel | None, dict[str, str]]:
    """The time-travel options of `opts` (names compared without case, as Spark's are) and the others."""
    travel: dict[str, str] = {}
    rest: dict[str, str] = {}
    for key, value in opts.items():
        name = next((n for n in TRAVEL_OPTIONS if n.lower() == key.lower()), None)
        if name is None:
            rest[key] = value
        else:
            travel[name] = str(value).strip()
    if not travel:
        return None, rest
    if len(travel) > 1:
        raise options.OptionError("give one of snapshotId and asOfTimestamp, not both")
    if "snapshotId" in travel:
        try:
            return TimeTravel(snapshot_id=int(travel["snapshotId"])), rest
        except ValueError:
            raise options.OptionError(f"snapshotId must be a snapshot's id (an integer), not "
                                      f"{travel['snapshotId']!r}") from None
    text = travel["asOfTimestamp"]
    if text.isdigit():
        return TimeTravel(as_of_ms=int(text)), rest
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise options.OptionError(f"asOfTimestamp must be ms since the epoch or an ISO 8601 time with its "
                                  f"zone (2026-11-29T10:00:00+00:00), not {text!r}")
    return TimeTravel(as_of_ms=int(moment.timestamp() * 1000)), rest


@dataclass(frozen=True)
class TablePlan:
    files: list[str]  # the current snapshot's data files
    offsets: dict[str, int]  # stored topic -> next offset the table lacks
    stored: list[Stored]  # every stored topic of the topic (partitions expanded)
    metadata_location: str
    committed: dict[str, int] = field(default_factory=dict)  # stored topic -> its committed offset after
    snapshot_id: int | None = None  # the snapshot read (None: the table has none yet)
    pinned: bool = False  # time travel: the snapshot alone, no tail
    mode: str = "envelope"  # the table mode of the table (docs/TABLES.md)
    columns: pa.Schema | None = None  # schema mode: the table's columns
    value_format: str = ""  # schema mode: avro or json, how the tail's values are decoded

    def tail(self) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]] | None:
        """startingOffsets and endingOffsets (JSON objects) of the records after the table's, up to the
        committed offsets; None when the table holds them all."""
        if self.pinned:
            return None
        starting: dict[str, dict[str, int]] = {}
        ending: dict[str, dict[str, int]] = {}
        newer = False
        for s in self.stored:
            start = self.offsets.get(s.name, options.EARLIEST)
            end = self.committed[s.name]
            newer |= end > max(start, 0)
            starting.setdefault(s.topic, {})[str(s.partition)] = min(start, end) if start >= 0 else start
            ending.setdefault(s.topic, {})[str(s.partition)] = end
        return (starting, ending) if newer else None


def read_table(spark: SparkSession, topic: str, where: str | None = None, **opts: str) -> DataFrame:
    """The topic's records: its table's snapshot plus the newer records (module docstring). `opts` are
    format('danube')'s store, S3, TLS and timeout options (metadataStore and objectStore at least).

    `where`, a Spark SQL condition, filters the DataFrame; when pyiceberg's expression parser reads it too
    (comparisons, IN, IS NULL, AND/OR/NOT of columns and literals: `offset >= 1000 AND timestamp <
    '2026-11-29T10:00:00+00:00'`), the planning also leaves out the files whose column bounds cannot match,
    so Spark does not open them. `df.where(...)` after read_table gives the same rows, without that.

    `snapshotId` or `asOfTimestamp` read one snapshot of the table alone (module docstring)."""
    travel, opts = time_travel(opts)
    chosen = sorted(k for k in opts if k.lower() in {n.lower() for n in NOT_FOR_TABLES})
    if chosen:
        raise options.OptionError(f"read_table reads the whole topic; option(s) {', '.join(chosen)} do not "
                                  "apply (filter the DataFrame on offset or timestamp instead)")
    parsed = options.parse({**opts, "topic": topic})
    plan = asyncio.run(plan_table(parsed, topic, where, travel))
    schema = columns.SCHEMA if plan.columns is None else _spark_schema(plan.columns)
    if plan.files:
        table = spark.read.schema(schema).parquet(*plan.files)
    else:
        table = spark.createDataFrame([], schema)
    bounds = plan.tail()
    if where is not None:
        table = table.where(where)
    if bounds is None:
        return table
    reader = (spark.read.format("danube").options(**opts).option("topic", topic)
              .option("startingOffsets", json.dumps(bounds[0]))
              .option("endingOffsets", json.dumps(bounds[1])))
    typed = plan.mode == "schema"
    tail = _typed(reader.option("valueFormat", plan.value_format).load()) if typed else reader.load()
    if where is not None:
        tail = tail.where(where)
    return table.unionByName(tail, allowMissingColumns=typed)


def _spark_schema(arrow: pa.Schema) -> StructType:
    spark_type = from_arrow_type(pa.struct(list(arrow)))
    assert isinstance(spark_type, StructType)
    return spark_type


def _typed(tail: DataFrame) -> DataFrame:
    """The tail decoded by valueFormat in the schema table's columns (danube_fast/tables/typed.py): a
    record's fields as columns, without the records that did not decode (the table's writer puts those in
    the dead-letter table)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from danube_fast.access.tables import column_name

    value = tail.schema["value"].dataType
    if not isinstance(value, StructType):
        return tail
    envelope = [F.col(f"`{c}`") for c in tail.columns if c != "value"]
    fields = [F.col("value").getField(f.name).alias(column_name(f.name)) for f in value.fields]
    return tail.where(F.col("value").isNotNull()).select(*envelope, *fields)


def create_table_view(spark: SparkSession, topic: str, view: str, **opts: str) -> None:
    """`read_table(...)` as a temporary view `view`, for SQL: `SELECT ... FROM view`."""
    read_table(spark, topic, **opts).createOrReplaceTempView(view)


async def plan_table(opts: options.Options, topic: str, where: str | None = None,
                     travel: TimeTravel | None = None) -> TablePlan:
    from danube_fast.access.metadata import open_reader

    meta = await open_reader(opts.metadata_store, access=opts.etcd)
    try:
        stored = await stored_topics(meta, opts)  # PlanError for a topic that does not exist
        brokers = await owners(meta, stored)
        location, pointer = await _locate(meta, opts, topic)
    finally:
        await meta.close()
    plan = await asyncio.to_thread(_snapshot, location, pointer, opts, topic, stored, where, travel)
    return plan if travel is not None else await _with_committed(plan, brokers, opts)


async def _locate(meta: Any, opts: options.Options, topic: str) -> tuple[TableCatalog, str | None]:
    """Where the topic's table is: its catalog, and, for the catalog on the metadata store, its current
    metadata file."""
    from danube_fast.access.metadata import TableCatalog, TablePointer, keys

    namespace, base = topic.split("/")[1:]
    kv = await meta.get(keys.tables_catalog())
    if kv is None:
        raise TableError(f"no broker has written a table catalog to {opts.metadata_store}: turn tables "
                         f"on with `danube-fast admin policies set {topic} --table envelope`")
    location = TableCatalog.from_json(kv.value, key=kv.key)
    if location.kind != "metadata":
        return location, None
    got = await meta.get(keys.table_pointer(namespace, base))
    if got is None:
        raise _no_table(topic)
    return location, TablePointer.from_json(got.value, key=got.key).metadata_location


def table_snapshots(topic: str, **opts: str) -> list[dict[str, Any]]:
    """The snapshots the topic's table keeps, oldest first: `snapshot_id`, `committed_at` (ISO 8601, UTC),
    `operation` (append; overwrite or delete for compaction and retention), `offsets` (stored topic -> the
    next offset the table lacked then), `records` and `files` (the table's totals then). `opts`: the
    store, S3 and TLS options of read_table. Give `read_table` a snapshot_id (snapshotId) or a time
    (asOfTimestamp) to read one."""
    from danube_fast.access.metadata import open_reader

    parsed = options.parse({**opts, "topic": topic})

    async def locate() -> tuple[TableCatalog, str | None]:
        meta = await open_reader(parsed.metadata_store, access=parsed.etcd)
        try:
            return await _locate(meta, parsed, topic)
        finally:
            await meta.close()

    from danube_fast.access.tables import snapshots

    table = _load(*asyncio.run(locate()), parsed, topic)
    return [{"snapshot_id": s.snapshot_id, "committed_at": _iso(s.committed_at_ms), "operation": s.operation,
             "offsets": s.offsets, "records": s.records, "files": s.files} for s in snapshots(table)]


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat()


async def _with_committed(plan: TablePlan, brokers: dict[str, str], opts: options.Options) -> TablePlan:
    """`plan` with each stored topic's committed offset, asked of its broker (`brokers`: host:port by stored
    topic) after the snapshot was read (so it is at least the table's): where the tail ends."""
    committed_of = CommittedOffsets(opts.broker_timeout, opts.credentials)
    committed = {}
    for s in plan.stored:
        broker = brokers.get(s.name)
        got = await committed_of(broker, s.name) if broker else None
        if got is None:
            raise PlanError(f"{s.name}: no broker serving it could be reached for its committed offset, so "
                            "the records after the table's cannot be bounded")
        committed[s.name] = got[1]
    return replace(plan, committed=committed)


def _no_table(topic: str) -> TableError:
    return TableError(f"topic {topic} has no table yet: turn it on with `danube-fast admin policies set "
                      f"{topic} --table envelope`, and wait for the first commit")


def _load(location: TableCatalog, pointer: str | None, opts: options.Options, topic: str) -> Table:
    """The topic's table, read-only: from the catalog (sql), or from the metadata file the metadata store
    points at (metadata)."""
    from pyiceberg.exceptions import NoSuchTableError
    from pyiceberg.table import StaticTable

    from danube_fast.access.tables import open_catalog

    namespace, base = topic.split("/")[1:]
    try:
        if pointer is not None:
            return StaticTable.from_metadata(pointer, properties=_file_io(opts))
        return open_catalog(location, read_only=True, io=_file_io(opts)).load_table((namespace, base))
    except NoSuchTableError:
        raise _no_table(topic) from None
    except Exception as e:
        raise TableError(f"cannot read the table of {topic} ({location.kind} catalog "
                         f"{location.uri or 'on the metadata store'}): {e}") from e


def _snapshot(location: TableCatalog, pointer: str | None, opts: options.Options, topic: str,
              stored: list[Stored], where: str | None = None, travel: TimeTravel | None = None) -> TablePlan:
    """The plan of the table's current snapshot, or of the one `travel` names."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from danube_fast.access.tables import FORMAT_PROPERTY, MODE_PROPERTY, snapshot_offsets

    table = _load(location, pointer, opts, topic)
    snapshot = table.current_snapshot() if travel is None else _travelled(table, topic, travel)
    if snapshot is None:
        plan = TablePlan([], {}, stored, table.metadata_location, pinned=travel is not None)
    else:
        files = [task.file.file_path for task in _scan(table, where, snapshot.snapshot_id).plan_files()]
        plan = TablePlan(files, snapshot_offsets(snapshot), stored, table.metadata_location,
                         snapshot_id=snapshot.snapshot_id, pinned=travel is not None)
    mode = table.properties.get(MODE_PROPERTY, "envelope")
    if mode != "schema":
        return plan
    schema = table.schema()  # the snapshot's own when it names one: a later version's columns are not in it
    if snapshot is not None and snapshot.schema_id is not None:
        schema = table.schemas().get(snapshot.schema_id, schema)
    return replace(plan, mode=mode, columns=schema_to_pyarrow(schema, include_field_ids=False),
                   value_format=table.properties.get(FORMAT_PROPERTY, ""))


def _travelled(table: Table, topic: str, travel: TimeTravel) -> Snapshot:
    """The snapshot `travel` names; TableError saying which ones the table keeps when it is not one."""
    if travel.snapshot_id is not None:
        snapshot = table.snapshot_by_id(travel.snapshot_id)
        asked = f"snapshot {travel.snapshot_id}"
    else:
        assert travel.as_of_ms is not None
        snapshot = table.snapshot_as_of_timestamp(travel.as_of_ms)
        asked = f"a snapshot current at {_iso(travel.as_of_ms)}"
    if snapshot is not None:
        return snapshot
    kept = sorted(s.timestamp_ms for s in table.snapshots())
    oldest = f"the oldest it keeps was committed at {_iso(kept[0])}" if kept else "it has none yet"
    raise TableError(f"the table of {topic} does not keep {asked}: {oldest} (snapshots are kept [tables] "
                     f"snapshot_keep_ms; pyspark_danube.table_snapshots lists them)")


def _scan(table: Table, where: str | None, snapshot_id: int | None = None) -> DataScan:
    """The snapshot's scan, pruned by `where` when pyiceberg reads it (else every file: Spark filters)."""
    from pyiceberg.expressions.parser import parse

    if where is not None:
        try:
            return table.scan(row_filter=parse(where), snapshot_id=snapshot_id)
        except Exception:  # not in pyiceberg's grammar, or a column it cannot bind: Spark's filter decides
            pass
    return table.scan(snapshot_id=snapshot_id)


def _file_io(opts: options.Options) -> dict[str, str]:
    """pyiceberg FileIO settings for a warehouse on S3, from the source's S3 options."""
    from danube_fast.access.tables import file_io

    s3 = opts.s3
    return file_io(s3.endpoint, s3.region, s3.access_key, s3.secret_key)

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

A table of mode schema has the table's columns (its Iceberg schema: every version's fields); its tail is
read with valueFormat (the subject's kind, a table property) and its value's fields become the same
columns; a column of the table the tail's version lacks is null there. A tail record that does not decode is
left out, as the writer leaves it out of the table (it goes to the dead-letter table).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.types import StructType

from pyspark_danube import columns, options
from pyspark_danube.plan import CommittedOffsets, PlanError, Stored, owners, stored_topics

if TYPE_CHECKING:
    from pyiceberg.table import DataScan, Table
    from pyspark.sql import DataFrame, SparkSession

    from danube_fast.access.metadata import TableCatalog

# Options that choose rows: read_table reads a whole topic; filter the DataFrame instead (Spark pushes
# offset and timestamp filters into the Parquet scan).
NOT_FOR_TABLES = ("topic", "topics", "topicPattern", "startingOffsets", "endingOffsets", "startingTimestamp",
                  "endingTimestamp", "valueFormat")


class TableError(ValueError):
    """The topic has no table, or its catalog cannot be read."""


@dataclass(frozen=True)
class TablePlan:
    files: list[str]  # the current snapshot's data files
    offsets: dict[str, int]  # stored topic -> next offset the table lacks
    stored: list[Stored]  # every stored topic of the topic (partitions expanded)
    metadata_location: str
    committed: dict[str, int] = field(default_factory=dict)  # stored topic -> its committed offset after
    mode: str = "envelope"  # the table mode of the table (docs/TABLES.md)
    columns: pa.Schema | None = None  # schema mode: the table's columns
    value_format: str = ""  # schema mode: avro or json, how the tail's values are decoded

    def tail(self) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]] | None:
        """startingOffsets and endingOffsets (JSON objects) of the records after the table's, up to the
        committed offsets; None when the table holds them all."""
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
    so Spark does not open them. `df.where(...)` after read_table gives the same rows, without that."""
    chosen = sorted(k for k in opts if k.lower() in {n.lower() for n in NOT_FOR_TABLES})
    if chosen:
        raise options.OptionError(f"read_table reads the whole topic; option(s) {', '.join(chosen)} do not "
                                  "apply (filter the DataFrame on offset or timestamp instead)")
    parsed = options.parse({**opts, "topic": topic})
    plan = asyncio.run(plan_table(parsed, topic, where))
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


async def plan_table(opts: options.Options, topic: str, where: str | None = None) -> TablePlan:
    from danube_fast.access.metadata import TableCatalog, TablePointer, keys, open_reader

    namespace, base = topic.split("/")[1:]
    meta = await open_reader(opts.metadata_store, access=opts.etcd)
    try:
        stored = await stored_topics(meta, opts)  # PlanError for a topic that does not exist
        brokers = await owners(meta, stored)
        kv = await meta.get(keys.tables_catalog())
        if kv is None:
            raise TableError(f"no broker has written a table catalog to {opts.metadata_store}: turn tables "
                             f"on with `danube-fast admin policies set {topic} --table envelope`")
        location = TableCatalog.from_json(kv.value, key=kv.key)
        pointer = None
        if location.kind == "metadata":
            got = await meta.get(keys.table_pointer(namespace, base))
            if got is None:
                raise _no_table(topic)
            pointer = TablePointer.from_json(got.value, key=got.key).metadata_location
    finally:
        await meta.close()
    plan = await asyncio.to_thread(_snapshot, location, pointer, opts, topic, stored, where)
    return await _with_committed(plan, brokers, opts)


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


def _snapshot(location: TableCatalog, pointer: str | None, opts: options.Options, topic: str,
              stored: list[Stored], where: str | None = None) -> TablePlan:
    """The table's current snapshot: from the catalog (sql), or from the metadata file the metadata store
    points at (metadata)."""
    from pyiceberg.exceptions import NoSuchTableError
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.table import StaticTable

    from danube_fast.access.tables import FORMAT_PROPERTY, MODE_PROPERTY, committed_offsets, open_catalog

    namespace, base = topic.split("/")[1:]
    table: Table
    try:
        if pointer is not None:
            table = StaticTable.from_metadata(pointer, properties=_file_io(opts))
        else:
            table = open_catalog(location, read_only=True, io=_file_io(opts)).load_table((namespace, base))
    except NoSuchTableError:
        raise _no_table(topic) from None
    except Exception as e:
        raise TableError(f"cannot read the table of {topic} ({location.kind} catalog "
                         f"{location.uri or 'on the metadata store'}): {e}") from e
    snapshot = table.current_snapshot()
    files = [] if snapshot is None else [task.file.file_path for task in _scan(table, where).plan_files()]
    mode = table.properties.get(MODE_PROPERTY, "envelope")
    if mode != "schema":
        return TablePlan(files, committed_offsets(table), stored, table.metadata_location)
    return TablePlan(files, committed_offsets(table), stored, table.metadata_location, mode=mode,
                     columns=schema_to_pyarrow(table.schema(), include_field_ids=False),
                     value_format=table.properties.get(FORMAT_PROPERTY, ""))


def _scan(table: Table, where: str | None) -> DataScan:
    """The snapshot's scan, pruned by `where` when pyiceberg reads it (else every file: Spark filters)."""
    from pyiceberg.expressions.parser import parse

    if where is not None:
        try:
            return table.scan(row_filter=parse(where))
        except Exception:  # not in pyiceberg's grammar, or a column it cannot bind: Spark's filter decides
            pass
    return table.scan()


def _file_io(opts: options.Options) -> dict[str, str]:
    """pyiceberg FileIO settings for a warehouse on S3, from the source's S3 options."""
    from danube_fast.access.tables import file_io

    s3 = opts.s3
    return file_io(s3.endpoint, s3.region, s3.access_key, s3.secret_key)

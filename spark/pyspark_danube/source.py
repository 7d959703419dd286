"""`format("danube")`: the DataSource, and its batch readers (the stream reader is in stream.py, the
writers in writer.py).

Planning runs on the driver's Python worker (`partitions()`): options, metadata, offsets and, when a time
bound is set, the footers of candidate objects. Executors only fetch and decode (fetch.py). Every error the
user can fix (an option, a missing topic, an unreachable store) surfaces before any task runs.

Two readers, because PySpark refuses a reader that defines `pushFilters` when
`spark.sql.python.filterPushdown.enabled` is false, and does not tell `DataSource.reader` which it is: Spark
asks the reader for filters in a worker of its own (pyspark.sql.worker.data_source_pushdown_filters) only when
pushdown is on, so `reader()` returns the pushdown reader when called from there and the plain one otherwise.

PySpark 4.1 to 4.3 keep the partitions a scan planned on the relation a DataFrame was loaded from, and reuse
them for a later action on that DataFrame that has no filter to push: `df.where("offset > 9").count()` then
`df.count()` counts only the rows of the first (measured with pyspark 4.3.0; Spark's later PythonScanBuilder
keeps them per scan). A reader that prunes in pushFilters would return wrong rows there, so with
`filterPushdown=auto` (the default) pushdown prunes only on PySpark 4.4 and later; `true` prunes on any
version, for jobs that load a DataFrame per query; `false` never prunes.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    Filter,
    InputPartition,
)
from pyspark.sql.types import StructType

from pyspark_danube import columns, options, values
from pyspark_danube.fetch import read_chunk
from pyspark_danube.plan import Chunk, CommittedOffsets, plan
from pyspark_danube.pushdown import Bounds, push

PUSHDOWN_WORKER = "pyspark.sql.worker.data_source_pushdown_filters"


class DanubeDataSource(DataSource):
    """Reads the records of Danube topics from the object tier and their owning brokers; see README, Spark."""

    @classmethod
    def name(cls) -> str:
        return "danube"

    def schema(self) -> StructType:
        # valueFormat avro/json: `value` typed by the topics' schema subject, resolved here on the driver; the
        # resolution rides in self.options to the readers Spark makes from this (pickled) instance.
        return values.declared_schema(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        parsed = options.parse(self.options)
        try:
            columns.check_projection(schema, columns.SCHEMA)
        except ValueError as e:
            raise options.OptionError(str(e)) from None
        if _called_from(PUSHDOWN_WORKER) and pushdown_safe(parsed):
            return PushdownReader(parsed, schema)
        return BatchReader(parsed, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from pyspark_danube.stream import DanubeStreamReader

        return DanubeStreamReader(options.parse(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from pyspark_danube.writer import DanubeWriter

        return DanubeWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from pyspark_danube.writer import DanubeStreamWriter

        return DanubeStreamWriter(self.options, schema, overwrite)


class BatchReader(DataSourceReader):
    def __init__(self, opts: options.Options, schema: StructType) -> None:
        self.options = opts
        self.schema = schema
        self.bounds = Bounds()

    def partitions(self) -> Sequence[InputPartition]:
        return asyncio.run(_plan(self.options, self.bounds))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, Chunk):  # Spark reads one placeholder partition when planning found none
            return iter(())
        return read_chunk(partition, columns.arrow_schema(self.schema))


class PushdownReader(BatchReader):
    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        self.bounds, rest = push(list(filters), self.bounds)
        return rest


async def _plan(opts: options.Options, bounds: Bounds) -> list[Chunk]:
    from danube_fast.access.metadata import open_reader
    from danube_fast.access.objects import open_object_store

    meta = await open_reader(opts.metadata_store, access=opts.etcd)
    try:
        store = await open_object_store(
            opts.object_store, **(opts.s3.kwargs() if opts.object_store.startswith("s3://") else {}))
        try:
            committed = CommittedOffsets(opts.broker_timeout, opts.credentials)
            return await plan(meta, store, opts, committed, bounds)
        finally:
            await store.close()
    finally:
        await meta.close()


SAFE_PUSHDOWN = (4, 4)  # the first PySpark that keeps a pushdown's partitions per scan (see above)


def pushdown_safe(opts: options.Options) -> bool:
    if opts.filter_pushdown != "auto":
        return opts.filter_pushdown == "true"
    import pyspark

    version = tuple(int(p) for p in pyspark.__version__.split(".")[:2] if p.isdigit())
    return version >= SAFE_PUSHDOWN


def _called_from(module: str) -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == module:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False

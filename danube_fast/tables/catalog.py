"""The catalog of topic tables, the table of a topic, and the offsets a table holds (docs/TABLES.md).

Where the catalog is: the metadata store's `/danube-data/tables/catalog` key (`TableCatalog`: its kind, a
SQLAlchemy URI and a warehouse), written by the brokers, so that a reader that knows the metadata store (the
Spark source's `metadataStore` option) finds every table without another setting. Standalone's catalog is
pyiceberg's SQL catalog on a SQLite file under the data dir; a cluster's is the catalog on the metadata store
(meta_catalog.py) unless a SQL catalog URI is given. pyiceberg is imported on first use (it costs a broker
start 0.4 s otherwise).

A topic's table is `{namespace}.{topic}` (a partitioned topic's base name: its partitions share one table).
What the table holds is written in every snapshot's summary under `danube.offsets`: a JSON object from stored
topic (`/ns/t` or `/ns/t-part-N`) to the next offset the table lacks. Every commit carries the whole object
forward (a snapshot's summary holds only that snapshot's properties), so the current snapshot alone says
where each stored topic's writer resumes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from danube_fast.meta.resources_storage import TableCatalog
from danube_fast.tables.errors import ModeMismatch
from danube_fast.tables.pointers import PointerStore

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

OFFSETS = "danube.offsets"  # snapshot summary: {stored topic: next offset the table lacks}
TOPIC_PROPERTY = "danube.topic"  # table property: the topic the table keeps
MODE_PROPERTY = "danube.table-mode"  # table property: the table mode its columns follow
SCHEMA_PROPERTY = "danube.schema-version"  # schema mode: "{subject}:{version}" whose columns it has
FORMAT_PROPERTY = "danube.value-format"  # schema mode: avro or json, the subject's kind
DEAD_LETTER_SUFFIX = "__dlq"
CATALOG_NAME = "danube"


def standalone_catalog(data_dir: str, uri: str = "", warehouse: str = "") -> TableCatalog:
    """A standalone broker's catalog: the settings, else a SQLite file and a folder under the data dir."""
    root = os.path.abspath(os.path.join(data_dir, "tables"))
    return TableCatalog(uri=uri or f"sqlite:///{os.path.join(root, 'catalog.db')}",
                        warehouse=warehouse or f"file://{os.path.join(root, 'warehouse')}", kind="sql")


def cluster_catalog(object_store: str, uri: str = "", warehouse: str = "") -> TableCatalog:
    """A cluster's catalog: a SQL catalog when `uri` is set, else the one on the metadata store; files under
    `warehouse`, else under the object store (`s3://bucket/prefix/tables`, or a shared folder's `tables`)."""
    if not warehouse:
        warehouse = (object_store.rstrip("/") + "/tables" if object_store.startswith("s3://")
                     else f"file://{os.path.join(os.path.abspath(object_store), 'tables')}")
    return TableCatalog(uri=uri, warehouse=warehouse, kind="sql" if uri else "metadata")


def file_io(endpoint: str | None = None, region: str | None = None, access_key: str | None = None,
            secret_key: str | None = None) -> dict[str, str]:
    """pyiceberg FileIO settings for a warehouse on S3 (the object store's endpoint and keys)."""
    given = {"s3.endpoint": endpoint, "s3.region": region, "s3.access-key-id": access_key,
             "s3.secret-access-key": secret_key}
    return {k: v for k, v in given.items() if v}


def open_catalog(location: TableCatalog, *, read_only: bool = False, pointers: PointerStore | None = None,
                 io: Mapping[str, str] | None = None) -> Catalog:
    """The catalog at `location`; `io` adds FileIO settings (S3 endpoint and keys, file_io()).

    - kind "sql": pyiceberg's SQL catalog (its tables are created on first use). `read_only`, for readers:
      nothing is created, and a SQLite file is opened with SQLite's read-only mode, safely next to the broker
      that writes it.
    - kind "metadata": the catalog on the metadata store (meta_catalog.py), for a broker's table worker:
      `pointers` (pointers.py, the store's calls it makes) is required."""
    if location.kind == "metadata":
        from danube_fast.tables.meta_catalog import MetaCatalog

        if pointers is None:
            raise ValueError("the catalog on the metadata store needs the store's pointer calls")
        return MetaCatalog(CATALOG_NAME, pointers, warehouse=location.warehouse, **(io or {}))
    from pyiceberg.catalog.sql import SqlCatalog

    if read_only:
        uri = location.uri
        if uri.startswith("sqlite:///"):
            path = uri.removeprefix("sqlite:///")
            if not os.path.exists(path):
                raise FileNotFoundError(f"the table catalog {path} does not exist (no table was written yet)")
            uri = f"sqlite:///file:{path}?mode=ro&uri=true"
        return SqlCatalog(CATALOG_NAME, uri=uri, warehouse=location.warehouse, init_catalog_tables="false",
                          **(io or {}))
    if location.uri.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(location.uri.removeprefix("sqlite:///")) or ".", exist_ok=True)
    if location.warehouse.startswith("file://"):
        os.makedirs(location.warehouse.removeprefix("file://"), exist_ok=True)
    return SqlCatalog(CATALOG_NAME, uri=location.uri, warehouse=location.warehouse, **(io or {}))


def identifier(namespace: str, base_topic: str) -> tuple[str, str]:
    return namespace, base_topic


def table_properties(row_group_rows: int, compression: str = "zstd") -> dict[str, str]:
    return {
        "write.parquet.compression-codec": compression,
        "write.parquet.row-group-limit": str(row_group_rows),
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "50",
        # A conflicting commit must fail, not be replayed on top of the winner with our stale offsets:
        # commit.py decides what to write again from the table as it then is.
        "commit.retry.num-retries": "0",
    }


def load_or_create(catalog: Catalog, namespace: str, base_topic: str, partitioned: bool, time_unit: str,
                   row_group_rows: int, mode: str = "envelope", compression: str = "zstd",
                   partition_by: str = "") -> Table:
    """The topic's table, created (with its namespace) when missing. `mode` is the table mode its columns
    follow: envelope (also the dead-letter table's form) or schema (the envelope without `value`; the value
    columns are added by the writer, tables/typed.py). A table of another mode is refused (ModeMismatch).
    `time_unit` and `partition_by` are the policy's tablePartitioning and tablePartitionBy: a table
    partitioned otherwise is evolved to them (tables/partitions.py `fit`; a field whose column the table
    does not have yet is left for the writer's commit to add). `row_group_rows` and `compression` are a new
    table's: an existing table keeps its own properties."""
    from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError

    from danube_fast.tables.envelope import SCHEMA
    from danube_fast.tables.partitions import fit, partition_spec

    ident = identifier(namespace, base_topic)
    try:
        table = catalog.load_table(ident)
    except NoSuchTableError:
        catalog.create_namespace_if_not_exists(namespace)
        schema = SCHEMA if mode == "envelope" else SCHEMA.select(
            *(f.name for f in SCHEMA.fields if f.name != "value"))
        try:
            table = catalog.create_table(
                ident, schema=schema, partition_spec=partition_spec(partitioned, time_unit),
                properties={**table_properties(row_group_rows, compression),
                            TOPIC_PROPERTY: f"/{namespace}/{base_topic}", MODE_PROPERTY: mode})
        except TableAlreadyExistsError:  # another partition's writer created it meanwhile
            table = catalog.load_table(ident)
    held = table.properties.get(MODE_PROPERTY, "envelope")
    if held != mode:
        raise ModeMismatch(f"table {'.'.join(ident)} was written in table mode {held}, and the topic's "
                           f"policy now says {mode}: set the policy back, or drop the table (or rename it) "
                           f"to start a {mode} table from the topic's first kept offset")
    return fit(table, time_unit, partition_by, strict=False)


def dead_letter_name(base_topic: str) -> str:
    """The schema-mode table's dead-letter table: `{topic}__dlq`, in envelope form."""
    return f"{base_topic}{DEAD_LETTER_SUFFIX}"


def committed_offsets(table: Table) -> dict[str, int]:
    """{stored topic: next offset the table lacks} as of the current snapshot ({} before the first)."""
    snapshot = table.current_snapshot()
    return {} if snapshot is None else snapshot_offsets(snapshot)


def snapshot_offsets(snapshot: Snapshot) -> dict[str, int]:
    """{stored topic: next offset the table lacked} as of `snapshot` (its summary's danube.offsets)."""
    summary = snapshot.summary.additional_properties if snapshot.summary is not None else {}
    return parse_offsets(summary.get(OFFSETS))


def parse_offsets(text: str | None) -> dict[str, int]:
    if not text:
        return {}
    value = json.loads(text)
    if not isinstance(value, dict) or not all(isinstance(v, int) for v in value.values()):
        raise ValueError(f"snapshot summary {OFFSETS} is not an object of offsets: {text[:100]!r}")
    return {str(k): int(v) for k, v in value.items()}


def dump_offsets(offsets: Mapping[str, int]) -> str:
    return json.dumps(dict(sorted(offsets.items())), separators=(",", ":"))

"""The catalog of topic tables, the table of a topic, and the offsets a table holds (docs/TABLES.md).

Where the catalog is: the metadata store's `/danube-data/tables/catalog` key (`TableCatalog`: a SQLAlchemy URI
and a warehouse), written by the brokers, so that a reader that knows the metadata store (the Spark source's
`metadataStore` option) finds every table without another setting. Standalone's catalog is pyiceberg's SQL
catalog on a SQLite file under the data dir. pyiceberg is imported on first use (it costs a broker start
0.4 s otherwise).

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

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

OFFSETS = "danube.offsets"  # snapshot summary: {stored topic: next offset the table lacks}
TOPIC_PROPERTY = "danube.topic"  # table property: the topic the table keeps
CATALOG_NAME = "danube"


def standalone_catalog(data_dir: str, uri: str = "", warehouse: str = "") -> TableCatalog:
    """A standalone broker's catalog: the settings, else a SQLite file and a folder under the data dir."""
    root = os.path.abspath(os.path.join(data_dir, "tables"))
    return TableCatalog(uri=uri or f"sqlite:///{os.path.join(root, 'catalog.db')}",
                        warehouse=warehouse or f"file://{os.path.join(root, 'warehouse')}")


def open_catalog(location: TableCatalog, *, read_only: bool = False, **properties: str) -> Catalog:
    """pyiceberg's SQL catalog at `location` (its tables are created on first use); `properties` add FileIO
    settings (S3 endpoint and keys). `read_only`, for readers: nothing is created, and a SQLite file is
    opened with SQLite's read-only mode, safely next to the broker that writes it."""
    from pyiceberg.catalog.sql import SqlCatalog

    if read_only:
        uri = location.uri
        if uri.startswith("sqlite:///"):
            path = uri.removeprefix("sqlite:///")
            if not os.path.exists(path):
                raise FileNotFoundError(f"the table catalog {path} does not exist (no table was written yet)")
            uri = f"sqlite:///file:{path}?mode=ro&uri=true"
        return SqlCatalog(CATALOG_NAME, uri=uri, warehouse=location.warehouse, init_catalog_tables="false",
                          **properties)
    if location.uri.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(location.uri.removeprefix("sqlite:///")) or ".", exist_ok=True)
    if location.warehouse.startswith("file://"):
        os.makedirs(location.warehouse.removeprefix("file://"), exist_ok=True)
    return SqlCatalog(CATALOG_NAME, uri=location.uri, warehouse=location.warehouse, **properties)


def identifier(namespace: str, base_topic: str) -> tuple[str, str]:
    return namespace, base_topic


def table_properties(row_group_rows: int) -> dict[str, str]:
    return {
        "write.parquet.compression-codec": "zstd",
        "write.parquet.row-group-limit": str(row_group_rows),
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "50",
        # A conflicting commit must fail, not be replayed on top of the winner with our stale offsets:
        # commit.py decides what to write again from the table as it then is.
        "commit.retry.num-retries": "0",
    }


def load_or_create(catalog: Catalog, namespace: str, base_topic: str, partitioned: bool, hourly: bool,
                   row_group_rows: int) -> Table:
    """The topic's table, created (with its namespace) when missing."""
    from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError

    from danube_fast.tables.envelope import SCHEMA, partition_spec

    ident = identifier(namespace, base_topic)
    try:
        return catalog.load_table(ident)
    except NoSuchTableError:
        pass
    catalog.create_namespace_if_not_exists(namespace)
    try:
        return catalog.create_table(
            ident, schema=SCHEMA, partition_spec=partition_spec(partitioned, hourly),
            properties={**table_properties(row_group_rows), TOPIC_PROPERTY: f"/{namespace}/{base_topic}"})
    except TableAlreadyExistsError:  # another partition's writer created it meanwhile
        return catalog.load_table(ident)


def committed_offsets(table: Table) -> dict[str, int]:
    """{stored topic: next offset the table lacks} as of the current snapshot ({} before the first)."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return {}
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

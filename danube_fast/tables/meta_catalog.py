"""An Iceberg catalog on the metadata store (docs/TABLES.md, "Where tables live"): cluster mode's default,
nothing to set up, every broker and every reader already reaches it.

A table is one key, `/danube-data/tables/by-topic/{namespace}/{table}` (`TablePointer`: its current metadata
file), and a commit is Iceberg's usual optimistic swap of that pointer: pyiceberg stages the new metadata and
writes its file, then one transaction puts the new pointer only if the key's mod_revision is still the one
read (etcd's compare-and-swap; the embedded store has the same transactions). A commit that lost the race
raises CommitFailedException and its metadata file is left for the orphan sweep. Namespaces are Danube's,
implicit: a table may be created in any namespace. Views are not supported.

Why not PostgreSQL: a second server every cluster would have to run, back up and secure, for one compare-and-
swap per commit, which etcd already does for the brokers' own state. What it costs: engines that know only
standard catalogs (the Iceberg Spark runtime) cannot list these tables; every reader can open a table's
metadata file (`admin tables status` shows it), and `read_table` and pyiceberg's StaticTable do.

The store is async and bound to its event loop, pyiceberg synchronous: the catalog reaches the store through
a PointerStore (pointers.py), which a broker's table worker process asks over its socket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyiceberg.catalog import Catalog, MetastoreCatalog, PropertiesUpdateSummary
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.io import load_file_io
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import CommitTableResponse, Table, TableProperties
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder
from pyiceberg.typedef import EMPTY_DICT, Identifier, Properties

from danube_fast.meta import keys
from danube_fast.meta.resources_storage import TablePointer
from danube_fast.meta.store import Compare, KeyValue
from danube_fast.tables.pointers import PointerStore

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table.update import TableRequirement, TableUpdate
    from pyiceberg.view import View


class MetaCatalog(MetastoreCatalog):
    def __init__(self, name: str, pointers: PointerStore, **properties: str) -> None:
        super().__init__(name, **properties)
        self._pointers = pointers

    def _get(self, namespace: str, table: str) -> KeyValue | None:
        return self._pointers.get(keys.table_pointer(namespace, table))

    def _names(self, identifier: str | Identifier) -> tuple[str, str]:
        namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
        return namespace, Catalog.table_name_from(identifier)

    def _table(self, namespace: str, name: str, metadata_location: str) -> Table:
        io = load_file_io(properties=self.properties, location=metadata_location)
        metadata = FromInputFile.table_metadata(io.new_input(metadata_location))
        return Table(identifier=(namespace, name), metadata=metadata, metadata_location=metadata_location,
                     io=self._load_file_io(metadata.properties, metadata_location), catalog=self)

    def _swap(self, namespace: str, name: str, old: KeyValue | None, metadata_location: str) -> bool:
        key = keys.table_pointer(namespace, name)
        guard = Compare(key, "mod_revision", "==", old.mod_revision) if old is not None else \
            Compare(key, "version", "==", 0)
        return self._pointers.swap(key, guard, TablePointer(metadata_location).to_json())

    # -- tables ---------------------------------------------------------------------------------------------

    def load_table(self, identifier: str | Identifier) -> Table:
        namespace, name = self._names(identifier)
        kv = self._get(namespace, name)
        if kv is None:
            raise NoSuchTableError(f"Table does not exist: {namespace}.{name}")
        return self._table(namespace, name, TablePointer.from_json(kv.value, key=kv.key).metadata_location)

    def table_exists(self, identifier: str | Identifier) -> bool:
        return self._get(*self._names(identifier)) is not None

    def create_table(self, identifier: str | Identifier, schema: Schema | pa.Schema,
                     location: str | None = None,
                     partition_spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
                     sort_order: SortOrder = UNSORTED_SORT_ORDER,
                     properties: Properties = EMPTY_DICT) -> Table:
        version = int(properties.get(TableProperties.FORMAT_VERSION, TableProperties.DEFAULT_FORMAT_VERSION))
        iceberg_schema: Schema = self._convert_schema_if_needed(schema, version)  # type: ignore[arg-type]
        namespace, name = self._names(identifier)
        location = self._resolve_table_location(location, namespace, name)
        metadata_location = load_location_provider(
            table_location=location, table_properties=properties).new_table_metadata_file_location()
        metadata = new_table_metadata(location=location, schema=iceberg_schema, partition_spec=partition_spec,
                                      sort_order=sort_order, properties=properties)
        self._write_metadata(metadata, load_file_io(properties=self.properties, location=metadata_location),
                             metadata_location)
        if not self._swap(namespace, name, None, metadata_location):
            raise TableAlreadyExistsError(f"Table {namespace}.{name} already exists")
        return self.load_table((namespace, name))

    def register_table(self, identifier: str | Identifier, metadata_location: str,
                       overwrite: bool = False) -> Table:
        namespace, name = self._names(identifier)
        old = self._get(namespace, name) if overwrite else None
        if not self._swap(namespace, name, old, metadata_location):
            raise TableAlreadyExistsError(f"Table {namespace}.{name} already exists")
        return self.load_table((namespace, name))

    def commit_table(self, table: Table, requirements: tuple[TableRequirement, ...],
                     updates: tuple[TableUpdate, ...]) -> CommitTableResponse:
        namespace, name = self._names(table.name())
        old = self._get(namespace, name)
        current = None if old is None else self._table(
            namespace, name, TablePointer.from_json(old.value, key=old.key).metadata_location)
        staged = self._update_and_stage_table(current, (namespace, name), requirements, updates)
        if current is not None and staged.metadata == current.metadata:
            return CommitTableResponse(metadata=current.metadata,  # type: ignore[call-arg]
                                       metadata_location=current.metadata_location)
        self._write_metadata(metadata=staged.metadata, io=staged.io, metadata_path=staged.metadata_location)
        if not self._swap(namespace, name, old, staged.metadata_location):
            raise CommitFailedException(f"Table has been updated by another process: {namespace}.{name}")
        return CommitTableResponse(metadata=staged.metadata,  # type: ignore[call-arg]
                                   metadata_location=staged.metadata_location)

    def drop_table(self, identifier: str | Identifier) -> None:
        namespace, name = self._names(identifier)
        if self._get(namespace, name) is None:
            raise NoSuchTableError(f"Table does not exist: {namespace}.{name}")
        self._pointers.delete(keys.table_pointer(namespace, name))

    def rename_table(self, from_identifier: str | Identifier, to_identifier: str | Identifier) -> Table:
        raise NotImplementedError("topic tables are named after their topics and are not renamed")

    def list_tables(self, namespace: str | Identifier) -> list[Identifier]:
        ns = Catalog.namespace_to_string(namespace)
        kvs = self._pointers.get_prefix(keys.table_pointers_prefix(ns))
        return [keys.parse_table_pointer(kv.key) for kv in kvs]

    # -- namespaces: Danube's, implicit ---------------------------------------------------------------------

    def create_namespace(self, namespace: str | Identifier, properties: Properties = EMPTY_DICT) -> None:
        pass

    def namespace_exists(self, namespace: str | Identifier) -> bool:
        return True

    def list_namespaces(self, namespace: str | Identifier = ()) -> list[Identifier]:
        kvs = self._pointers.get_prefix(keys.table_pointers_prefix())
        return sorted({(keys.parse_table_pointer(kv.key)[0],) for kv in kvs})

    def drop_namespace(self, namespace: str | Identifier) -> None:
        raise NoSuchNamespaceError("topic table namespaces are Danube's namespaces: not dropped here")

    def load_namespace_properties(self, namespace: str | Identifier) -> Properties:
        return {}

    def update_namespace_properties(self, namespace: str | Identifier, removals: set[str] | None = None,
                                    updates: Properties = EMPTY_DICT) -> PropertiesUpdateSummary:
        raise NotImplementedError("topic table namespaces have no properties")

    # -- views: none ----------------------------------------------------------------------------------------

    def list_views(self, namespace: str | Identifier) -> list[Identifier]:
        return []

    def drop_view(self, identifier: str | Identifier) -> None:
        raise NotImplementedError("this catalog holds no views")

    def view_exists(self, identifier: str | Identifier) -> bool:
        return False

    def load_view(self, identifier: str | Identifier) -> View:
        raise NotImplementedError("this catalog holds no views")

    def register_view(self, identifier: str | Identifier, metadata_location: str) -> View:
        raise NotImplementedError("this catalog holds no views")

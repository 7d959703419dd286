"""A topic table's partition spec (docs/TABLES.md, "Partitioning"): the publish time's period (the policy's
`tablePartitioning`: hour, day, month or none), the fields of `tablePartitionBy` (meta/table_partitions.py),
and the topic's partition for a partitioned topic; and the evolution of an existing table to the spec its
policy asks for (Iceberg's partition evolution: metadata only, the files written before keep theirs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)

from danube_fast.meta import table_partitions
from danube_fast.tables.envelope import SCHEMA
from danube_fast.tables.errors import PartitionSpecError

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

PARTITION_FIELD_ID = 1000  # Iceberg's first partition field id
TIME_TRANSFORMS: dict[str, Transform] = {"hour": HourTransform(), "day": DayTransform(),  # type: ignore[type-arg]
                                         "month": MonthTransform()}
_BY_NAME: dict[str, Transform] = {"identity": IdentityTransform(), "year": YearTransform(),  # type: ignore[type-arg]
                                  **TIME_TRANSFORMS}


def partition_spec(partitioned: bool, time_unit: str) -> PartitionSpec:
    """A new table's spec: `time_unit`(timestamp) (hour, day or month; "none": not by time), then
    identity(partition) for a partitioned topic. Its source ids are SCHEMA's: the catalog binds them to the
    new table's by name. tablePartitionBy's fields are added by `fit` (a schema table gets its value
    columns later)."""
    fields: list[PartitionField] = []
    if time_unit != "none":
        fields.append(PartitionField(source_id=SCHEMA.find_field("timestamp").field_id,
                                     field_id=PARTITION_FIELD_ID + len(fields),
                                     transform=TIME_TRANSFORMS[time_unit], name=f"timestamp_{time_unit}"))
    if partitioned:
        fields.append(PartitionField(source_id=SCHEMA.find_field("partition").field_id,
                                     field_id=PARTITION_FIELD_ID + len(fields),
                                     transform=IdentityTransform(), name="partition"))
    return PartitionSpec(*fields)


def time_unit(spec: PartitionSpec, schema: Schema) -> str:
    """The time transform of the `timestamp` column in a table's partition spec (with the table's schema,
    whose field ids are its own: the catalog assigns them): hour, day, month, or none."""
    source = schema.find_field("timestamp").field_id
    for field in spec.fields:
        if field.source_id == source:
            for unit, transform in TIME_TRANSFORMS.items():
                if field.transform == transform:
                    return unit
    return "none"


def transform_of(field: table_partitions.PartitionField) -> Transform:  # type: ignore[type-arg]
    if field.transform == "bucket":
        return BucketTransform(field.width)
    if field.transform == "truncate":
        return TruncateTransform(field.width)
    return _BY_NAME[field.transform]


def describe(spec: PartitionSpec, schema: Schema) -> str:
    """The spec as the status shows it: the time period, then the other fields in tablePartitionBy's
    syntax (the topic's partition left out): `hour`, `day, region, bucket(16, user_id)`."""
    parts = [time_unit(spec, schema)]
    managed = _managed(schema)
    for field in spec.fields:
        if field.source_id in managed:
            continue
        column = schema.find_column_name(field.source_id) or str(field.source_id)
        t = field.transform
        if isinstance(t, BucketTransform):
            parts.append(str(table_partitions.PartitionField("bucket", column, t.num_buckets)))
        elif isinstance(t, TruncateTransform):
            parts.append(str(table_partitions.PartitionField("truncate", column, t.width)))
        else:
            name = next((n for n, known in _BY_NAME.items() if known == t), str(t))
            parts.append(str(table_partitions.PartitionField(name, column)))
    return ", ".join(parts)


def fast_path(spec: PartitionSpec, schema: Schema) -> bool:
    """Whether the spec is only the publish time's period and the topic's partition (commit.data_files
    computes those itself, once per commit; tablePartitionBy's fields take its `_by_fields`)."""
    managed = _managed(schema)
    return all(field.source_id in managed for field in spec.fields)


def _managed(schema: Schema) -> set[int]:
    """The source ids of the fields this module sets by itself: the publish time and the topic's partition."""
    return {schema.find_field("timestamp").field_id, schema.find_field("partition").field_id}


def fit(table: Table, unit: str, partition_by: str, strict: bool = True) -> Table:
    """`table` partitioned by `unit` of the publish time and by `partition_by`'s fields (canonical
    tablePartitionBy text) from its next files on; the topic's partition field stays as it is. A field
    whose column the table lacks is a PartitionSpecError when `strict`, else left out for now (a schema
    table before its value columns); one whose transform the column's type does not take always is.
    Raises pyiceberg's CommitFailedException when another commit landed first."""
    schema = table.schema()
    stamp, partition = schema.find_field("timestamp").field_id, schema.find_field("partition").field_id
    wanted: list[tuple[int, Transform, str]] = []  # type: ignore[type-arg]
    if unit != "none":
        wanted.append((stamp, TIME_TRANSFORMS[unit], f"timestamp_{unit}"))
    for asked in table_partitions.parse(partition_by):
        try:
            source = schema.find_field(asked.column)
        except ValueError:
            if strict:
                names = ", ".join(f.name for f in schema.fields)
                raise PartitionSpecError(f"tablePartitionBy names {asked.column}, which the table has no "
                                         f"column for (its columns: {names})") from None
            continue
        transform = transform_of(asked)
        if not transform.can_transform(source.field_type):
            raise PartitionSpecError(f"tablePartitionBy's {asked} does not apply to column {asked.column} "
                                     f"of type {source.field_type}")
        wanted.append((source.field_id, transform, asked.name))
    held = [f for f in table.spec().fields if f.source_id != partition]
    keys = {(source_id, str(transform)) for source_id, transform, _ in wanted}
    have = {(f.source_id, str(f.transform)) for f in held}
    if keys == have:
        return table
    with table.update_spec() as update:
        for old in held:
            if (old.source_id, str(old.transform)) not in keys:
                update.remove_field(old.name)
        for source_id, transform, name in wanted:
            if (source_id, str(transform)) not in have:
                update.add_field(schema.find_column_name(source_id) or name, transform, name)
    return table

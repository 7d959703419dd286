"""The envelope table's columns: the Spark source's (README, Spark), same names and types, so that a query
written against `format("danube")` runs unchanged on the table.

| column           | Iceberg                  | from the decoded batch (docs/FORMAT.md, "Arrow view")   |
|------------------|--------------------------|---------------------------------------------------------|
| `key`            | binary                   | the routing key's UTF-8 bytes; null without one         |
| `value`          | binary                   | the payload                                             |
| `topic`          | string, required         | the topic; a partitioned topic's base name              |
| `partition`      | int, required            | N of a `-part-N` topic, -1 without partitions           |
| `offset`         | long, required           | the record's offset in its stored topic                 |
| `timestamp`      | timestamptz, required    | the publish time (ms widened to us)                     |
| `timestampType`  | int                      | 0: CreateTime                                           |
| `producer_name`  | string                   | the batch's producer                                    |
| `attributes`     | map<string,string>       | null without any                                        |
| `schema_id`      | long                     | null when absent                                        |
| `schema_version` | long                     | null when absent                                        |

Partitioned by hour(timestamp) (or day or month, or not by time: the policy's `tablePartitioning`), and by
`partition` for a partitioned topic (tables/partitions.py), so time-range queries prune whole files and each
file holds one stored topic's offsets, which the manifest's column bounds on `offset` then prune too.

`envelope` does per batch what the codec decoded, never per record in Python: casts that reuse buffers and two
constant columns.
"""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    NestedField,
    StringType,
    TimestamptzType,
)

CREATE_TIME = 0  # Kafka's timestampType for a producer-set time

SCHEMA = Schema(
    NestedField(1, "key", BinaryType(), required=False),
    NestedField(2, "value", BinaryType(), required=False),
    NestedField(3, "topic", StringType(), required=True),
    NestedField(4, "partition", IntegerType(), required=True),
    NestedField(5, "offset", LongType(), required=True),
    NestedField(6, "timestamp", TimestamptzType(), required=True),
    NestedField(7, "timestampType", IntegerType(), required=False),
    NestedField(8, "producer_name", StringType(), required=False),
    NestedField(9, "attributes", MapType(12, StringType(), 13, StringType(), value_required=False),
                required=False),
    NestedField(10, "schema_id", LongType(), required=False),
    NestedField(11, "schema_version", LongType(), required=False),
)

ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("timestampType", pa.int32()),
    pa.field("producer_name", pa.string()),
    pa.field("attributes", pa.map_(pa.string(), pa.string())),
    pa.field("schema_id", pa.int64()),
    pa.field("schema_version", pa.int64()),
])

def envelope(decoded: pa.RecordBatch, topic: str, partition: int) -> pa.RecordBatch:
    """`decoded` (frames.decode_arrow's columns) as a batch of ARROW_SCHEMA."""
    n = decoded.num_rows
    arrays = [
        decoded.column("key").cast(pa.binary()),
        decoded.column("value"),
        pa.repeat(topic, n).cast(pa.string()),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        decoded.column("offset"),
        decoded.column("timestamp").cast(pa.timestamp("us", tz="UTC")),
        pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), n),
        decoded.column("producer"),
        decoded.column("attributes"),
        decoded.column("schema_id"),
        decoded.column("schema_version"),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def rows_of(data: list[memoryview], start: int, end: int, topic: str, partition: int) -> pa.Table:
    """The records of offsets [start, end) of `data` (whole batches, which may begin before `start`) in the
    envelope's columns, as one chunk: the native codec decodes every chunk into one set of Arrow buffers, so
    that the envelope's columns and pyiceberg's projection of the rows are made once per commit instead of
    once per chunk (in the broker, Python that holds the GIL while producers wait for their acks)."""
    import pyarrow.compute as pc

    from danube_fast.codec import frames

    decoded = frames.decode_arrow_chunks(data, verify=True)
    if decoded.num_rows:
        offsets = decoded.column("offset")
        if offsets[0].as_py() < start or offsets[-1].as_py() >= end:
            decoded = decoded.filter(pc.and_(pc.greater_equal(offsets, start), pc.less(offsets, end)))
    return pa.Table.from_batches([envelope(decoded, topic, partition)], schema=ARROW_SCHEMA)

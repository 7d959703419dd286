"""The DataFrame's columns, and the Arrow batches that fill them.

Spark's Kafka source's columns, so that notebooks written for it carry over, then ours:

| column           | Spark type            | from (docs/FORMAT.md, "Arrow view")                          |
|------------------|-----------------------|--------------------------------------------------------------|
| `key`            | binary, nullable      | the routing key's UTF-8 bytes; null when the record has none |
| `value`          | binary                | the payload; with valueFormat avro or json, decoded with the |
|                  |                       | topics' schema subject (values.py) into its Spark type       |
| `topic`          | string                | the topic; a partitioned topic's base name                   |
| `partition`      | int                   | N of a `-part-N` topic, -1 for a topic without partitions    |
| `offset`         | long                  | the record's offset in its (partition) topic                 |
| `timestamp`      | timestamp (UTC)       | the publish time                                             |
| `timestampType`  | int                   | 0: CreateTime, the producer's publish time (Kafka's code)    |
| `producer_name`  | string                | the batch's producer name                                    |
| `attributes`     | map<string,string>    | null when the record has none                                |
| `schema_id`      | long, nullable        | null when absent (the format's presence bit)                 |
| `schema_version` | long, nullable        | null when absent                                             |

`to_spark` turns what the native codec decoded (`frames.decode_arrow`) into a batch of exactly the Arrow
schema Spark expects for these columns: casts that reuse the decoded buffers (key, schema ids), one widening
of the timestamps (ms to Spark's us), and the two constant columns. No per-record Python (a decoded `value`
comes from values.py, which says what it costs).
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

CREATE_TIME = 0  # Kafka's timestampType for a producer-set time

SCHEMA = StructType([
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("topic", StringType(), True),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
    StructField("timestamp", TimestampType(), True),
    StructField("timestampType", IntegerType(), True),
    StructField("producer_name", StringType(), True),
    StructField("attributes", MapType(StringType(), StringType(), True), True),
    StructField("schema_id", LongType(), True),
    StructField("schema_version", LongType(), True),
])


def with_value(value: DataType) -> StructType:
    """SCHEMA with `value` of type `value` (a decoded value: null where it did not decode)."""
    return StructType([StructField("value", value, True) if f.name == "value" else f for f in SCHEMA])


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark checks returned batches against (pyspark's own conversion)."""
    return to_arrow_schema(schema, timezone="UTC")


def to_spark(decoded: pa.RecordBatch, topic: str, partition: int, schema: pa.Schema,
             value: pa.Array | None = None) -> pa.RecordBatch:
    """`decoded` (frames.decode_arrow's columns) as a batch of `schema`: arrow_schema(SCHEMA), of
    with_value(...) with `value` the decoded values, or of a subset of the columns (a user's `.schema(...)`:
    only those columns are built and shipped to Spark)."""
    n = decoded.num_rows
    build = {
        "key": lambda: decoded.column("key").cast(pa.binary()),
        "value": lambda: decoded.column("value") if value is None else value,
        "topic": lambda: pa.repeat(topic, n),
        "partition": lambda: pa.repeat(pa.scalar(partition, pa.int32()), n),
        "offset": lambda: decoded.column("offset"),
        "timestamp": lambda: decoded.column("timestamp").cast(pa.timestamp("us", tz="UTC")),
        "timestampType": lambda: pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), n),
        "producer_name": lambda: decoded.column("producer"),
        "attributes": lambda: decoded.column("attributes"),
        "schema_id": lambda: decoded.column("schema_id"),
        "schema_version": lambda: decoded.column("schema_version"),
    }
    arrays = []
    for f in schema:
        column = build[f.name]()
        arrays.append(column if column.type == f.type else column.cast(f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def check_projection(schema: StructType, full: StructType) -> None:
    """A schema the user gave (`.schema(...)`) must be some of `full`'s columns with their types: fewer
    columns are read and shipped to Spark. ValueError naming the first column that is not."""
    known = {f.name: f.dataType for f in full}
    for f in schema:
        if f.name not in known:
            raise ValueError(f"column {f.name!r} of the given schema is not one of format('danube')'s: "
                             f"{', '.join(known)}")
        if f.name != "value" and f.dataType != known[f.name]:
            raise ValueError(f"column {f.name!r} of the given schema is {f.dataType.simpleString()}; "
                             f"format('danube') gives {known[f.name].simpleString()}")

"""Topic tables (docs/TABLES.md): a Reliable topic's records kept also as an Apache Iceberg table of Parquet
files, which Spark, DuckDB and any Iceberg reader scan natively.

- `config.py`: the `[tables]` settings.
- `envelope.py`: the table's columns (the Spark source's), its Iceberg schema and partition spec, and decoded
  record batches turned into those columns.
- `catalog.py`: opening the catalog named by the metadata store, the table of a topic, and the offsets a
  table holds (kept in its snapshots' summaries).
- `commit.py`: one exactly-once append of an offset range to a table.

The writer that drives these on each topic's owner is `danube_fast/broker/tables.py`.
"""

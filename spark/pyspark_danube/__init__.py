"""PySpark data source for danube_fast topics: `spark.read.format("danube")`.

The module is named `pyspark_*` and exposes `DefaultSource`, so PySpark 4 registers it by itself when it is
importable (pyspark.sql.worker.lookup_data_sources); `spark.dataSource.register(DanubeDataSource)` works too.
`read_table(spark, topic, ...)` reads a topic's Iceberg table natively plus its newer records (tables.py).
See the README's Spark section for the options and the columns.
"""

from __future__ import annotations

from pyspark_danube.source import DanubeDataSource
from pyspark_danube.tables import create_table_view, read_table

DefaultSource = DanubeDataSource

__all__ = ["DanubeDataSource", "DefaultSource", "create_table_view", "read_table"]

"""PySpark data source for danube_fast topics: `spark.read.format("danube")`.

The module is named `pyspark_*` and exposes `DefaultSource`, so PySpark 4 registers it by itself when it is
importable by Spark's Python workers (pyspark.sql.worker.lookup_data_sources); `register(spark)` registers
it explicitly, after checking that those workers can import it, and `build_session()` builds a session whose
workers run this interpreter (session.py). `read_table(spark, topic, ...)` reads a topic's Iceberg table
natively plus its newer records (tables.py). See the README's Spark section for the options and the columns.
"""

from __future__ import annotations

from pyspark_danube.session import WorkerPythonError, build_session, register
from pyspark_danube.source import DanubeDataSource
from pyspark_danube.tables import create_table_view, read_table, table_snapshots

DefaultSource = DanubeDataSource

__all__ = ["DanubeDataSource", "DefaultSource", "WorkerPythonError", "build_session", "create_table_view",
           "read_table", "register", "table_snapshots"]

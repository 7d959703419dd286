"""Fixtures of the Spark tests: one SparkSession (local[2]) per module. The brokers are the harness plugin's
(danube_fast/testing/plugin.py); the modules configure them (BROKER_CONFIG) to upload to a folder (or S3 on
loopback) quickly, so that a test has several objects and a tail to read.

The Python workers Spark starts run this interpreter (PYSPARK_PYTHON), so they import the same
danube_fast and pyspark_danube as the test.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # every Spark port on loopback


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    warehouse = tmp_path_factory.mktemp("spark")
    session = (SparkSession.builder.master("local[2]").appName("danube-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.warehouse.dir", str(warehouse / "warehouse"))
               .config("spark.local.dir", str(warehouse / "local"))
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()

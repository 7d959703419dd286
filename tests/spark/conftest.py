"""Fixtures of the Spark tests: one SparkSession (local[2]) per module. The brokers are the harness plugin's
(danube_fast/testing/plugin.py); the modules configure them (BROKER_CONFIG) to upload to a folder (or S3 on
loopback) quickly, so that a test has several objects and a tail to read.

The Python workers Spark starts run this interpreter (PYSPARK_PYTHON), so they import the same
danube_fast and pyspark_danube as the test.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import warnings
from collections.abc import Iterator

import pytest
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # every Spark port on loopback


GATEWAY_TRIES = 3


def started(builder: SparkSession.Builder) -> SparkSession:
    """The session, its JVM launched again when it exited before it answered. In a full run beside a CPU hog
    the first launch in one worker failed so ("Java gateway process exited before sending its port
    number", with gRPC's "skipping fork() handlers" in that process: spark-submit is forked from a process
    whose gRPC threads are busy). The failed launch's pipe is collected here with its ResourceWarning
    ignored, wherever the collection happens (one ran inside the except clause, as `str(e)` allocated, and
    its warning failed the test), or it fails whichever test the collector next runs in."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        for attempt in range(1, GATEWAY_TRIES + 1):
            try:
                return builder.getOrCreate()
            except PySparkRuntimeError as e:
                if "JAVA_GATEWAY_EXITED" not in str(e) or attempt == GATEWAY_TRIES:
                    raise
            # Out of the except clause: the exception (whose traceback holds the failed launch's pipe) is
            # gone, so this collection closes the pipe if none did yet.
            gc.collect()
            time.sleep(1.0)
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    warehouse = tmp_path_factory.mktemp("spark")
    builder = (SparkSession.builder.master("local[2]").appName("danube-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.warehouse.dir", str(warehouse / "warehouse"))
               .config("spark.local.dir", str(warehouse / "local"))
               .config("spark.sql.session.timeZone", "UTC"))
    session = started(builder)
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()

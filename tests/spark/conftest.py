"""Fixtures of the Spark tests: one SparkSession (local[2]) per module, and brokers whose objects go to a
folder (or S3 on loopback) quickly, so that a test has several objects and a tail to read.

The Python workers Spark starts run this interpreter (PYSPARK_PYTHON), so they import the same
danube_fast and pyspark_danube as the test.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

sys.path.insert(0, str(Path(__file__).parents[1] / "compat"))
from compat_support import Broker, BrokerFactory

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # every Spark port on loopback


@pytest.fixture(scope="module")
def shared_broker(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One broker per module (its BROKER_CONFIG), as in tests/compat."""
    broker = Broker(tmp_path_factory.mktemp("broker"), getattr(request.module, "BROKER_CONFIG", None))
    try:
        broker.start()
        yield broker
    finally:
        broker.close()


@pytest.fixture
def broker(shared_broker: Broker) -> Broker:
    assert shared_broker.running, f"the module's broker died:\n{shared_broker.log_tail()}"
    return shared_broker


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[BrokerFactory]:
    factory = BrokerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()


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

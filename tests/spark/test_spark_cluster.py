"""`format("danube")` on a real Spark standalone cluster on loopback: a Master and a Worker JVM started from
the pip package's spark-class, and a driver on spark://127.0.0.1:PORT whose executor is a JVM of the Worker's,
running Python workers of this venv (PYSPARK_PYTHON). Unlike local[N], nothing runs in the driver's JVM: the
data source is pickled to another process tree, imports pyspark_danube and danube_fast there, and reads the
broker's objects and tail (and writes to it) from there, as on a production cluster.

Every wait is bounded: the daemons' startup lines, the executor's registration, and each job (cancelled by a
timer). Both daemons run in process groups of their own (the Worker's executors are its children) and are
killed by group in a `finally`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest
from pyspark.sql import SparkSession
from spark_support import payload, produce_fast, reader_options, wait_uploaded

from danube_fast.testing.broker import Broker
from danube_fast.testing.ports import free_ports

pytestmark = pytest.mark.spark

BROKER_CONFIG = """
[cluster]
upload_interval_ms = 200
"""
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
START_TIMEOUT = 60.0  # seconds for a daemon's startup line, and for the executor to register
JOB_TIMEOUT = 60.0  # seconds before a job is cancelled
STOP_TIMEOUT = 10.0
TOPIC, COUNT = "/default/cluster", 3000
WRITTEN = "/default/cluster_written"


class Daemon:
    """One JVM from spark-class (which execs java: the pid is the JVM's), in a process group of its own."""

    def __init__(self, name: str, args: list[str], workdir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log_path = workdir / f"{name}.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen([str(SPARK_CLASS), *args], stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env=env, cwd=workdir,
                                            start_new_session=True)

    def wait_for(self, line: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while line not in self.log():
            if self.process.poll() is not None:
                pytest.fail(f"the {self.name} exited with {self.process.returncode} before logging "
                            f"{line!r}:\n{self.log()[-8000:]}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"the {self.name} did not log {line!r} within {START_TIMEOUT} s:\n"
                            f"{self.log()[-8000:]}", pytrace=False)
            time.sleep(0.2)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM to the group, SIGKILL to what is left after STOP_TIMEOUT."""
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(STOP_TIMEOUT)
        self._signal(signal.SIGKILL)  # the group's other processes (executors) too
        self.process.wait(STOP_TIMEOUT)

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # the group is gone
            os.killpg(self.process.pid, sig)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, list[Daemon]]]:
    """spark://127.0.0.1:PORT of a Master with one Worker (1 core, 1 GiB); every port on loopback."""
    master_port, master_ui, worker_port, worker_ui = free_ports(4)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOCAL_HOSTNAME": "127.0.0.1",
           "SPARK_DAEMON_MEMORY": "256m", "PYSPARK_PYTHON": sys.executable,
           # Spark 4 opens the Master's REST submission server on the fixed port 6066: off.
           "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
           "SPARK_HOME": str(SPARK_CLASS.parents[1])}
    url = f"spark://127.0.0.1:{master_port}"
    daemons: list[Daemon] = []
    try:
        master = Daemon("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(master_port), "--webui-port", str(master_ui)], tmp_path, env)
        daemons.append(master)
        master.wait_for("I have been elected leader!")
        worker = Daemon("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                   "--port", str(worker_port), "--webui-port", str(worker_ui),
                                   "--cores", "1", "--memory", "1g", "--work-dir", str(tmp_path / "work"),
                                   url], tmp_path, env)
        daemons.append(worker)
        worker.wait_for(f"Successfully registered with master {url}")
        yield url, daemons
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


@pytest.fixture
def cluster_spark(cluster: tuple[str, list[Daemon]], tmp_path: Path) -> Iterator[SparkSession]:
    url, daemons = cluster
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (SparkSession.builder.master(url).appName("danube-cluster-test")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.memory", "512m")
               .config("spark.executor.memory", "512m")
               .config("spark.executor.cores", "1")
               .config("spark.cores.max", "1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.local.dir", str(tmp_path / "local"))
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    try:
        assert session.sparkContext.master == url, f"another SparkContext is running: {session.sparkContext}"
        session.sparkContext.setLogLevel("ERROR")
        _wait_for_executor(session, daemons, tmp_path)
        yield session
    finally:
        session.stop()


def _wait_for_executor(session: SparkSession, daemons: list[Daemon], tmp_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    # The driver counts itself among the block managers: two once the executor registered.
    while session.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < 2:  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            executor_logs = "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-4000:]}"
                                      for p in (tmp_path / "work").rglob("stderr"))
            pytest.fail(f"no executor registered within {START_TIMEOUT} s:\n"
                        + "\n".join(f"--- {d.name}\n{d.log()[-4000:]}" for d in daemons) + executor_logs,
                        pytrace=False)
        time.sleep(0.2)


def _bounded(session: SparkSession, job: Any) -> Any:
    """`job()` with every Spark job it starts cancelled after JOB_TIMEOUT."""
    timer = threading.Timer(JOB_TIMEOUT, session.sparkContext.cancelAllJobs)
    timer.start()
    try:
        return job()
    finally:
        timer.cancel()


def test_a_standalone_cluster_reads_and_writes_topics(cluster_spark: SparkSession,
                                                      shared_broker: Broker) -> None:
    broker = shared_broker
    asyncio.run(produce_fast(broker, TOPIC, COUNT // 2))
    wait_uploaded(broker, TOPIC, COUNT // 2)
    asyncio.run(produce_fast(broker, TOPIC, COUNT // 2, start=COUNT // 2))  # a tail, maybe not uploaded
    spark = cluster_spark

    df = spark.read.format("danube").options(**reader_options(broker, topic=TOPIC)).load()
    rows = _bounded(spark, lambda: df.select("offset", "value").orderBy("offset").collect())
    assert [r.offset for r in rows] == list(range(COUNT))
    assert [bytes(r.value) for r in rows] == [payload(TOPIC, i) for i in range(COUNT)]

    source = spark.range(500, numPartitions=2).selectExpr("cast(id as string) as value",
                                                          "concat('k', id % 3) as key")
    _bounded(spark, lambda: source.write.format("danube").mode("append").option("broker", broker.target)
             .option("topic", WRITTEN).save())
    back = spark.read.format("danube").options(**reader_options(broker, topic=WRITTEN)).load()
    written = _bounded(spark, lambda: back.select("value", "key").collect())
    assert sorted(int(bytes(r.value)) for r in written) == list(range(500))
    assert all(bytes(r.key) == f"k{int(bytes(r.value)) % 3}".encode() for r in written)

"""The Python that Spark's workers run (pyspark_danube/session.py), against a real interpreter without the
package: a fresh venv's `python3`, first on PATH, as the `python3` Spark starts when PYSPARK_PYTHON is not
set. The checks need no JVM; one test runs the user's case end to end in a Spark session of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest
from pyspark import SparkContext
from pyspark_danube import WorkerPythonError, build_session
from pyspark_danube.session import PROBE, check_worker_python

SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1",
              "spark.driver.bindAddress": "127.0.0.1"}


@pytest.fixture(scope="module")
def bare_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin directory of a venv without pyspark_danube (nor pyspark, nor anything else)."""
    root = tmp_path_factory.mktemp("bare-venv")
    venv.create(root, with_pip=False)
    bin_dir = root / "bin"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert subprocess.run([bin_dir / "python3", "-c", PROBE], env=env, timeout=60).returncode == 1
    return bin_dir


@pytest.fixture
def bare_path(bare_bin: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH starting with the bare venv, PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON not set (the Spark
    fixture of other modules sets them in this process)."""
    monkeypatch.setenv("PATH", f"{bare_bin}{os.pathsep}{os.environ['PATH']}")
    for name in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        monkeypatch.delenv(name, raising=False)
    return bare_bin


def test_python3_without_the_package_is_refused(bare_path: Path) -> None:
    """What Spark runs when PYSPARK_PYTHON is not set: the message names the interpreter and the fix."""
    with pytest.raises(WorkerPythonError) as e:
        check_worker_python("python3")
    message = str(e.value)
    assert f"python3 ({bare_path / 'python3'})" in message
    assert "cannot import pyspark_danube" in message and "DATA_SOURCE_NOT_FOUND" in message
    assert f"PYSPARK_PYTHON={sys.executable}" in message


def test_interpreters_with_the_package_pass(bare_path: Path, tmp_path: Path) -> None:
    check_worker_python(sys.executable)
    wrapper = tmp_path / "python3"  # another path to this interpreter (and its venv): probed, found
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    check_worker_python(str(wrapper))


def test_missing_interpreter_is_named(bare_path: Path) -> None:
    with pytest.raises(WorkerPythonError, match="'no-such-python', which is not found on PATH: set PYSPARK_"):
        check_worker_python("no-such-python")


def test_build_session_checks_a_set_pyspark_python_before_spark_starts(
        bare_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PYSPARK_PYTHON the user set is kept, so one without the package fails here, with no JVM started."""
    monkeypatch.setenv("PYSPARK_PYTHON", "python3")
    with pytest.raises(WorkerPythonError, match="PYSPARK_PYTHON="):
        build_session("local[1]", SPARK_CONF)
    assert SparkContext._active_spark_context is None
    assert os.environ["PYSPARK_PYTHON"] == "python3"


# The user's case in a process of its own (PYSPARK_PYTHON not set, `python3` on PATH without the package):
# build_session() sets the workers' Python and format("danube") loads; then a session whose workers run
# that `python3` (as SparkSession.builder makes one) is refused by register() with the message.
SCRIPT = textwrap.dedent("""
    import json, os, sys
    from pyspark.sql import SparkSession
    from pyspark_danube import WorkerPythonError, build_session, register

    conf = json.loads(sys.argv[1])
    spark = build_session("local[1]", conf)
    spark.sparkContext.setLogLevel("ERROR")
    columns = (spark.read.format("danube").option("metadataStore", "embedded:/nonexistent/metadata.db")
               .option("objectStore", "/nonexistent").option("topic", "/default/t").load().columns)
    found = {"conf": spark.conf.get("spark.pyspark.python"), "exec": spark.sparkContext.pythonExec,
             "env": os.environ["PYSPARK_PYTHON"], "columns": columns}
    spark.stop()
    os.environ["PYSPARK_PYTHON"] = "python3"
    spark = SparkSession.builder.master("local[1]").getOrCreate()
    found["plain_exec"] = spark.sparkContext.pythonExec
    try:
        register(spark)
    except WorkerPythonError as e:
        found["refused"] = str(e)
    spark.stop()
    print(json.dumps(found))
""")


@pytest.mark.spark
def test_build_session_runs_workers_on_this_python(bare_path: Path) -> None:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(SPARK_CONF)], env=env,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["conf"] == found["exec"] == found["env"] == sys.executable
    assert found["columns"][:2] == ["key", "value"]
    assert found["plain_exec"] == "python3"
    assert f"python3 ({bare_path / 'python3'})" in found["refused"]
    assert f"PYSPARK_PYTHON={sys.executable}" in found["refused"]

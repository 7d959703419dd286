"""The Python that Spark's workers run: `build_session()` and `register(spark)`.

Spark runs a Python data source in Python processes of its own, with the interpreter PYSPARK_PYTHON names
(default `python3` from PATH), not the one that started the session. The SparkContext reads the variable
when it starts (pyspark/core/context.py, `pythonExec`: every function it ships, an explicitly registered
data source too), and so does the JVM when it looks up `format("danube")` among the importable `pyspark_*`
modules (PythonUtils.defaultPythonExec: PYSPARK_DRIVER_PYTHON, then PYSPARK_PYTHON, then python3). So a
session started from `.venv/bin/python` without the venv on PATH fails `format("danube")` with
DATA_SOURCE_NOT_FOUND: the `python3` on PATH does not have this package. The setting `spark.pyspark.python`
does not change that in a session started from Python (measured with pyspark 4.3.0: `pythonExec` stays
`python3` and the lookup still fails); spark-submit is what turns it into the environment variable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pyspark_danube.source import DanubeDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

WORKER_PYTHON = "PYSPARK_PYTHON"
DRIVER_PYTHON = "PYSPARK_DRIVER_PYTHON"
# Whether the package is on that interpreter's path, without importing it (nor pyspark or pyarrow, which
# Spark's workers may get from its own zip files on PYTHONPATH).
PROBE = "import importlib.util, sys; sys.exit(importlib.util.find_spec('pyspark_danube') is None)"
PROBE_TIMEOUT = 60.0  # seconds: an interpreter's start on a loaded machine


class WorkerPythonError(RuntimeError):
    """Spark's Python workers would run an interpreter that cannot import pyspark_danube."""


def build_session(master: str | None = None, conf: Mapping[str, str] | None = None) -> SparkSession:
    """`SparkSession.builder` with `master` and `conf`, `getOrCreate()`, then `register()`.

    The workers run this interpreter unless told otherwise: PYSPARK_PYTHON, when not set, is set in this
    process's environment (PYSPARK_DRIVER_PYTHON too, when not set) before the session starts, to
    `conf["spark.pyspark.python"]` when given, else `sys.executable`; spark.pyspark.python and
    spark.pyspark.driver.python are set to match. Both must be in place before Spark starts (module
    docstring). A PYSPARK_PYTHON that is set is kept, and checked before Spark starts: WorkerPythonError
    when it cannot import this package.
    """
    from pyspark.sql import SparkSession

    settings = dict(conf or {})
    worker = os.environ.get(WORKER_PYTHON) or settings.get("spark.pyspark.python") or sys.executable
    for name, value in ((WORKER_PYTHON, worker), (DRIVER_PYTHON, sys.executable)):
        if not os.environ.get(name):
            os.environ[name] = value
    settings.setdefault("spark.pyspark.python", os.environ[WORKER_PYTHON])
    settings.setdefault("spark.pyspark.driver.python", os.environ[DRIVER_PYTHON])
    check_worker_python(os.environ[WORKER_PYTHON])
    builder = SparkSession.builder
    if master is not None:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def register(spark: SparkSession) -> None:
    """`spark.dataSource.register(DanubeDataSource)`, once the interpreter of Spark's Python workers is
    known to find this package; WorkerPythonError, naming PYSPARK_PYTHON, when it does not (instead of
    Spark's error from the first query). A Spark Connect session is registered unchecked: its workers run
    on the server."""
    context = getattr(spark, "sparkContext", None)  # Spark Connect: an AttributeError
    if context is not None:
        check_worker_python(context.pythonExec)
    spark.dataSource.register(DanubeDataSource)


def check_worker_python(python: str) -> None:
    """WorkerPythonError unless `python` (a path, or a name looked up on PATH as Spark does) finds
    pyspark_danube."""
    if python == sys.executable:
        return
    fix = (f"set {WORKER_PYTHON} to an interpreter that has it before the session starts, e.g. "
           f"{WORKER_PYTHON}={sys.executable} (this one)")
    found = shutil.which(python)
    if found is None:
        raise WorkerPythonError(f"Spark's Python workers would run {python!r}, which is not found on PATH: "
                                f"{fix}")
    try:
        probe = subprocess.run([found, "-c", PROBE], capture_output=True, timeout=PROBE_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise WorkerPythonError(f"Spark's Python workers would run {found}, which did not answer whether it "
                                f"has pyspark_danube ({e}): {fix}") from e
    if probe.returncode != 0:
        named = python if python == found else f"{python} ({found})"
        raise WorkerPythonError(f"Spark's Python workers would run {named}, which cannot import "
                                f"pyspark_danube, so format('danube') would fail (DATA_SOURCE_NOT_FOUND): "
                                f"{fix}")

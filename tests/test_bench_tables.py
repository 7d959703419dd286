"""`python -m bench tables` on a tiny run: both brokers run, every figure is there with its baseline and a
freshness measured per batch (a bench that cannot measure must fail, not report)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.broker_process

ROOT = Path(__file__).resolve().parent.parent


def test_a_tiny_run_prints_every_figure(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "bench", "tables", "--quick", "--runs", "1", "--json",
            "--dir", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                      if p)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    figures = {f["name"]: f for f in map(json.loads, done.stdout.splitlines())}
    assert figures["produce_off"]["value"] > 0 and figures["produce_on"]["baseline"] > 0
    assert figures["ack_p99_on"]["baseline"] == figures["ack_p99_off"]["value"] > 0
    assert figures["ack_p99_on"]["target"] and figures["freshness_p99"]["target"]
    assert 0 < figures["freshness_p50"]["value"] <= figures["freshness_p99"]["value"]
    assert figures["table_catch_up_s"]["value"] > 0
    assert "writer_cpu_ms_per_mb" in figures
    for paced in ("half_rate", "quarter_rate"):
        assert figures[f"{paced}_ack_p99_on"]["baseline"] == figures[f"{paced}_ack_p99_off"]["value"] > 0
    for label in ("", "half_rate_", "quarter_rate_"):  # the broker with two worker threads
        assert figures[f"{label}ack_p99_on_threads2"]["baseline"] == figures[f"{label}ack_p99_off"]["value"]
        assert figures[f"{label}freshness_p99_threads2"]["value"] > 0
    assert list(tmp_path.iterdir()) == [], "the scratch directory is removed"

"""`python -m bench topics`: a tiny run's JSON (every step's figures, threads that do not grow with topics)
and its RESULTS.md section."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import topics
from bench.common import machine_info

pytestmark = pytest.mark.broker_process

ROOT = Path(__file__).resolve().parent.parent


def test_a_tiny_run_measures_every_step(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "bench", "topics", "--topics", "60", "--step", "20", "--json", "--dir",
            str(tmp_path), "--aggregate-rounds", "1", "--aggregate-topics", "10", "--aggregate-seconds", "1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                      if p)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    steps = [topics.Step(**s) for s in report["steps"]]
    assert [s.topics for s in steps] == [20, 40, 60]
    assert all(s.rate > 0 and s.rss_mib > 0 for s in steps)
    assert max(s.threads for s in steps) < 60  # no thread per topic (each step adds 20 topics)
    assert report["summary"]["topics"] == 60 and report["summary"]["threads"] == steps[-1].threads
    agg = topics.Aggregate(**report["aggregate"])
    assert agg.topics == 10 and len(agg.single) == len(agg.many) == 1 and min(agg.single + agg.many) > 0
    assert report["summary"]["aggregate_ratio"] == round(agg.many[0] / agg.single[0], 3)
    info = machine_info(str(tmp_path))
    text = topics.section(steps, info, "python -m bench topics", "2026-01-01 00:00 UTC", agg)
    assert text.startswith(f"## {topics.TITLE}\n") and "| 60 |" in text and "| broker threads at 60" in text
    assert "one producer on each of 10 topics" in text

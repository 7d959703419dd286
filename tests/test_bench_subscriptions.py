"""`python -m bench subscriptions` on a tiny run: every figure is measured, the time lookup's against the
offset seek of the same run (a bench that cannot measure must fail, not report)."""

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
    argv = [sys.executable, "-m", "bench", "subscriptions", "--quick", "--runs", "1", "--json",
            "--dir", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                      if p)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    figures = {f["name"]: f for f in map(json.loads, done.stdout.splitlines())}
    assert figures["seek_time_ms"]["baseline"] > 0 and figures["seek_time_ms"]["ratio"] > 0
    for name in ("seek_time", "seek_offset", "seek_time_move", "peek", "skip"):
        assert 0 < figures[f"{name}_ms"]["value"] <= figures[f"{name}_p99_ms"]["value"], name
    assert list(tmp_path.iterdir()) == [], "the scratch directory is removed"

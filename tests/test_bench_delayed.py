"""`python -m bench delayed` on a tiny run: every figure is measured, each ratio against its baseline of the
same run (a bench that cannot measure must fail, not report)."""

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
    argv = [sys.executable, "-m", "bench", "delayed", "--quick", "--runs", "1", "--json",
            "--dir", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                      if p)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    figures = {f["name"]: f for f in map(json.loads, done.stdout.splitlines())}
    for name in ("plain_bytes_per_record", "pending_bytes_per_record", "backlog_per_s", "due_per_s",
                 "decode_ns_per_record", "delay_check_ns_per_record"):
        assert figures[name]["value"] > 0, name
    for name in ("due_per_s", "delay_check_ns_per_record"):
        assert figures[name]["baseline"] > 0 and figures[name]["ratio"] > 0, name
    assert list(tmp_path.iterdir()) == [], "the scratch directory is removed"

"""`python -m bench sendfile` on a tiny run: both brokers run, every figure is there with its baseline, and
the `on` broker's catch-up went by sendfile (a bench whose path was not taken must fail, not report)."""

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
    argv = [sys.executable, "-m", "bench", "sendfile", "--quick", "--json", "--dir", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                      if p)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    figures = {f["name"]: f for f in map(json.loads, done.stdout.splitlines())}
    assert figures["catchup_on"]["baseline"] == figures["catchup_off"]["value"] > 0
    assert figures["broker_cpu_per_mb_on"]["baseline"] == figures["broker_cpu_per_mb_off"]["value"] >= 0
    # Most is read as spans; how much of that goes by sendfile depends on how soon the client reads (a busy
    # machine's may leave its socket full past native_sendfile.WAIT_S; the rest then goes by the transport).
    assert figures["span_share"]["value"] > 0.5 and figures["sendfile_share"]["value"] > 0
    # From the folder object store: most records were only there, and most went as spans all the same.
    assert figures["objects_catchup_on"]["baseline"] == figures["objects_catchup_off"]["value"] > 0
    assert figures["objects_read_share"]["value"] > 0.5
    assert figures["objects_span_share"]["value"] > 0.5 and figures["objects_sendfile_share"]["value"] > 0
    assert list(tmp_path.iterdir()) == [], "the scratch directory is removed"

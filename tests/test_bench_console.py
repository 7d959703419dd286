"""`python -m bench console` on a tiny run: every figure is measured, each page's against its JSON endpoint
and each throughput with the console open against closed, of the same run (a bench that cannot measure must
fail, not report)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.broker_process, pytest.mark.browser]

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("overview", "topics", "topic", "browse", "schemas", "schema")


def test_a_tiny_run_prints_every_figure(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "bench", "console", "--quick", "--runs", "1", "--json",
            "--dir", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                      if p)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    figures = {f["name"]: f for f in map(json.loads, done.stdout.splitlines())}
    assert figures["first_load_ms"]["value"] > 0
    for page in PAGES:
        figure = figures[f"{page}_ms"]
        assert figure["value"] > 0 and figure["baseline"] > 0 and figure["ratio"] > 0, page
        assert figure["target"] is not None, page
        assert figures[f"{page}_painted_ms"]["value"] >= figure["value"], page
    for name in ("produce_console_closed", "consume_console_closed"):
        assert figures[name]["value"] > 0, name
    for what in ("produce", "consume"):
        for mode in ("overview", "reloading"):
            figure = figures[f"{what}_console_{mode}"]
            assert figure["value"] > 0 and figure["baseline"] > 0 and figure["ratio"] > 0, (what, mode)
        assert figures[f"{what}_console_overview"]["target"] is not None
    assert figures["topics_reloads_per_s"]["value"] >= 0
    assert len(figures) == 1 + 2 * len(PAGES) + 7, sorted(figures)
    assert list(tmp_path.iterdir()) == [], "the scratch directory is removed"

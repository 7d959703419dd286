"""`python -m bench spark` on a tiny run: it produces, uploads, waits for the topic's table, writes Parquet,
runs every query on every system (read_table among them), cross-checks their answers (a bench whose systems
disagree must fail, not report) and prints one JSON object per figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


def test_a_tiny_run_prints_every_figure(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "bench", "spark", "--records", "20000", "--runs", "1", "--json",
            "--dir", str(tmp_path)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    figures = {f["name"]: f for f in map(json.loads, done.stdout.splitlines())}
    for query in ("full", "offset5", "one_object"):
        assert figures[f"parquet_{query}"]["value"] > 0
        ours = figures[f"danube_{query}"]
        assert ours["value"] > 0 and ours["baseline"] == figures[f"parquet_{query}"]["value"]
        assert ours["ratio"] > 0 and ours["target"]
        assert figures[f"danube_projected_{query}"]["baseline"] == ours["baseline"]
        table = figures[f"table_{query}"]
        assert table["value"] > 0 and table["baseline"] == ours["baseline"]
        assert table["ratio"] > 0 and table["target"]
    source = figures["table_full_vs_source"]
    assert source["value"] == figures["table_full"]["value"]
    assert source["baseline"] == figures["danube_full"]["value"] and source["ratio"] > 0 and source["target"]
    assert figures["table_catch_up_s"]["unit"] == "s" and figures["table_catch_up_s"]["value"] > 0
    assert figures["table_catch_up_rate"]["unit"] == "MB/s" and figures["table_catch_up_rate"]["value"] >= 0
    assert figures["codec_full"]["value"] > 0
    assert figures["danube_full_rate"]["unit"] == "records/s"
    assert list(tmp_path.iterdir()) == [], "the scratch directory is removed"

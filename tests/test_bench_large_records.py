"""`python -m bench.large_records`: variants become config sections (bad ones are refused); a tiny A/B run
prints a row per round and variant and leaves no scratch behind."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.large_records import Variant, parse_variant

pytestmark = pytest.mark.broker_process

ROOT = Path(__file__).resolve().parent.parent


def test_variants_become_config_sections() -> None:
    assert parse_variant("default") == Variant("default", "")
    assert parse_variant("dr: wal.direct_reads=true, wal.io_threads = 2, dispatch.window=10") == Variant(
        "dr", "[wal]\ndirect_reads = true\nio_threads = 2\n[dispatch]\nwindow = 10\n")
    for bad in ("x: direct_reads=true", "x: wal.direct_reads", "x: .a=1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_variant(bad)


def test_a_tiny_run_prints_a_row_per_round_and_variant(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "bench.large_records", "--size", "65536", "--mib", "8", "--rounds", "2",
            "--variant", "default", "--variant", "small segments: wal.segment_bytes=1048576", "--dir",
            str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                      if p)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    header, *rows = done.stdout.splitlines()
    assert header.split()[:2] == ["round", "variant"]
    assert [(row.split()[0], row.split()[1]) for row in rows] == [
        ("1", "default"), ("1", "small"), ("2", "default"), ("2", "small")]
    for row in rows:
        figures = [float(x.replace(",", "")) for x in row.split()[-6:]]
        assert figures[0] > 0 and figures[3] > 0, row
    assert list(tmp_path.iterdir()) == []  # the scratch directory is gone

"""`python -m bench cluster` end to end, small: three moves of our producer's topic on a real three-broker
cluster (etcd, moto S3) and one uploader run of 8 MiB; the JSON has its shape and no ack was lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(120), pytest.mark.cluster, pytest.mark.etcd, pytest.mark.s3,
              pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_quick_json_run_has_its_figures_and_loses_no_ack(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "bench", "cluster", "--quick", "--json", "--moves", "3", "--official-moves",
            "0", "--upload-mib", "8", "--runs", "1", "--dir", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                      if p)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)

    assert report["suite"] == "cluster" and report["official_moves"] is None
    moves = report["moves"]
    assert moves["client"] == "fast" and moves["moves"] == len(moves["per_move"]) == 3
    gaps = moves["unavailable_ms"]
    assert 0 < gaps["p50"] <= gaps["p99"] <= gaps["max"]
    for move in moves["per_move"]:
        assert move["source"] != move["target"]
        assert move["gap_ms"] > 0 and move["first_ack_ms"] >= move["assign_ms"] > 0
    acks = moves["acks"]
    assert acks["sent"] == acks["acked"] > 0
    lost = {k: acks[k] for k in ("failed", "unresolved", "holes", "overlaps")}
    assert lost == dict.fromkeys(lost, 0) and moves["lost"] == 0
    assert acks["rejected"] == acks["reopens"] == 0, "FastProducer did not follow the moves by itself"

    [upload] = report["upload"]
    assert upload["objects"] >= 1 and upload["object_bytes"] > 8 * 1024 * 1024
    assert upload["uploader_mb_s"] > 0 and upload["raw_mb_s"] > 0
    names = {r["name"]: r for r in report["results"]}
    assert {"move_unavailable_p99", "move_acks_lost", "uploader_drain", "raw_put"} <= names.keys()
    assert names["move_acks_lost"]["value"] == 0
    assert names["uploader_drain"]["ratio"] > 0
    assert not list(tmp_path.iterdir()), "the scratch directory was left behind"

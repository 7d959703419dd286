"""`python -m bench fast` on a tiny run: the gRPC and native transports both carry the load through a real
broker, and the native figure's baseline is the gRPC figure of the same run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.broker_process

ROOT = Path(__file__).resolve().parent.parent


def test_a_tiny_run_prints_both_transports_figures(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "bench", "fast", "--quick", "--runs", "1", "--json", "--dir", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                      if p)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    figures = {f["name"]: f for f in map(json.loads, done.stdout.splitlines())}
    assert figures["native_produce_reliable"]["value"] > 0
    assert figures["native_produce_reliable_fresh"]["baseline"] == figures["native_produce_reliable"]["value"]
    assert figures["native_produce_reliable"]["baseline"] == figures["fast_produce_reliable"]["value"] > 0
    assert figures["native_consume_catchup_settled"]["baseline"] == \
        figures["fast_consume_catchup_settled"]["value"] > 0
    assert figures["native_read"]["baseline"] == figures["grpc_read"]["value"] > 0
    assert figures["native_produce_reliable_of_raw"]["baseline"] == figures["raw_native_produce"]["value"] > 0
    assert figures["native_consume_catchup_settled_of_raw"]["baseline"] == \
        figures["raw_native_consume"]["value"] > 0
    assert figures["native_read"]["value"] > 0
    assert figures["native_produce_reliable_64k"]["baseline"] == figures["disk_direct"]["value"] > 0
    assert figures["native_consume_catchup_settled_64k"]["baseline"] == \
        figures["bare_batch_consume_64k"]["value"] > 0
    assert figures["native_consume_catchup_settled_64k_of_raw"]["baseline"] == \
        figures["raw_native_consume_64k"]["value"] > 0
    assert figures["grpc_consume_catchup_settled_64k"]["value"] > 0
    # (a tiny run's phase may end within one tick of the broker's CPU clock: 0 is a measurement)
    assert all(figures[f"{t}_{p}_64k_cpu_per_mb"]["value"] >= 0 for t in ("grpc", "native")
               for p in ("produce", "consume"))
    p50, p99 = (figures[f"native_produce_reliable_ack_{q}"]["value"] for q in ("p50", "p99"))
    assert 0 < p50 <= p99
    assert 0 < figures["disk_sync_p50"]["value"] <= figures["disk_sync_p99"]["value"]
    half_p50, half_p99 = (figures[f"native_produce_reliable_half_rate_ack_{q}"] for q in ("p50", "p99"))
    assert half_p99["target"] and half_p99["value"] >= half_p50["value"] > 0
    assert list(tmp_path.iterdir()) == [], "the scratch directory is removed"

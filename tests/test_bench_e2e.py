"""`python -m bench e2e`: its JSON from a tiny run, and the report (tables, RESULTS.md section, plots) from
synthetic measurements. The run uses our broker and whichever peer servers are installed (none needs the
network: a peer that is not installed is skipped and named in `skipped`). The RabbitMQ peer, whose node is
the most involved server to start and stop, also gets a short run of its own."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bench import e2e
from bench.e2e import report as e2e_report
from bench.e2e.ceiling import Ceiling
from bench.peers.install import find_binary
from bench.peers.workload import PHASES, Latencies, Measurement, Workload, measurement
from bench.peers.workload import Usage as PhaseUsage

ROOT = Path(__file__).resolve().parent.parent
PHASE_KEYS = {"records", "records_per_s", "mb_per_s", "server_cpu_s", "client_cpu_s",
              "server_cpu_us_per_record", "client_cpu_us_per_record", "ack_ms", "e2e_ms", "offered_per_s"}
PERCENTILES = ("p50", "p99", "p999", "max")
INFO = {"cpu": "cpu", "cores": 2, "usable_cores": 2, "memory_gib": 1, "kernel": "Linux", "python": "3.11",
        "file_system": "ext4", "codec": "native", "wal_engine": "native", "git_commit": "abc",
        "load_average_1m": 0.1}


def _check_percentiles(found: dict[str, float] | None) -> None:
    assert found is not None
    values = [found[q] for q in PERCENTILES]
    assert 0 < values[0] <= values[1] <= values[2] <= values[3] < 60_000, found


def _check_phase(phase: dict[str, object], size: int, records: int) -> None:
    assert set(phase) == PHASE_KEYS
    assert phase["records"] == records
    rate = phase["records_per_s"]
    assert isinstance(rate, float) and rate > 0
    # The report rounds mb_per_s to 3 decimals: a slow system's 0.346 stands for 0.34644 (a CI run saw it).
    assert math.isclose(phase["mb_per_s"], rate * size / 1e6, rel_tol=1e-3,  # type: ignore[arg-type]
                        abs_tol=6e-4)
    for key in ("server_cpu_s", "client_cpu_s", "server_cpu_us_per_record", "client_cpu_us_per_record"):
        assert phase[key] >= 0  # type: ignore[operator]


@pytest.mark.slow
def test_tiny_run_json() -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "e2e", "--quick", "--json", "--records", "1000",
                           "--sizes", "4096"], cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert not re.search(r"(?m)^\[\d+/\d+\] ", done.stderr), "a progress line with --json"
    report = json.loads(done.stdout)
    assert report["suite"] == "e2e"
    assert "half the produce rate" in report["workload"].pop("fixed_rate")
    assert report["workload"] == {"size": 256, "records": 1000, "producers": 1, "consumers": 1, "runs": 1,
                                  "quick": True, "sizes": {"256": 1000, "4096": 1000}}
    assert {"cpu", "cores", "kernel", "disk", "file_system"} <= set(report["machine"])
    names = [s["system"] for s in report["systems"]]
    assert names[0] == "danube" and set(names) | set(report["skipped"]) == set(e2e.SYSTEMS)
    for system in report["systems"]:
        assert system["label"] == f"{system['system'].split('_')[0]}_{system['durability']}"
        assert system["durability_text"] and system["batching"]
        for name in ("produce", "consume", "e2e"):
            _check_phase(system[name], 256, 1000)
        _check_percentiles(system["produce"]["ack_ms"])
        _check_percentiles(system["e2e"]["ack_ms"])
        _check_percentiles(system["e2e"]["e2e_ms"])
        assert system["consume"]["ack_ms"] is None and system["produce"]["e2e_ms"] is None
        # The fixed rate is half the produce rate of the same (single) run.
        assert math.isclose(system["e2e"]["offered_per_s"], system["produce"]["records_per_s"] / 2,
                            rel_tol=1e-3)
        assert [b["size"] for b in system["by_size"]] == [256, 4096]
        for by_size in system["by_size"]:
            for name in ("produce", "consume"):
                _check_phase(by_size[name], by_size["size"], 1000)
    assert report["systems"][0]["durability"] == "reliable_fsync"
    assert len(report["disk_mb_s"]) == 2 and all(rate > 0 for rate in report["disk_mb_s"])  # before, after
    assert len(report["disk_direct_mb_s"]) == 2 and all(rate > 0 for rate in report["disk_direct_mb_s"])
    assert [c["size"] for c in report["grpc_ceiling_mb_s"]] == [256, 4096]
    for ceiling in report["grpc_ceiling_mb_s"]:
        assert len(ceiling["produce"]) == len(ceiling["consume"]) == 2  # before, after
        assert all(rate > 0 for rate in ceiling["produce"] + ceiling["consume"])
    peers = names[1:]
    assert sorted(report["ratios"]) == sorted(peers) and sorted(report["ratios_by_size"]) == sorted(peers)
    for peer in peers:
        assert {"produce", "consume", "ack_p99", "e2e_p99"} <= set(report["ratios"][peer])
        assert all(value > 0 for key, value in report["ratios"][peer].items() if key != "produce_server_cpu")


def _run(size: int, rate: float, latency_ms: float) -> list[Measurement]:
    """A run's phases as a peer reports them: `rate` records/s, every latency `latency_ms` (and 2x for
    the last 1%)."""
    workload = Workload(size=size, records=1000)
    usage = PhaseUsage(started=0.0, wall_s=1000 / rate, server_cpu_s=0.01, client_cpu_s=0.02)
    ack, late = Latencies(), Latencies()
    ack.add(latency_ms / 1e3, 990)
    ack.add(2 * latency_ms / 1e3, 10)
    late.add(latency_ms / 1e3 * 1.5, 1000)
    return [measurement("produce", workload, 1000, usage, ack=ack),
            measurement("consume", workload, 1000, usage),
            measurement("e2e", workload, 1000, usage, ack=ack, e2e=late, offered_rate=rate / 2)]


def test_report_from_measurements(tmp_path: Path) -> None:
    settings = e2e.Settings(records=1000, sizes=(256, 4096), runs=2)
    configs = e2e.all_configs()[:2]  # ours and NATS
    workloads = settings.workloads()
    measured = {(w, c): [_run(workload.size, (10 - c) * 1000 * (run + 1), 1 + c) for run in range(2)]
                for w, workload in enumerate(workloads) for c in range(len(configs))}
    report = e2e.summarise(settings, configs, workloads, measured, {"redis_always": "not installed"})
    ours = report.systems[0]
    assert ours.phases["produce"].records_per_s == pytest.approx(15_000)  # median of 10,000 and 20,000
    assert report.ratios["nats"]["produce"] == pytest.approx(10 / 9)
    assert report.ratios["nats"]["ack_p99"] == pytest.approx(0.5)
    assert report.size_ratios["nats"][4096]["consume"] == pytest.approx(10 / 9)
    assert len(ours.ack_s) == 2000 and len(ours.e2e_s) == 2000
    report.disk_mb_s = [900.0, 1100.0]
    report.disk_direct_mb_s = [1900.0, 2100.0]
    report.grpc = {256: [Ceiling(40.0, 60.0), Ceiling(60.0, 80.0)], 4096: [Ceiling(400.0, 600.0)] * 2}
    tables = {table.title.split(":")[0]: table for table in e2e_report.tables(report)}
    text = "\n".join(line for table in tables.values() for line in table.lines(markdown=False))
    assert "danube_reliable_fsync (ours)" in text and "nats_file_sync2m" in text
    # Ours at 256 B: 15,000 records/s = 3.84 MB/s both ways; the ceiling's medians are 50 and 70 MB/s.
    assert tables["The gRPC ceiling"].rows[0] == ["256 B", "50", "0.08", "70", "0.05"]
    assert tables["The disk"].rows[0][2:] == ["0.00", "0.00"]  # 3.84 MB/s against 1,000 and 2,000
    assert tables["The disk"].columns[-1] == "/ disk (O_DIRECT)"
    plots = e2e_report.plot(report, tmp_path)
    assert [p.name for p in plots] == [e2e_report.THROUGHPUT_PNG, e2e_report.LATENCY_PNG]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in plots)
    section = e2e_report.section(report, INFO, "python -m bench e2e", "today", "versions", "vda", [])
    assert section.startswith(f"## {e2e_report.TITLE}\n")
    assert "| 4 KiB |" in section and "Not run: redis_always (not installed)" in section
    assert "\n## " not in section[3:]  # one section: RESULTS.md is split at `## ` headings


# The bench's flags win over the file's data_dir and broker_addr; advertised_addr is the file's.
BROKER_TOML = """\
[broker]
data_dir = "/nonexistent/danube-data"
broker_addr = "127.0.0.1:1"
advertised_addr = "bench-config.invalid:6650"

[wal]
sync = "none"
"""


def test_broker_config_file(tmp_path: Path) -> None:
    """`--broker-config FILE`: our broker starts with the file (the bench's flags still choosing its mode,
    data directory and ports), its durability label says the file's [wal] sync, and the results name the
    file and what it sets."""
    path = tmp_path / "broker.toml"
    path.write_text(BROKER_TOML)
    broker = e2e.BrokerFile.read(str(path))
    ours = e2e.all_configs(broker=broker)[0]
    assert ours.label == "danube_reliable_nofsync" and "[wal] sync = none" in ours.durability_text
    data_dir = tmp_path / "run"
    with ours.server(data_dir) as server:
        ready = next(line for line in server.log_text().splitlines() if "broker ready" in line)
    assert f"on 127.0.0.1:{server.port} (advertised http://bench-config.invalid:6650)" in ready, ready
    assert f"data in {data_dir / 'data'}" in ready, ready
    settings = ('[broker] data_dir = "/nonexistent/danube-data", broker_addr = "127.0.0.1:1", '
                'advertised_addr = "bench-config.invalid:6650"; [wal] sync = "none"')
    assert broker.settings() == settings
    report = e2e.Report(e2e.Settings(broker_config=broker), [], {}, {}, {})
    assert e2e_report.as_json(report, {}, "")["broker_config"] == {"path": str(path), "text": BROKER_TOML}
    section = e2e_report.section(report, INFO, "python -m bench e2e", "today", "versions", "vda", [])
    assert f"\n- Our broker's config file (--broker-config): {path}: {settings}\n" in section
    assert e2e_report.as_json(replace(report, settings=e2e.Settings()), {}, "")["broker_config"] is None


@pytest.mark.parametrize(("text", "words"), [
    (None, "No such file"),
    ('[wal]\nsync = "sometimes"\n', "[wal] sync must be"),
    ('[security]\nmode = "tls"\ncert_file = "a.pem"\nkey_file = "a.key"\n', "connect without TLS"),
])
def test_broker_config_refused_before_anything_runs(tmp_path: Path, text: str | None, words: str) -> None:
    path = tmp_path / "broker.toml"
    if text is not None:
        path.write_text(text)
    done = subprocess.run([sys.executable, "-m", "bench", "e2e", "--quick", "--broker-config", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"--broker-config {path}: " in done.stderr and words in done.stderr, \
        done.stderr
    assert not done.stdout


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (exited, not yet reaped by its parent or init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _descendants(pid: int) -> set[int]:
    """The processes under `pid` (children, their children, ...), from /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found.update(children)
        todo += children
    return found


@pytest.mark.slow
@pytest.mark.skipif(find_binary("rabbitmq-server") is None or importlib.util.find_spec("rstream") is None,
                    reason="rabbitmq-server or rstream is not installed (python -m bench.peers.install)")
def test_rabbitmq_streams_run(tmp_path: Path) -> None:
    """Every phase against a real node through rstream, then produce and consume of 64 KiB records (more
    than a Publish frame holds at the workload's batch) on the same node, whose streams are deleted and
    declared again; when the `with` ends, no process of the node (its VM and the VM's helpers, its epmd)
    is left."""
    from bench.peers import rabbitmq_peer, servers

    workload = Workload(records=3_000, warmup=300, batch=100, window=400, durability=rabbitmq_peer.DURABILITY)
    large = replace(workload, size=65_536, records=100, warmup=20, phases=("produce", "consume"))
    assert rabbitmq_peer.batch_records(large) == 15  # 1 MiB frames
    others = _descendants(os.getpid())  # what the suite runs already (session fixtures: etcd, moto, ...)
    with servers.rabbitmq_server(tmp_path / "rabbitmq") as server:
        node = _descendants(os.getpid()) - others
        assert server.pid in node and len(node) >= 3, node  # the VM, epmd, erl_child_setup
        phases = rabbitmq_peer.run(server, workload)
        large_phases = rabbitmq_peer.run(server, large)
    assert [m.phase for m in phases] == list(PHASES)
    assert all(m.records == 3_000 and m.wall_s > 0 for m in phases)
    produce, e2e_phase = phases[0], phases[-1]
    assert produce.ack_ms is not None and len(produce.ack_s) == 3_000
    assert e2e_phase.ack_ms is not None and e2e_phase.e2e_ms is not None and len(e2e_phase.e2e_s) == 3_000
    assert e2e_phase.offered_rate == pytest.approx(produce.records_per_s / 2)
    assert [(m.phase, m.records, m.size) for m in large_phases] == [("produce", 100, 65_536),
                                                                    ("consume", 100, 65_536)]
    deadline = time.monotonic() + 30  # the VM's helpers exit once they see it gone (slowly on a loaded box)
    while (left := [pid for pid in node if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes of the node left: {left}"
    named = subprocess.run(["pgrep", "-a", "-f", str(tmp_path)], capture_output=True, text=True).stdout
    assert not named, named  # the VM's command line names its $HOME, the scratch directory


def test_rabbitmq_streams_takes_one_consumer() -> None:
    """A stream's consumers each read every record: the e2e suite skips RabbitMQ with several consumers
    (the way it skips ours) and the peers command refuses them."""
    config = next(c for c in e2e.all_configs() if c.name == "rabbitmq_streams")
    assert "one consumer" in (e2e.missing(config, consumers=2) or "")
    done = subprocess.run([sys.executable, "-m", "bench.peers", "--peers", "rabbitmq_streams", "--consumers",
                           "2"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "one consumer" in done.stderr

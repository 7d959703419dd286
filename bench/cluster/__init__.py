"""`python -m bench cluster`: what a cluster costs a producer when a topic moves, and what the object tier's
uploader gets out of S3, measured in one run against one etcd, one moto S3 server and three brokers in
cluster mode on loopback (bench/cluster/servers.py).

1. Moves (bench/cluster/moves.py): our FastProducer sends to a Reliable topic while the topic is unloaded
   `--moves` times (each time: unload, wait until another broker owns it and the producer has had an ack
   from there, pause PAUSE s). Per move, the longest interval without an acknowledged batch; p50/p99/max
   over the moves (target p99 <= 1 s), the move's parts (seal, assign, load, first ack), and whether any ack
   was lost. Then the same, `--official-moves` times, for the official danube-client, whose retry policy
   backs off 1.5 to 3 s before it looks the topic up again (docs/WIRE.md B.2): reported apart.
2. Upload (bench/cluster/upload.py): `Uploader.drain()` of a WAL of `--upload-mib` MiB against plain
   aiobotocore puts of the same object sizes, median over `--runs` runs, ratio of the per-run ratios.

Tables, JSON and the RESULTS.md section: bench/cluster/report.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import uvloop

from bench import results
from bench.cluster import report as cluster_report
from bench.cluster.moves import (
    BATCH_RECORDS,
    PAUSE,
    Acks,
    Move,
    fast_sender,
    moves_under_traffic,
    official_sender,
)
from bench.cluster.servers import RunningCluster, running_cluster
from bench.cluster.upload import UploadRun, measure_upload
from bench.common import Result, describe_machine, machine_info, print_table, progress
from danube_fast.meta.etcd import EtcdStore

TITLE = "Cluster"
MOVES, QUICK_MOVES = 20, 3
OFFICIAL_MOVES, QUICK_OFFICIAL_MOVES = 3, 1
UPLOAD_MIB, QUICK_UPLOAD_MIB = 256, 32
RUNS, QUICK_RUNS = 3, 1
TOPIC = "/default/bench-moves"
OFFICIAL_TOPIC = "/default/bench-moves-official"


@dataclass
class Settings:
    moves: int
    official_moves: int
    upload_mib: int
    runs: int
    rate: float  # records/s our producer is paced at; 0 = as fast as acks come back
    quick: bool
    parent_dir: str


@dataclass
class Moves:
    """One client's moves and what became of its sends."""

    client: str  # "fast" or "official"
    moves: list[Move]
    acks: dict[str, int]  # Acks.check()
    seconds: float  # of traffic
    records: int  # acknowledged

    @property
    def lost(self) -> int:
        a = self.acks
        return a["failed"] + a["unresolved"] + a["holes"] + a["overlaps"]


@dataclass
class Report:
    fast: Moves
    official: Moves | None
    uploads: list[UploadRun]
    settings: Settings
    etcd_version: str = ""
    results: list[Result] = field(default_factory=list)


def settings_from(args: argparse.Namespace) -> Settings:
    q = args.quick
    official = args.official_moves
    return Settings(moves=args.moves or (QUICK_MOVES if q else MOVES),
                    official_moves=(QUICK_OFFICIAL_MOVES if q else OFFICIAL_MOVES) if official is None
                    else official,
                    upload_mib=args.upload_mib or (QUICK_UPLOAD_MIB if q else UPLOAD_MIB),
                    runs=args.runs or (QUICK_RUNS if q else RUNS), rate=args.rate, quick=q,
                    parent_dir=str(Path(args.dir).resolve()))


def run_cluster(settings: Settings) -> Report:
    """Start the servers in a scratch directory under `parent_dir`, measure, stop them, remove it."""
    scratch = Path(tempfile.mkdtemp(prefix="danube-bench-cluster-", dir=settings.parent_dir))
    try:
        with running_cluster(scratch) as cluster, \
                asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            try:
                report = runner.run(_measure(cluster, scratch, settings))
            except Exception:
                progress(f"the brokers' logs end:\n{cluster.log_tails()}")
                raise
            report.etcd_version = cluster.etcd.version()
        report.results = cluster_report.figures(report)
        return report
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


async def _measure(cluster: RunningCluster, scratch: Path, s: Settings) -> Report:
    store = await EtcdStore.connect([cluster.etcd.endpoint])
    entry = cluster.brokers[0]  # where both clients bootstrap; the topics go wherever the leader puts them
    try:
        progress(f"our FastProducer: {s.moves} moves")
        moves, acks, seconds = await moves_under_traffic(store, TOPIC, s.moves, PAUSE,
                                                         fast_sender(entry.target, TOPIC, s.rate), progress)
        fast = _moves("fast", moves, acks, seconds, BATCH_RECORDS)
        official = None
        if s.official_moves:
            progress(f"the official danube-client: {s.official_moves} moves")
            moves, acks, seconds = await moves_under_traffic(store, OFFICIAL_TOPIC, s.official_moves, PAUSE,
                                                             official_sender(entry.url, OFFICIAL_TOPIC),
                                                             progress)
            official = _moves("official", moves, acks, seconds, 1)
    finally:
        await store.close()
    uploads = await measure_upload(cluster.s3_endpoint, cluster.bucket, scratch, s.upload_mib, s.runs,
                                   progress)
    return Report(fast, official, uploads, s)


def _moves(client: str, moves: list[Move], acks: Acks, seconds: float, per_ack: int) -> Moves:
    return Moves(client, moves, acks.check(), seconds, acks.acked * per_ack)


def main(args: argparse.Namespace, argv: list[str]) -> int:
    settings = settings_from(args)
    info = machine_info(settings.parent_dir)
    progress(f"machine: {describe_machine(info)}; load average {info['load_average_1m']}")
    report = run_cluster(settings)
    if args.json:
        print(json.dumps(cluster_report.as_json(report, info), ensure_ascii=False))
    else:
        print(f"machine: {describe_machine(info)}", *cluster_report.setup_lines(report), "", sep="\n")
        print_table(report.results)
    if args.write_results:
        command = shlex.join(["python", "-m", "bench", *argv])
        date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        results.write_section(TITLE, cluster_report.section(report, info, command, date))
        progress(f"wrote the {TITLE} section of {results.RESULTS_PATH}")
    return 0

"""The peers suite: every peer configuration, a fresh server per run, medians over the runs.

Configurations (the durability label is in every figure's name, e.g. `redis_aof_always_256b_produce`):

| config | server | durability label |
|---|---|---|
| nats | nats-server -js, file storage | `file_sync2m` |
| nats_always | nats-server 2.10+ -js, file storage, sync_interval: always | `file_fsync` |
| redis_always | redis-server, appendonly yes, appendfsync always | `aof_always` |
| redis_everysec | redis-server, appendonly yes, appendfsync everysec | `aof_everysec` |
| rabbitmq_streams | rabbitmq-server with the stream plugin, one node | `segment_nofsync` |

Runs take turns: run 1 of every configuration, then run 2 of every configuration, and so on, so that a slow
spell of the disk or a busy neighbour spreads over all of them rather than hitting one.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from importlib.metadata import version as dist_version
from pathlib import Path

from bench.common import Options, Result, fmt, progress
from bench.peers import nats_peer, rabbitmq_peer, redis_peer, servers
from bench.peers.install import PYPI_NATS
from bench.peers.workload import Measurement, Workload, figure_prefix, figures
from danube_fast.testing.process import ServerProcess

QUICK_RECORDS = 30_000
RECORDS = 100_000
QUICK_RUNS = 1
RUNS = 3


@dataclass(frozen=True)
class Config:
    """One peer at one durability setting."""

    name: str  # what --peers selects
    peer: str  # figure names start with this and the durability label
    durability: str
    durability_text: str
    server: Callable[[Path], AbstractContextManager[ServerProcess]]
    run: Callable[[ServerProcess, Workload], list[Measurement]]
    batching: Callable[[Workload], str]  # how the client batches (or not) and what an ack latency covers
    binary: str | None  # the server's executable, None for our broker (run by this interpreter)

    @property
    def label(self) -> str:
        """e.g. `redis_aof_always`: the peer and its durability, as figure names start."""
        return f"{self.peer}_{self.durability}"


def _redis(appendfsync: servers.AppendFsync) -> Config:
    def server(data_dir: Path) -> AbstractContextManager[ServerProcess]:
        return servers.redis_server(data_dir, appendfsync)

    return Config(f"redis_{appendfsync}", redis_peer.PEER, redis_peer.durability(appendfsync),
                  redis_peer.durability_text(appendfsync), server, redis_peer.run, redis_peer.batching_text,
                  "redis-server")


def _nats_always(data_dir: Path) -> AbstractContextManager[ServerProcess]:
    return servers.nats_server(data_dir, sync_always=True)


CONFIGS = (
    Config("nats", nats_peer.PEER, nats_peer.DURABILITY, nats_peer.DURABILITY_TEXT, servers.nats_server,
           nats_peer.run, nats_peer.batching_text, "nats-server"),
    Config("nats_always", nats_peer.PEER, nats_peer.ALWAYS_DURABILITY, nats_peer.ALWAYS_TEXT, _nats_always,
           nats_peer.run, nats_peer.batching_text, PYPI_NATS),
    _redis("always"),
    _redis("everysec"),
    Config("rabbitmq_streams", rabbitmq_peer.PEER, rabbitmq_peer.DURABILITY, rabbitmq_peer.DURABILITY_TEXT,
           servers.rabbitmq_server, rabbitmq_peer.run, rabbitmq_peer.batching_text, "rabbitmq-server"),
)
CONFIG_NAMES = tuple(c.name for c in CONFIGS)


def versions() -> str:
    """Servers and clients, for the report."""
    nats = f"{servers.nats_version(False)} and {servers.nats_version(True)}"
    return (f"{nats}, nats-py {dist_version('nats-py')}; "
            f"{servers.version('redis-server').split(' sha=')[0]}, redis-py {dist_version('redis')}, "
            f"hiredis {dist_version('hiredis')}; "
            f"{servers.rabbitmq_version()}, rstream {dist_version('rstream')}")


def durability_lines(configs: tuple[Config, ...] = CONFIGS) -> Iterator[str]:
    for c in configs:
        yield f"{c.label}: {c.durability_text}"


def _summary(config: Config, run: int, runs: int, phases: list[Measurement]) -> str:
    parts = []
    for m in phases:
        text = f"{m.phase} {fmt(m.records_per_s)} rec/s"
        latency = m.e2e_ms or m.ack_ms
        if latency is not None:
            text += f" (p99 {fmt(latency.p99)} ms)"
        parts.append(text)
    return f"{config.label} run {run}/{runs}: " + ", ".join(parts)


Measured = dict[tuple[int, int], list[list[Measurement]]]  # (workload, config) indices -> phases per run
Step = Callable[[int, Workload, Config], None]  # run (from 1), workload, configuration


def measure(workloads: list[Workload], options: Options, configs: tuple[Config, ...],
            starting: Step | None = None,
            finished: Callable[[int, Config, list[Measurement]], None] | None = None) -> Measured:
    """Every workload against every configuration, `options.runs` times, each run on a fresh server in a
    scratch directory under `options.parent_dir` (removed at the end). A workload's durability label is
    replaced by each configuration's. `starting` and `finished` are told of every step."""
    scratch = Path(tempfile.mkdtemp(prefix="danube-peers-", dir=options.parent_dir))
    measured: Measured = {}
    try:
        for run in range(1, options.runs + 1):
            for w, workload in enumerate(workloads):
                for c, config in enumerate(configs):
                    if starting is not None:
                        starting(run, workload, config)
                    with config.server(scratch / config.name) as server:
                        phases = config.run(server, replace(workload, durability=config.durability))
                    if finished is not None:
                        finished(run, config, phases)
                    measured.setdefault((w, c), []).append(phases)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return measured


def run_peers(workloads: list[Workload], options: Options, configs: tuple[Config, ...] = CONFIGS
              ) -> list[Result]:
    """`measure`, with a progress line per step; figures are medians over the runs."""

    def finished(run: int, config: Config, phases: list[Measurement]) -> None:
        progress(_summary(config, run, options.runs, phases))

    measured = measure(workloads, options, configs, finished=finished)
    found: list[Result] = []
    for (w, c), runs in measured.items():
        workload = replace(workloads[w], durability=configs[c].durability)
        found += figures(figure_prefix(configs[c].peer, workload), runs)
    return found

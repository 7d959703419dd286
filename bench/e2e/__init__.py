"""`python -m bench e2e`: the same workload against our broker and the peers it is compared with, on this
machine, each server a fresh subprocess on loopback per run (bench/peers/servers.py).

| system (--systems) | server | durability label | client |
|---|---|---|---|
| danube | `danube-fast broker`, standalone, Reliable topic | `reliable_fsync` | danube_fast.client |
| nats | nats-server -js, file storage | `file_sync2m` | nats-py |
| nats_always | nats-server 2.10+ -js, file storage, sync_interval: always | `file_fsync` | nats-py |
| redis_always | redis-server, appendonly yes, appendfsync always | `aof_always` | redis-py + hiredis |
| redis_everysec | the same, appendfsync everysec | `aof_everysec` | redis-py + hiredis |
| rabbitmq_streams | rabbitmq-server with the stream plugin, one node | `segment_nofsync` | rstream |

Per run, for each system in turn: the main workload (N records of S bytes, P producers, C consumers):
produce as fast as acks come back, a catch-up consume with acks, then producers and consumers at once at a
fixed rate, by default half the produce rate that system reached in that run, for publish-ack and
end-to-end latencies (bench/peers/workload.py has the phases). Then produce and consume only for each other
size of --sizes, N sized by bytes for large records (`records_for`). Every figure is the median over the
runs; a ratio of ours to a peer is the median of the per-run ratios (each run measures both). The disk's own
bandwidth (os.write of 16 MiB chunks, fdatasync after each, on --dir) and the gRPC ceiling at each size (a
bare server on one stream of the fast API's shapes: bench/e2e/ceiling.py) are measured before and after the
systems run, so our large-record figures can be set against what the disk and the transport give.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tomllib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import TYPE_CHECKING

from bench.common import Options, ProgressBar, median, paired_ratio
from bench.peers import servers
from bench.peers.install import find_binary
from bench.peers.workload import Measurement, Percentiles, Workload

if TYPE_CHECKING:  # at run time imported where used: the command line reads this module's defaults
    from bench.e2e.ceiling import Ceiling
    from bench.peers.suite import Config, Measured
    from danube_fast.storage.config import SyncPolicy

SIZES = (64, 256, 1024, 4096, 16384, 65536)
LINGER_MS = 1.0  # ours at the fixed rate (bench/peers/danube_peer.py says why a linger)
RECORDS = 200_000
QUICK_RECORDS = 20_000
RUNS = 3
QUICK_RUNS = 1
SWEEP_BYTES = 512 << 20  # the size sweep's records at a size: N, or fewer, so that they hold about this many
QUICK_SWEEP_BYTES = 128 << 20  # bytes (a few thousand 64 KiB records: long enough to leave the start-up)
MIN_RECORDS = 2_000  # the size sweep never goes below this (or N)
DISK_BYTES = 256 << 20  # per disk baseline measurement (quick: a quarter)
GRPC_BYTES = 256 << 20  # of payload per size and direction per gRPC ceiling measurement (quick: a quarter)
OURS = "danube"
SYSTEMS = (OURS, "nats", "nats_always", "redis_always", "redis_everysec", "rabbitmq_streams")  # all_configs()
CLIENT_MODULES = {"nats": ("nats",), "nats_always": ("nats",), "redis_always": ("redis", "hiredis"),
                  "redis_everysec": ("redis", "hiredis"), "rabbitmq_streams": ("rstream",)}
# The systems whose consumers cannot share a stream's records, and why.
ONE_CONSUMER = {OURS: "the fast API's subscriptions are exclusive: one consumer",
                "rabbitmq_streams": "a stream's consumers each read every record (no competing consumers): "
                                    "one consumer"}
MAIN_PHASES = ("produce", "consume", "e2e")
SWEEP_PHASES = ("produce", "consume")


@dataclass(frozen=True)
class BrokerFile:
    """`--broker-config`: a broker config file (TOML, `danube-fast broker --config-file`) that our broker is
    started with in every run, read and checked once before anything runs. The bench's own flags (standalone
    mode, data directory, loopback addresses, no metrics endpoint) override what it says of those."""

    path: str  # absolute
    text: str  # what every run's broker gets (a copy in its scratch directory)
    sync: SyncPolicy  # its [wal] sync: our durability label says it

    @staticmethod
    def read(path: str) -> BrokerFile:
        """ValueError naming what is wrong when the file is missing or the broker would refuse it."""
        from danube_fast.broker import config

        loaded = config.load(path, {"mode": "standalone", "prom_exporter": ""})  # ConfigError: a ValueError
        if loaded.security.mode != "none":
            raise ValueError(f"[security] mode = {loaded.security.mode!r}: the e2e clients connect without "
                             "TLS or tokens (`python -m bench security` measures what security costs)")
        return BrokerFile(os.path.abspath(path), Path(path).read_text(), loaded.wal.sync)

    def settings(self) -> str:
        """What the file sets, on one line: `[wal] sync = "none", linger_us = 0; [dispatch] window = 2000`."""
        return "; ".join(f"[{section}] " + ", ".join(f"{k} = {json.dumps(v, default=str)}" for k, v in
                                                      table.items())
                         for section, table in tomllib.loads(self.text).items()) or "nothing"


def all_configs(linger_ms: float = LINGER_MS, broker: BrokerFile | None = None) -> tuple[Config, ...]:
    """Ours (at the fixed rate: `linger_ms`, see bench/peers/danube_peer.py; started with `broker`'s
    settings when given) and the peers' configurations, in SYSTEMS order."""
    from bench.peers import danube_peer, suite
    from danube_fast.storage.config import SyncPolicy

    sync = SyncPolicy() if broker is None else broker.sync
    server = servers.danube_broker if broker is None else partial(servers.danube_broker, config=broker.text)
    ours = suite.Config(OURS, danube_peer.PEER, danube_peer.durability(sync),
                        danube_peer.durability_text(sync), server, danube_peer.runner(linger_ms),
                        lambda workload: danube_peer.batching_text(workload, linger_ms), None)
    configs = (ours, *suite.CONFIGS)
    assert tuple(c.name for c in configs) == SYSTEMS, "SYSTEMS is out of date"
    return configs


def missing(config: Config, consumers: int = 1) -> str | None:
    """Why this system cannot run here (its server binary or client library is not installed, or it cannot
    take the workload), or None."""
    if config.name in ONE_CONSUMER and consumers != 1:
        return ONE_CONSUMER[config.name]
    if config.binary is not None and find_binary(config.binary) is None:
        return f"{config.binary} is not installed (python -m bench.peers.install)"
    for module in CLIENT_MODULES.get(config.name, ()):
        if importlib.util.find_spec(module) is None:
            return f"the Python module {module} is not installed (pip install -e '.[bench]')"
    return None


def records_for(size: int, records: int, sweep_bytes: int = SWEEP_BYTES) -> int:
    """N for the size sweep: `records`, or fewer where they would hold more than `sweep_bytes`."""
    return min(records, max(MIN_RECORDS, sweep_bytes // size))


def _warmup(records: int) -> int:
    return max(100, min(2_000, records // 10))


@dataclass(frozen=True)
class Settings:
    size: int = 256
    records: int = RECORDS
    producers: int = 1
    consumers: int = 1
    sizes: tuple[int, ...] = SIZES  # the throughput-by-size sweep (the main size is measured anyway)
    runs: int = RUNS
    quick: bool = False
    systems: tuple[str, ...] = SYSTEMS
    linger_ms: float = LINGER_MS  # ours at the fixed rate: the producer's linger
    e2e_rate: float | None = None  # records/s at a fixed rate; None: half each system's produce rate
    parent_dir: str = "/tmp"
    broker_config: BrokerFile | None = None  # our broker's config file; None: its defaults

    def workloads(self) -> list[Workload]:
        """The main workload first, then one per other size of the sweep (produce and consume only)."""
        main = Workload(size=self.size, records=self.records, producers=self.producers,
                        consumers=self.consumers, e2e_rate=self.e2e_rate, warmup=_warmup(self.records),
                        phases=MAIN_PHASES)
        budget = QUICK_SWEEP_BYTES if self.quick else SWEEP_BYTES
        sweep = [replace(main, size=s, records=records_for(s, self.records, budget), phases=SWEEP_PHASES,
                         warmup=_warmup(records_for(s, self.records, budget)))
                 for s in sorted(set(self.sizes) - {self.size})]
        return [main, *sweep]


@dataclass(frozen=True)
class Phase:
    """One phase of one system: each figure the median over the runs."""

    records: int
    records_per_s: float
    mb_per_s: float
    server_cpu_s: float
    client_cpu_s: float
    ack_ms: Percentiles | None = None
    e2e_ms: Percentiles | None = None
    offered_rate: float | None = None

    @staticmethod
    def of(runs: Sequence[Measurement]) -> Phase:
        def pct(get: Callable[[Measurement], Percentiles | None]) -> Percentiles | None:
            found = [p for m in runs if (p := get(m)) is not None]
            if not found:
                return None
            return Percentiles(*(median([getattr(p, q) for p in found])
                                 for q in ("p50", "p99", "p999", "max")))

        offered = [m.offered_rate for m in runs if m.offered_rate is not None]
        return Phase(round(median([m.records for m in runs])), median([m.records_per_s for m in runs]),
                     median([m.mb_per_s for m in runs]), median([m.server_cpu_s for m in runs]),
                     median([m.client_cpu_s for m in runs]), pct(lambda m: m.ack_ms), pct(lambda m: m.e2e_ms),
                     median(offered) if offered else None)

    def cpu_us(self, seconds: float) -> float:
        return seconds / self.records * 1e6


@dataclass
class System:
    """What one system did: medians per phase at the main size, produce and consume at every size, the
    per-run measurements (for ratios), and every latency of its fixed-rate phases (for plots)."""

    config: Config
    batching: str
    phases: dict[str, Phase]  # main workload: produce, consume, e2e
    by_size: dict[int, dict[str, Phase]]  # produce and consume, every size (the main one too)
    runs: dict[int, list[dict[str, Measurement]]]  # size -> per run, phase -> measurement
    ack_s: array[float] = field(default_factory=lambda: array("d"))
    e2e_s: array[float] = field(default_factory=lambda: array("d"))


# One figure of one run, from its phases at one size (None: not measured); ratios are ours / peer.
Getter = Callable[[dict[str, Measurement]], float | None]


def _pct(phase: str, kind: str, q: str) -> Getter:
    def get(run: dict[str, Measurement]) -> float | None:
        p: Percentiles | None = getattr(run[phase], kind)
        return None if p is None else float(getattr(p, q))
    return get


def _rate(phase: str) -> Getter:
    return lambda run: run[phase].records_per_s


RATIOS: tuple[tuple[str, str, Getter], ...] = (
    ("produce", "produce records/s", _rate("produce")),
    ("consume", "catch-up consume records/s", _rate("consume")),
    ("ack_p50", "publish-ack p50 at the fixed rate", _pct("e2e", "ack_ms", "p50")),
    ("ack_p99", "publish-ack p99 at the fixed rate", _pct("e2e", "ack_ms", "p99")),
    ("ack_p999", "publish-ack p99.9 at the fixed rate", _pct("e2e", "ack_ms", "p999")),
    ("e2e_p50", "end-to-end p50 at the fixed rate", _pct("e2e", "e2e_ms", "p50")),
    ("e2e_p99", "end-to-end p99 at the fixed rate", _pct("e2e", "e2e_ms", "p99")),
    ("e2e_p999", "end-to-end p99.9 at the fixed rate", _pct("e2e", "e2e_ms", "p999")),
    ("produce_server_cpu", "server CPU per record, produce",
     lambda r: r["produce"].server_cpu_s / r["produce"].records),
)


@dataclass
class Report:
    settings: Settings
    systems: list[System]
    skipped: dict[str, str]  # system -> why it did not run
    ratios: dict[str, dict[str, float]]  # peer name -> ratio key -> ours / peer (main size)
    size_ratios: dict[str, dict[int, dict[str, float]]]  # peer -> size -> produce / consume -> ours / peer
    disk_mb_s: list[float] = field(default_factory=list)  # the disk baseline, before and after the systems
    disk_direct_mb_s: list[float] = field(default_factory=list)  # the same through O_DIRECT
    # the gRPC ceiling per size, before and after the systems (bench/e2e/ceiling.py)
    grpc: dict[int, list[Ceiling]] = field(default_factory=dict)

    def system(self, name: str) -> System | None:
        return next((s for s in self.systems if s.config.name == name), None)


def _ratio(ours: list[dict[str, Measurement]], peer: list[dict[str, Measurement]], get: Getter
           ) -> float | None:
    pairs = [(a, b) for o, p in zip(ours, peer, strict=True)
             if (a := get(o)) is not None and (b := get(p)) is not None and b > 0]
    if not pairs:
        return None
    return paired_ratio([a for a, _ in pairs], [b for _, b in pairs])


def summarise(settings: Settings, configs: Sequence[Config], workloads: list[Workload],
              measured: Measured, skipped: dict[str, str]) -> Report:
    systems = []
    for c, config in enumerate(configs):
        runs = {workloads[w].size: [{m.phase: m for m in phases} for phases in measured[(w, c)]]
                for w in range(len(workloads))}
        main = runs[settings.size]
        system = System(config, config.batching(workloads[0]),
                        {phase: Phase.of([r[phase] for r in main]) for phase in MAIN_PHASES},
                        {size: {phase: Phase.of([r[phase] for r in per_run]) for phase in SWEEP_PHASES}
                         for size, per_run in sorted(runs.items())}, runs)
        for run in main:
            system.ack_s.extend(run["e2e"].ack_s)
            system.e2e_s.extend(run["e2e"].e2e_s)
        systems.append(system)
    ours = next((s for s in systems if s.config.name == OURS), None)
    ratios: dict[str, dict[str, float]] = {}
    size_ratios: dict[str, dict[int, dict[str, float]]] = {}
    for peer in systems:
        if ours is None or peer is ours:
            continue
        ratios[peer.config.name] = {key: value for key, _, get in RATIOS
                                    if (value := _ratio(ours.runs[settings.size], peer.runs[settings.size],
                                                        get)) is not None}
        size_ratios[peer.config.name] = {
            size: {phase: value for phase in SWEEP_PHASES
                   if (value := _ratio(ours.runs[size], peer.runs[size], _rate(phase))) is not None}
            for size in ours.runs}
    return Report(settings, systems, skipped, ratios, size_ratios)


def select(settings: Settings, explicit: bool) -> tuple[tuple[Config, ...], dict[str, str]]:
    """The configurations to run and those skipped (not installed). A system named with --systems that
    cannot run is an error; the default list just leaves it out."""
    configs, skipped = [], {}
    for config in all_configs(settings.linger_ms, settings.broker_config):
        if config.name not in settings.systems:
            continue
        why = missing(config, settings.consumers)
        if why is None:
            configs.append(config)
        elif explicit:
            raise SystemExit(f"{config.name}: {why}")
        else:
            skipped[config.name] = why
    return tuple(configs), skipped


def run_e2e(settings: Settings, bar: ProgressBar | None, explicit: bool = False) -> Report:
    from bench.e2e.ceiling import grpc_ceiling
    from bench.peers import suite

    configs, skipped = select(settings, explicit)
    workloads = settings.workloads()

    def starting(run: int, workload: Workload, config: Config) -> None:
        if bar is not None:
            bar.step(f"run {run}/{settings.runs}: {config.label}, {workload.records:,} x {workload.size} B")

    def finished(run: int, config: Config, phases: list[Measurement]) -> None:
        if bar is not None:
            bar.advance()

    options = Options(settings.runs, settings.quick, settings.parent_dir)
    disk_bytes = DISK_BYTES // 4 if settings.quick else DISK_BYTES
    grpc_bytes = GRPC_BYTES // 4 if settings.quick else GRPC_BYTES
    sizes = sorted({w.size for w in workloads})
    before = disk_baseline(settings.parent_dir, disk_bytes)
    direct_before = disk_baseline(settings.parent_dir, disk_bytes, direct=True)
    grpc_before = grpc_ceiling(sizes, grpc_bytes, settings.parent_dir)
    measured = suite.measure(workloads, options, configs, starting, finished)
    report = summarise(settings, configs, workloads, measured, skipped)
    report.disk_mb_s = [before, disk_baseline(settings.parent_dir, disk_bytes)]
    report.disk_direct_mb_s = [direct_before, disk_baseline(settings.parent_dir, disk_bytes, direct=True)]
    grpc_after = grpc_ceiling(sizes, grpc_bytes, settings.parent_dir)
    report.grpc = {size: [grpc_before[size], grpc_after[size]] for size in sizes}
    return report


def disk_baseline(parent_dir: str, total: int, direct: bool = False) -> float:
    """MB/s of os.write of 16 MiB chunks with an fdatasync after each, to a new file in `parent_dir`: what
    the disk gives a writer that syncs (bench/micro/disk.py; `dd oflag=dsync bs=16M` does the same); with
    `direct`, through O_DIRECT (`oflag=direct,dsync`), as our WAL writes."""
    import os
    import tempfile

    from bench.micro import disk

    chunk = os.urandom(16 << 20)
    chunks = max(1, total // len(chunk))
    fd, path = tempfile.mkstemp(prefix="danube-bench-disk-", dir=parent_dir)
    os.close(fd)
    try:
        return chunks * len(chunk) / disk.write_baseline(path, chunk, chunks, direct) / 1e6
    finally:
        os.unlink(path)


def versions(report: Report) -> str:
    """Servers and clients that ran, for the report."""
    parts = []
    names = {s.config.name for s in report.systems}
    if OURS in names:
        parts.append(f"danube_fast over its native transport (grpcio {_dist('grpcio')} for lookups)")
    nats = [servers.nats_version(always) for name, always in (("nats", False), ("nats_always", True))
            if name in names]
    if nats:
        parts.append(f"{' and '.join(nats)}, nats-py {_dist('nats-py')}")
    if names & {"redis_always", "redis_everysec"}:
        parts.append(f"{servers.version('redis-server').split(' sha=')[0]}, redis-py {_dist('redis')}, "
                     f"hiredis {_dist('hiredis')}")
    if "rabbitmq_streams" in names:
        parts.append(f"{servers.rabbitmq_version()}, rstream {_dist('rstream')}")
    return "; ".join(parts)


def _dist(name: str) -> str:
    try:
        return dist_version(name)
    except PackageNotFoundError:
        return "?"

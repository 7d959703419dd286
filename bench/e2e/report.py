"""What `python -m bench e2e` prints and writes: tables (plain text, or markdown for RESULTS.md), one JSON
object, and the plots (bench/plots/). Everything here is drawn from a Report, i.e. from what the run
measured."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import fmt, markdown_table, median, text_table
from bench.e2e import OURS, RATIOS, SWEEP_PHASES, Phase, Report, System
from bench.peers.workload import Percentiles
from bench.results import RESULTS_PATH, head_lines

if TYPE_CHECKING:
    from matplotlib.axes import Axes

PLOTS_DIR = Path(__file__).resolve().parents[1] / "plots"  # bench/plots, next to RESULTS.md
THROUGHPUT_PNG = "e2e_throughput_by_size.png"
LATENCY_PNG = "e2e_latency_cdf.png"
CDF_POINTS = 600  # points per curve: a linear spread plus a geometric one into the tail


class Table:
    def __init__(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        self.title = title
        self.columns = columns
        self.rows = rows

    def lines(self, markdown: bool) -> list[str]:
        numeric = range(1, len(self.columns))  # every column but the first holds figures
        if markdown:
            return [f"### {self.title}", "", *markdown_table(self.columns, self.rows, numeric)]
        return [self.title, *text_table(self.columns, self.rows, numeric)]


def size_text(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 and size % 1024 == 0 else f"{size} B"


def _label(system: System) -> str:
    return system.config.label + (" (ours)" if system.config.name == OURS else "")


def _pct_cells(p: Percentiles | None) -> list[str]:
    return ["" if p is None else fmt(getattr(p, q)) for q in ("p50", "p99", "p999", "max")]


def _cpu(phase: Phase, seconds: float) -> str:
    return f"{fmt(seconds)} s = {fmt(phase.cpu_us(seconds))} µs/rec"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def fixed_rate_text(report: Report) -> str:
    rate = report.settings.e2e_rate
    return f"{rate:,.0f} records/s" if rate else "half the produce rate each system reached in the same run"


def tables(report: Report) -> list[Table]:
    s = report.settings
    shape = (f"{s.records:,} records of {size_text(s.size)}, {s.producers} producer(s), "
             f"{s.consumers} consumer(s), median of {s.runs} run(s)")
    found = [Table(f"Throughput ({shape})",
                   ["system", "produce records/s", "produce MB/s", "consume records/s", "consume MB/s"],
                   [[_label(y), fmt(y.phases["produce"].records_per_s), fmt(y.phases["produce"].mb_per_s),
                     fmt(y.phases["consume"].records_per_s), fmt(y.phases["consume"].mb_per_s)]
                    for y in report.systems])]
    found.append(Table(
        f"Latency in ms at a fixed rate ({fixed_rate_text(report)}): publish to ack, and publish to receipt",
        ["system", "offered records/s", "received records/s", "ack p50", "ack p99", "ack p99.9", "ack max",
         "e2e p50", "e2e p99", "e2e p99.9", "e2e max"],
        [[_label(y), fmt(y.phases["e2e"].offered_rate), fmt(y.phases["e2e"].records_per_s),
          *_pct_cells(y.phases["e2e"].ack_ms), *_pct_cells(y.phases["e2e"].e2e_ms)] for y in report.systems]))
    found.append(Table(
        "CPU seconds per phase: the server process (every thread) and this client process",
        ["system", "produce server", "produce client", "consume server", "consume client",
         "fixed-rate server", "fixed-rate client"],
        [[_label(y), *(_cpu(p, cpu) for name in ("produce", "consume", "e2e")
                       for p in (y.phases[name],) for cpu in (p.server_cpu_s, p.client_cpu_s))]
         for y in report.systems]))
    sizes = sorted(report.systems[0].by_size) if report.systems else []
    for phase in SWEEP_PHASES:
        found.append(Table(
            f"{phase.capitalize()} records/s (MB/s) by record size",
            ["size", "records", *(_label(y) for y in report.systems)],
            [[size_text(size), fmt(report.systems[0].by_size[size][phase].records),
              *(f"{fmt(y.by_size[size][phase].records_per_s)} ({fmt(y.by_size[size][phase].mb_per_s)})"
                for y in report.systems)] for size in sizes]))
    if report.ratios:
        peers = list(report.ratios)
        found.append(Table(
            "Ours / peer, median of the per-run ratios (throughput: above 1 is ours faster; latency and CPU: "
            "below 1 is ours lower)",
            ["figure", *(_peer_label(report, peer) for peer in peers)],
            [[what, *(_ratio(report.ratios[peer].get(key)) for peer in peers)] for key, what, _ in RATIOS]))
        found.append(Table(
            "Ours / peer by record size: produce / consume records/s",
            ["size", *(_peer_label(report, peer) for peer in peers)],
            [[size_text(size), *(" / ".join(_ratio(report.size_ratios[peer][size].get(ph))
                                            for ph in SWEEP_PHASES) for peer in peers)]
             for size in sizes]))
    ours = report.system(OURS)
    if report.disk_mb_s and ours is not None:
        disk = median(report.disk_mb_s)
        direct = median(report.disk_direct_mb_s) if report.disk_direct_mb_s else None
        direct_text = f", with O_DIRECT {fmt(direct)} MB/s" if direct else ""
        found.append(Table(
            f"The disk: os.write of 16 MiB chunks, fdatasync after each: {fmt(disk)} MB/s through the page "
            f"cache{direct_text} (median of {len(report.disk_mb_s)}, before and after the systems ran); ours "
            "against it",
            ["size", "ours produce MB/s", "/ disk", *(["/ disk (O_DIRECT)"] if direct else [])],
            [[size_text(size), fmt(ours.by_size[size]["produce"].mb_per_s),
              _ratio(ours.by_size[size]["produce"].mb_per_s / disk),
              *([_ratio(ours.by_size[size]["produce"].mb_per_s / direct)] if direct else [])]
             for size in sizes]))
    if report.grpc and ours is not None:
        found.append(Table(
            f"The gRPC ceiling: a bare grpc.aio server on one stream of the fast API, batches shaped as ours "
            f"(bench/e2e/ceiling.py), MB/s of payload (median of {len(next(iter(report.grpc.values())))}, "
            "before and after the systems ran); ours against it",
            ["size", "bare produce MB/s", "ours produce / bare", "bare consume MB/s", "ours consume / bare"],
            [[size_text(size), fmt(grpc_mb_s(report, size, "produce")),
              _ratio(ours.by_size[size]["produce"].mb_per_s / grpc_mb_s(report, size, "produce")),
              fmt(grpc_mb_s(report, size, "consume")),
              _ratio(ours.by_size[size]["consume"].mb_per_s / grpc_mb_s(report, size, "consume"))]
             for size in sizes if size in report.grpc]))
    return found


def grpc_mb_s(report: Report, size: int, phase: str) -> float:
    """The gRPC ceiling's MB/s at `size` for `phase` (produce or consume), the median of its measurements."""
    return median([getattr(c, f"{phase}_mb_s") for c in report.grpc[size]])


def _peer_label(report: Report, name: str) -> str:
    system = report.system(name)
    return name if system is None else system.config.label


def broker_config_text(report: Report) -> str | None:
    """Our broker's config file (`--broker-config`) and what it sets, or None: its defaults."""
    broker = report.settings.broker_config
    return None if broker is None else f"{broker.path}: {broker.settings()}"


def described(report: Report) -> list[tuple[str, str, str]]:
    """(label, durability, batching) of every system that ran."""
    return [(y.config.label, y.config.durability_text, y.batching) for y in report.systems]


# -- JSON -----------------------------------------------------------------------------------------------


def _pct_json(p: Percentiles | None) -> dict[str, float] | None:
    return None if p is None else {q: round(getattr(p, q), 4) for q in ("p50", "p99", "p999", "max")}


def _phase_json(p: Phase) -> dict[str, Any]:
    return {"records": p.records, "records_per_s": round(p.records_per_s, 1),
            "mb_per_s": round(p.mb_per_s, 3),
            "server_cpu_s": round(p.server_cpu_s, 4), "client_cpu_s": round(p.client_cpu_s, 4),
            "server_cpu_us_per_record": round(p.cpu_us(p.server_cpu_s), 4),
            "client_cpu_us_per_record": round(p.cpu_us(p.client_cpu_s), 4),
            "ack_ms": _pct_json(p.ack_ms), "e2e_ms": _pct_json(p.e2e_ms),
            "offered_per_s": None if p.offered_rate is None else round(p.offered_rate, 1)}


def as_json(report: Report, machine: dict[str, object], versions: str) -> dict[str, Any]:
    s = report.settings
    return {
        "suite": "e2e",
        "machine": machine,
        "versions": versions,
        "workload": {"size": s.size, "records": s.records, "producers": s.producers, "consumers": s.consumers,
                     "runs": s.runs, "quick": s.quick, "fixed_rate": fixed_rate_text(report),
                     "sizes": {str(size): phases["produce"].records for size, phases in
                               (report.systems[0].by_size.items() if report.systems else ())}},
        "broker_config": None if s.broker_config is None else {"path": s.broker_config.path,
                                                               "text": s.broker_config.text},
        "skipped": report.skipped,
        "systems": [{"system": y.config.name, "label": y.config.label, "durability": y.config.durability,
                     "durability_text": y.config.durability_text, "batching": y.batching,
                     **{name: _phase_json(phase) for name, phase in y.phases.items()},
                     "by_size": [{"size": size, **{name: _phase_json(p) for name, p in phases.items()}}
                                 for size, phases in y.by_size.items()]}
                    for y in report.systems],
        "ratios": {peer: {key: round(value, 4) for key, value in found.items()}
                   for peer, found in report.ratios.items()},
        "disk_mb_s": [round(v, 1) for v in report.disk_mb_s],
        "disk_direct_mb_s": [round(v, 1) for v in report.disk_direct_mb_s],
        "grpc_ceiling_mb_s": [{"size": size, "produce": [round(c.produce_mb_s, 1) for c in found],
                               "consume": [round(c.consume_mb_s, 1) for c in found]}
                              for size, found in sorted(report.grpc.items())],
        "ratios_by_size": {peer: [{"size": size, **{k: round(v, 4) for k, v in found.items()}}
                                  for size, found in by_size.items()]
                           for peer, by_size in report.size_ratios.items()},
    }


# -- plots ----------------------------------------------------------------------------------------------


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """(latency ms, cumulative fraction) at about CDF_POINTS points, dense in the tail."""
    ordered = sorted(values)
    n = len(ordered)
    linear = (round(i * (n - 1) / (CDF_POINTS // 2)) for i in range(CDF_POINTS // 2 + 1))
    tail = (n - round(math.exp(math.log(n) * i / (CDF_POINTS // 2))) for i in range(CDF_POINTS // 2 + 1))
    ranks = sorted({min(n - 1, max(0, r)) for r in (*linear, *tail)})
    return [ordered[r] * 1e3 for r in ranks], [(r + 0.5) / n for r in ranks]


def plot(report: Report, directory: Path = PLOTS_DIR, note: str = "") -> list[Path]:
    """MB/s by record size (log-log; the disk's and the transport's own figures as lines) and the latency
    CDFs of the fixed-rate phase, as PNGs."""
    directory.mkdir(parents=True, exist_ok=True)
    runs = f"median of {report.settings.runs} run(s)"

    def throughput(ax: Axes, phase: str) -> None:
        for y in report.systems:
            sizes = sorted(y.by_size)
            ax.plot(sizes, [y.by_size[size][phase].mb_per_s for size in sizes], marker="o", label=_label(y))
        ceiling = sorted(report.grpc)
        if ceiling:
            ax.plot(ceiling, [grpc_mb_s(report, size, phase) for size in ceiling], linestyle="--",
                    color="grey", label="gRPC ceiling (bare server, one stream)")
        if phase == "produce" and report.disk_mb_s:
            ax.axhline(median(report.disk_mb_s), linestyle=":", color="black",
                       label="disk: 16 MiB writes, fdatasync each")
        if phase == "produce" and report.disk_direct_mb_s:
            ax.axhline(median(report.disk_direct_mb_s), linestyle="-.", color="black",
                       label="disk: the same with O_DIRECT")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sorted(report.systems[0].by_size) if report.systems else [])
        ax.set_xticklabels([size_text(size) for size in ax.get_xticks()])
        ax.set_xlabel("record size")
        ax.set_ylabel("MB/s of record payload")
        ax.set_title(f"{'catch-up consume' if phase == 'consume' else 'produce'} ({runs})")

    def cdf(ax: Axes, kind: str) -> None:
        for y in report.systems:
            samples = y.ack_s if kind == "ack" else y.e2e_s
            if len(samples):
                ax.plot(*_cdf(samples), label=_label(y))
        ax.set_xscale("log")
        ax.set_yscale("logit")
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("fraction of records")
        ax.set_title("publish to ack" if kind == "ack" else "publish to receipt (end to end)")

    rate = f"latency at a fixed rate: {fixed_rate_text(report)}; every record of every run"
    return [_two_panels(directory / THROUGHPUT_PNG, note, throughput, SWEEP_PHASES),
            _two_panels(directory / LATENCY_PNG, f"{rate}\n{note}", cdf, ("ack", "e2e"))]


def _two_panels(path: Path, note: str, draw: Callable[[Axes, str], None], panels: tuple[str, str]) -> Path:
    """A PNG of two plots side by side, `draw(axes, panel)` filling each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), constrained_layout=True)
    for ax, panel in zip(axes, panels, strict=True):
        draw(ax, panel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if note:
        fig.suptitle(note, fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- RESULTS.md -----------------------------------------------------------------------------------------

TITLE = "End to end (vs NATS JetStream, Redis Streams)"


def section(report: Report, info: dict[str, object], command: str, date: str, versions: str, disk: str,
            plots: Sequence[Path]) -> str:
    """The RESULTS.md section of this run: where, what, each system's durability and batching, the
    tables, and links to the plots (relative to RESULTS.md)."""
    s = report.settings
    lines = head_lines(TITLE, info, command, date,
                       f"{s.runs}; every figure is the median over the runs, every ratio the median of the "
                       "per-run ratios (ours and the peer measured in the same run)", s.quick)
    sweep = ", ".join(f"{size_text(size)} x {records:,}" for size, records in _sweep(report))
    lines[3:3] = [f"- Disk: {disk}", f"- Servers and clients: {versions}"]
    if (broker := broker_config_text(report)) is not None:
        lines.insert(5, f"- Our broker's config file (--broker-config): {broker}")
    lines += [f"- Workload: {s.records:,} records of {size_text(s.size)}, {s.producers} producer(s), "
              f"{s.consumers} consumer(s); fixed rate: {fixed_rate_text(report)}; by size (records): {sweep}"]
    lines += [f"- `{label}`: {durability}. Batching: {batching}." for label, durability, batching in
              described(report)]
    lines += [f"- Not run: {name} ({why})" for name, why in report.skipped.items()]
    for table in tables(report):
        lines += ["", *table.lines(markdown=True)]
    results_dir = Path(RESULTS_PATH).parent
    lines += ["", *(f"![{path.stem}]({path.relative_to(results_dir).as_posix()})" for path in plots)]
    return "\n".join(lines) + "\n"


def _sweep(report: Report) -> list[tuple[int, int]]:
    if not report.systems:
        return []
    return [(size, phases["produce"].records) for size, phases in sorted(report.systems[0].by_size.items())]

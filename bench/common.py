"""What every benchmark suite shares: the result type, medians and timing loops, machine facts, output."""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

from tqdm import tqdm

MIB = 1024 * 1024
MB = 1_000_000
GIB = 1024 * MIB
PUBLISH_TIME = 1_700_000_000_000  # a fixed Unix-ms time: every batch encodes the same way in every run


@dataclass(frozen=True)
class Target:
    """A goal for one figure, e.g. `Target(">= 4 GiB/s", ">=", 4.0)` or, against the baseline,
    `Target(">= 80% of baseline", ">=", 0.8, of="ratio")`."""

    text: str
    op: Literal[">=", "<="]
    threshold: float
    of: Literal["value", "ratio"] = "value"

    def met(self, result: Result) -> bool | None:
        measured = result.value if self.of == "value" else result.ratio
        if measured is None:
            return None
        return measured >= self.threshold if self.op == ">=" else measured <= self.threshold


@dataclass(frozen=True)
class Result:
    """One figure: the median over `runs` runs. `baseline` is in the same unit as `value`, and `ratio` is the
    median of the per-run ratios (not value / baseline: pairing cancels drift between runs)."""

    name: str
    unit: str
    value: float
    runs: int
    baseline: float | None = None
    ratio: float | None = None
    target: Target | None = None

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.met(self)

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "unit": self.unit,
            "value": _round(self.value),
            "baseline": None if self.baseline is None else _round(self.baseline),
            "ratio": None if self.ratio is None else round(self.ratio, 4),
            "runs": self.runs,
            "target": None if self.target is None else self.target.text,
        }


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def paired_ratio(values: Sequence[float], baselines: Sequence[float]) -> float:
    """Median of value[i] / baseline[i]: each pair ran back to back, so a slow disk spell hits both."""
    if len(values) != len(baselines):
        raise ValueError(f"{len(values)} values but {len(baselines)} baselines")
    return median([v / b for v, b in zip(values, baselines, strict=True)])


# -- timing ---------------------------------------------------------------------------------------------


@contextmanager
def no_gc() -> Iterator[None]:
    """Collect, then keep the cyclic GC out of the timed section (as timeit does)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def time_calls(fn: Callable[[], object], budget_s: float) -> tuple[int, float]:
    """Call `fn` as often as fits in about `budget_s` seconds (at least once, after a warm-up call and a
    timing call that sets the count); returns (calls, elapsed seconds)."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-9)
    calls = max(1, round(budget_s / one))
    with no_gc():
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - t0
    return calls, elapsed


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process `pid`, every thread (Linux /proc; clock-tick resolution)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()  # the command name may hold spaces and parentheses
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_cpu(pid: int) -> float:
    """process_cpu of `pid` and of its live child processes (a broker's table worker)."""
    total = process_cpu(pid)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == pid:
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                parent = int(f.read().rpartition(")")[2].split()[1])
            if parent == pid:
                total += process_cpu(int(entry))
        except (OSError, ValueError):  # gone meanwhile
            continue
    return total


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class ProgressBar:
    """The steps of a long benchmark on stderr, for humans: `step(label)` before each step, `advance()` after
    it, `write(message)` for a line above the bar. A tqdm bar on a terminal; elsewhere (a log file) one line
    per step, which a log keeps readable where a redrawn bar would not."""

    def __init__(self, total: int, out: TextIO = sys.stderr) -> None:
        self.total = max(1, total)
        self.done = 0
        self.out = out
        on_terminal = out.isatty()
        self._bar = tqdm(total=self.total, file=out, unit="step", dynamic_ncols=True) if on_terminal else None

    def step(self, label: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(label)
        else:
            self.out.write(f"[{self.done}/{self.total}] {label}\n")
            self.out.flush()

    def advance(self) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)

    def write(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message, file=self.out)
        else:
            self.out.write(message + "\n")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


# -- machine facts --------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) * 1024 / GIB, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _command(args: list[str], cwd: str | None = None) -> str | None:
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def _file_system(directory: str) -> str:
    """Like `ext4 on /dev/vda mounted at /`, from df (which names ext4 where `stat -f` says ext2/ext3)."""
    df = _command(["df", "-T", "-P", directory])
    fields = df.splitlines()[-1].split() if df else []
    if len(fields) >= 7:
        return f"{fields[1]} on {fields[0]} mounted at {fields[6]}"
    return f"{_command(['stat', '-f', '-c', '%T', directory]) or 'unknown'} (stat -f)"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def disk_description(directory: str) -> str:
    """The block device under `directory`, from sysfs: e.g. `vda (virtio), 256 GiB, write cache write back,
    scheduler mq-deadline, rotational 1`. A VM's disk reports what the hypervisor says."""
    df = _command(["df", "-P", directory])
    device = df.splitlines()[-1].split()[0] if df else ""
    block = Path("/sys/class/block") / os.path.basename(device)
    if not device.startswith("/dev/") or not block.exists():
        return f"{device or 'unknown'} (no sysfs entry)"
    if (block / "partition").exists():
        block = block.resolve().parent  # the whole disk the partition is on
    name = block.name
    bus = (_read(block / "device" / "modalias") or "").partition(":")[0]
    model = _read(block / "device" / "model")
    sectors = _read(block / "size")
    queue = block / "queue"
    scheduler = (_read(queue / "scheduler") or "").partition("[")[2].partition("]")[0]
    parts = [f"{name} ({', '.join(p for p in (bus, model) if p) or 'unknown bus'})"]
    if sectors and sectors.isdigit():
        parts.append(f"{int(sectors) * 512 / GIB:.0f} GiB")
    parts += [f"write cache {_read(queue / 'write_cache') or '?'}", f"scheduler {scheduler or '?'}",
              f"rotational {_read(queue / 'rotational') or '?'}"]
    return ", ".join(parts)


def _git_commit() -> str | None:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commit = _command(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo)
    if commit is None:
        return None
    # --no-optional-locks: status must not take index.lock under someone else's concurrent git command.
    dirty = _command(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
                     cwd=repo)
    return f"{commit}+dirty" if dirty else commit


def machine_info(data_dir: str) -> dict[str, object]:
    """Facts that decide whether two result sets are comparable."""
    from danube_fast.codec import frames
    from danube_fast.storage import wal_engine

    cores = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    return {
        "cpu": _cpu_model(),
        "cores": cores,
        "usable_cores": usable,
        "memory_gib": _memory_gib(),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "data_dir": data_dir,
        "file_system": _file_system(data_dir),
        "git_commit": _git_commit(),
        "codec": frames.IMPL,
        "wal_engine": wal_engine.IMPL,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "client_malloc": CLIENT_MALLOC,
    }


# What bench/__main__.py sets for its own (client) process: every system's Python client runs in it.
CLIENT_KEEP_BYTES = 256 << 20
CLIENT_MALLOC = f"glibc keeps {CLIENT_KEEP_BYTES >> 20} MiB freed (danube_fast/allocator.py)"


def describe_machine(info: dict[str, object]) -> str:
    return (f"{info['cpu']}, {info['cores']} cores ({info['usable_cores']} usable), "
            f"{info['memory_gib']} GiB, {info['kernel']}, {info['python']}, "
            f"data dir on {info['file_system']}, "
            f"codec {info['codec']}, WAL engine {info['wal_engine']}, commit {info['git_commit'] or 'n/a'}"
            + (f", client process: {info['client_malloc']}" if info.get("client_malloc") else ""))


# -- output ---------------------------------------------------------------------------------------------


def fmt(x: float | None) -> str:
    """Human figure: thousands separators for large numbers, 3 significant digits for small ones."""
    if x is None:
        return ""
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.1f}"
    return f"{x:.3g}"


def met_text(met: bool | None) -> str:
    return "" if met is None else ("yes" if met else "NO")


def print_json_lines(results: Sequence[Result], out: TextIO = sys.stdout) -> None:
    for r in results:
        print(json.dumps(r.as_json(), ensure_ascii=False), file=out)


@dataclass(frozen=True)
class Options:
    """What every suite takes from the command line."""

    runs: int = 5
    quick: bool = False
    parent_dir: str = "/tmp"  # the scratch directory is created (and removed) inside


TABLE_COLUMNS = ("name", "value", "unit", "baseline", "ratio", "runs", "target", "met?")


def table_rows(results: Sequence[Result]) -> list[tuple[str, ...]]:
    return [(r.name, fmt(r.value), r.unit, fmt(r.baseline), "" if r.ratio is None else f"{r.ratio:.3f}",
             str(r.runs), "" if r.target is None else r.target.text, met_text(r.met)) for r in results]


def text_table(columns: Sequence[str], rows: Sequence[Sequence[str]], numeric: Collection[int]) -> list[str]:
    """Aligned plain-text lines: a header, a rule, the rows; columns in `numeric` right-aligned."""
    table = [tuple(columns), *(tuple(row) for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    lines = []
    for n, row in enumerate(table):
        cells = [c.rjust(w) if i in numeric and n else c.ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]], numeric: Collection[int]
                   ) -> list[str]:
    """A GitHub markdown table; columns in `numeric` right-aligned."""
    align = ["---:" if i in numeric else ":---" for i in range(len(columns))]
    return ["| " + " | ".join(row) + " |" for row in (columns, align, *rows)]


def print_table(results: Sequence[Result], out: TextIO = sys.stdout) -> None:
    for line in text_table(TABLE_COLUMNS, table_rows(results), {1, 3, 4, 5}):
        print(line, file=out)

"""The memory this broker may use, and the memory settings whose defaults follow it.

`usable_memory()` is the smallest of physical memory, the cgroup v2 limit (`memory.max`) and the cgroup v1
limit (`memory.limit_in_bytes`) of the process's own cgroup and every cgroup above it (a limit on a parent
holds its children too): a container's limit is what the kernel OOM-kills the broker at, whatever the host
has. "max" (v2) and v1's "no limit" (the largest page count times the page size, about 2^63) set nothing.

`SHARES` are the settings sized from it (`broker/config.py` `load` applies them, once, to the settings a
config file leaves out or sets to "auto"): each takes its dataclass default, the value the broker's
benchmarks ran with, lowered to a fraction of usable memory when that is small, never below `FLOOR`
(docs/decisions/0012-memory-defaults.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MiB = 1 << 20
# Below this a setting stops doing its job with the default geometry: a WAL group is up to 16 MiB
# ([wal] max_group_bytes; a tail cache budget smaller than a group evicts it as it is added), a consumer's
# window is 16 MiB ([dispatch] window_bytes), and a kept heap smaller than one group's buffer gives it back
# to the kernel at every free (danube_fast/allocator.py).
FLOOR = 16 * MiB
# v1 reports "no limit" as the largest page count times the page size (9223372036854771712 with 4 KiB
# pages); anything this big is no limit.
NO_LIMIT = 1 << 62
_V2 = "sys/fs/cgroup"
_V1 = "sys/fs/cgroup/memory"


@dataclass(frozen=True)
class UsableMemory:
    nbytes: int
    source: str  # what sets it, for the log: "physical memory", "cgroup v2 limit in /sys/fs/cgroup/..."


@dataclass(frozen=True)
class Share:
    """A setting (`[section] name`) whose default is lowered to usable memory // `divisor` when that is
    smaller, but not below FLOOR (nor above the default)."""

    section: str
    name: str
    divisor: int

    def of(self, default: int, usable: UsableMemory | None) -> int:
        if usable is None:
            return default
        return min(default, max(FLOOR, usable.nbytes // self.divisor))


# Each share reaches its default (1 GiB, then 256 MiB each) at 4 GiB of usable memory: with more, the
# defaults are the ones bench/RESULTS.md's runs used; with less, they plan on 8/16 of it, leaving the
# rest to what has no setting (the interpreter and its modules, gRPC's buffers per stream, groups being
# written, messages being produced, up to [broker] max_message_size each) and to the page cache, which a
# cgroup charges too. A table commit holds its batches (an anonymous memory file for the table worker), their
# Arrow columns and the Parquet being written (in the table worker process), up to about three times
# commit_bytes while it runs (only on a broker whose topics have tables). The tail
# cache takes the largest share (Pulsar's broker cache takes 1/5 of its direct memory, apache/pulsar
# conf/broker.conf managedLedgerCacheSizeMB): it is what keeps consumers at the tail off the disk.
SHARES: tuple[Share, ...] = (
    Share("wal", "cache_total_bytes", 4),
    Share("dispatch", "broker_bytes", 16),
    Share("broker", "malloc_keep_bytes", 16),
    Share("tables", "commit_bytes", 16),
    Share("broker", "fast_inflight_bytes", 16),
)


def usable_memory(root: str | Path = "/", physical: int | None = None) -> UsableMemory | None:
    """The smallest of physical memory and the cgroup limits found under `root` (a fake /proc and /sys in
    tests); `physical` None reads it from sysconf. None when nothing is known (no sysconf figures, no
    limit)."""
    root = Path(root)
    if physical is None:
        try:
            physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):  # a name this system lacks
            physical = None
    found = [] if physical is None or physical <= 0 else [UsableMemory(physical, "physical memory")]
    v2_path, v1_path = _own_cgroups(root)
    if v2_path is not None:
        found += _limits(root, _V2, v2_path, "memory.max", "cgroup v2 limit")
    if v1_path is not None:
        found += _limits(root, _V1, v1_path, "memory.limit_in_bytes", "cgroup v1 limit")
    return min(found, key=lambda m: m.nbytes, default=None)  # physical first: it wins a tie


def _own_cgroups(root: Path) -> tuple[str | None, str | None]:
    """The process's cgroup in the v2 hierarchy (the `0::PATH` line of /proc/self/cgroup) and in v1's
    memory hierarchy (`N:CONTROLLERS:PATH` with `memory` among the controllers)."""
    try:
        text = (root / "proc/self/cgroup").read_text()
    except OSError:
        return None, None
    v2 = v1 = None
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, colon, path = rest.partition(":")
        if not colon:
            continue
        if hierarchy == "0" and not controllers:
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _limits(root: Path, mount: str, path: str, name: str, what: str) -> Iterable[UsableMemory]:
    """The limit file `name` of cgroup `path` and of each cgroup above it, up to the mount's root (which is
    the container's own cgroup where /proc shows a path the container's mount does not have)."""
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), -1, -1):
        shown = "/".join([mount, *parts[:depth], name])
        try:
            text = (root / shown).read_text().strip()
        except OSError:  # not a cgroup here, or the root cgroup, which has no limit file
            continue
        if text == "max" or not text.isdigit() or int(text) >= NO_LIMIT:
            continue
        yield UsableMemory(int(text), f"{what} in /{shown}")


def size(nbytes: int) -> str:
    """`nbytes` for a log line: 1 GiB, 256 MiB, 23.5 GiB, 4096 B."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.1f}".removesuffix(".0") + " " + unit
    return f"{nbytes} B"


def describe(usable: UsableMemory | None, sized: Iterable[tuple[Share, int]],
             given: Iterable[tuple[Share, int]]) -> str:
    """One log line: what usable memory is and what limits it, the settings sized from it and the ones the
    configuration set."""
    if usable is None:
        parts, sized_as = ["memory: usable memory unknown"], "defaults"
    else:
        parts, sized_as = [f"memory: {size(usable.nbytes)} usable ({usable.source})"], "sized from it"
    for label, chosen in ((sized_as, list(sized)), ("as configured", list(given))):
        if chosen:
            parts.append(f"{label}: " + ", ".join(f"[{s.section}] {s.name} = {size(n)}" for s, n in chosen))
    return "; ".join(parts)

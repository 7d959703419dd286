"""WAL settings: durability policy and segment geometry."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

SyncMode = Literal["always", "interval", "none"]

_INTERVAL = re.compile(r"interval\((\d+)(?:ms)?\)")


@dataclass(frozen=True)
class SyncPolicy:
    """When the WAL calls fdatasync, and so what an acknowledgement means.

    - ``always`` (default): an append is acknowledged only after the fdatasync that covers it. Concurrent
      appends share one fdatasync (group commit). Nothing acknowledged is lost on power failure.
    - ``interval(ms)``: acknowledged after the write; fdatasync at most `ms` later. A machine crash loses
      up to that window of acknowledged data; a process crash loses nothing (the page cache survives).
    - ``none``: acknowledged after the write; fdatasync only when a segment rolls and at close. A machine
      crash may lose everything since the last roll.
    """

    mode: SyncMode = "always"
    interval_ms: int = 0

    @classmethod
    def parse(cls, text: str) -> SyncPolicy:
        text = text.strip().lower()
        if text in ("always", "none"):
            return cls(text)  # type: ignore[arg-type]
        m = _INTERVAL.fullmatch(text)
        if m and int(m.group(1)) > 0:
            return cls("interval", int(m.group(1)))
        raise ValueError(f"sync must be 'always', 'none' or 'interval(MS)' with MS > 0, not {text!r}")

    def __str__(self) -> str:
        return f"interval({self.interval_ms})" if self.mode == "interval" else self.mode


@dataclass(frozen=True)
class WalConfig:
    sync: SyncPolicy = SyncPolicy()
    segment_bytes: int = 128 * 1024 * 1024
    segment_ms: int = 0  # roll a segment this old at the next append; 0 = by size only
    index_interval_bytes: int = 4096
    # The active segment's index file is this long but sparse: its disk blocks are reserved as entries need
    # them (a page, doubling up to 64 KiB steps), so an idle topic holds one page, not this much.
    index_max_bytes: int = 1024 * 1024
    # Recent committed groups kept in memory for readers (storage/tail_cache.py): at most this much per topic,
    # and at most cache_total_bytes for every topic of the broker together (the oldest go first). The broker's
    # config loader lowers cache_total_bytes's default where memory is small (broker/memory.py).
    cache_bytes: int = 1024 * 1024 * 1024
    cache_total_bytes: int = 1024 * 1024 * 1024
    # Segments already in the object tier stay on local disk up to this many bytes per topic (the newest
    # ones), so that catch-up reads of recent offsets stay local; 0 deletes them once uploaded.
    retain_bytes: int = 1024 * 1024 * 1024
    max_group_bytes: int = 16 * 1024 * 1024  # one write + fsync covers at most this much
    # While other appends are still waiting for their acknowledgement (concurrent producers) and what is
    # queued is small, the writer waits this long (microseconds) for more before writing a group, so that
    # one write, one fsync and one handoff back to the event loop serve several appends. A lone sequential
    # producer never waits, nor does a big group. 0 = off.
    linger_us: int = 1000
    # Threads of the process's WAL I/O pool (storage/io_pool.py), shared by every topic; 0 = a few per core.
    # The largest size asked for in the process wins.
    io_threads: int = 0
    # A log with no append and no read for this long gives back its cache, descriptors and index mappings
    # (Wal.release_if_idle; the broker's topic sweeper calls it); the next use reopens them. 0 = never.
    idle_release_ms: int = 300_000
    # With sync = always, appends go to the active segment with O_DIRECT (Segment.direct in _wal.pyx): an
    # fsync'd append then skips the page cache's copy and writeback, about half the kernel time per group
    # (docs/ARCHITECTURE.md, "Direct appends"). Ignored where the file system has no O_DIRECT (tmpfs).
    direct_io: bool = True
    # With direct appends, read with O_DIRECT too (Segment.direct_reads): a fifth of the CPU per byte read,
    # but readers of the same data no longer share the page cache's copy, so a consumer and the uploader (or
    # two subscriptions) catching up each read the disk: off by default (docs/ARCHITECTURE.md, "Direct
    # reads").
    direct_reads: bool = False

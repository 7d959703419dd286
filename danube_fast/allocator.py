"""glibc malloc settings for a process that moves large buffers: keep freed memory for reuse.

By default glibc serves an allocation of 128 KiB or more (a threshold it raises as such blocks are freed)
with its own mmap, and gives freed memory at the top of a heap back to the kernel once twice that threshold
is free. A broker or client passing 1 MiB messages then maps, faults in and hands back memory for most
messages. Where the kernel passes freed pages on to a hypervisor (the benchmark VM does), touching such a
page again costs far more than the copy into it: a bare gRPC stream of 1 MiB messages carried 0.7-0.9 GB/s
with glibc's defaults and 1.7-2.0 GB/s with the settings below, at half the client CPU per byte
(docs/ARCHITECTURE.md, "Memory the process keeps").

`keep_freed_memory(keep_bytes)` sets M_MMAP_THRESHOLD to 32 MiB (glibc's largest: blocks below it come
from the heap, where freed memory is reused), M_TRIM_THRESHOLD to `keep_bytes` (freed memory kept before
the heap's top is given back) and M_ARENA_MAX to 1. The last because glibc gives a thread that contends for
the main arena a heap of its own, and unmaps such a heap whenever all of it is free, whatever the trim
threshold: the WAL's I/O threads allocate each group's aligned buffer (up to 16 MiB) and the event loop
frees it when the tail cache lets it go, so those heaps came and went, and a perf profile of a 64 KiB-record
produce had half the samples under Segment.stamp's copy in page faults. With one arena, measured in the
same session (3 rounds each, broker and client set): produce 641-703 MB/s against 598-607 at 0.64-0.74 s
of broker CPU against 0.77-0.79, the catch-up consume after it 887-989 against 664-959. The cost: threads
that allocate at once wait for the one arena's lock. The process's resident size stays near its
high-water mark. The broker
calls it at start (`[broker] malloc_keep_bytes`); a client application may call it itself. mallopt is
glibc's own interface: a C library without it (musl) is left as it is.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 32 << 20  # glibc's maximum for M_MMAP_THRESHOLD on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)


def keep_freed_memory(keep_bytes: int) -> bool:
    """Set glibc's mmap and trim thresholds and its arena count as the module says, before the process
    starts threads that allocate; False (nothing changed) without glibc's mallopt or when it refuses a
    value. `keep_bytes` 0 leaves glibc's defaults."""
    if keep_bytes < 0:
        raise ValueError(f"keep_bytes must be >= 0, not {keep_bytes}")
    if keep_bytes == 0:
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    keep = min(keep_bytes, (1 << 31) - 1)  # an int
    return (bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, keep))
            and bool(mallopt(M_ARENA_MAX, 1)))

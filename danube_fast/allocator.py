"""glibc malloc settings for a process that moves large buffers: keep freed memory for reuse.

By default glibc serves an allocation of 128 KiB or more (a threshold it raises as such blocks are freed)
with its own mmap, and gives freed memory at the top of a heap back to the kernel once twice that threshold
is free. A broker or client passing 1 MiB messages then maps, faults in and hands back memory for most
messages. Where the kernel passes freed pages on to a hypervisor (the benchmark VM does), touching such a
page again costs far more than the copy into it: a bare gRPC stream of 1 MiB messages carried 0.7-0.9 GB/s
with glibc's defaults and 1.7-2.0 GB/s with the settings below, at half the client CPU per byte
(docs/ARCHITECTURE.md, "Memory the process keeps").

`keep_freed_memory(keep_bytes)` sets M_MMAP_THRESHOLD to 32 MiB (glibc's largest: blocks below it come
from the heap, where freed memory is reused) and M_TRIM_THRESHOLD to `keep_bytes` (freed memory kept before
the heap's top is given back). The process's resident size then stays near its high-water mark. The broker
calls it at start (`[broker] malloc_keep_bytes`); a client application may call it itself. mallopt is
glibc's own interface: a C library without it (musl) is left as it is.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's maximum for M_MMAP_THRESHOLD on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)


def keep_freed_memory(keep_bytes: int) -> bool:
    """Set glibc's mmap and trim thresholds as the module says; False (nothing changed) without glibc's
    mallopt or when it refuses a value. `keep_bytes` 0 leaves glibc's defaults."""
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
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, keep))

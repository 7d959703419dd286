"""danube_fast.allocator: glibc keeps freed memory (a fresh interpreter per check: malloc settings are
process-wide). Observed through glibc's own mallinfo2: with the settings, a 24 MiB block comes from the heap,
not from an mmap of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from danube_fast.allocator import keep_freed_memory

PROBE = """
import ctypes, sys
from danube_fast.allocator import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks "
                                                     "uordblks fordblks keepcost".split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep":
    assert keep_freed_memory(256 << 20)
before = libc.mallinfo2().hblks
block = bytearray(24 << 20)
print(libc.mallinfo2().hblks - before)
"""


@pytest.mark.parametrize(("mode", "mapped"), [("glibc", 1), ("keep", 0)])
def test_large_blocks_come_from_the_heap_once_freed_memory_is_kept(mode: str, mapped: int) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60,
                          check=True)
    assert int(done.stdout) == mapped


def test_keeping_nothing_leaves_glibc_as_it_is_and_a_negative_size_is_refused() -> None:
    assert keep_freed_memory(0) is False
    with pytest.raises(ValueError, match="keep_bytes"):
        keep_freed_memory(-1)

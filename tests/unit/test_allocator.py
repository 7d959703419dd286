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


THREAD_PROBE = """
import ctypes, os, sys, tempfile, threading
from danube_fast.allocator import keep_freed_memory

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
libc.fclose.argtypes = (ctypes.c_void_p,)
if sys.argv[1] == "keep":
    assert keep_freed_memory(256 << 20)
else:  # the same thresholds, glibc's arenas
    assert libc.mallopt(-3, 32 << 20) and libc.mallopt(-1, 256 << 20)
got = []
thread = threading.Thread(target=lambda: got.append(libc.malloc(4 << 20)))
thread.start()
thread.join()
assert got[0]
path = os.path.join(tempfile.mkdtemp(), "info.xml")
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, fp)
libc.fclose(fp)
print(open(path).read().count("<heap nr="))
"""


@pytest.mark.parametrize(("mode", "arenas"), [("thresholds", 2), ("keep", 1)])
def test_a_threads_blocks_come_from_the_one_arena(mode: str, arenas: int) -> None:
    """malloc_info lists the arenas: a thread that allocates gets one of its own from glibc (a heap unmapped
    again whenever all of it is free), none with the settings."""
    done = subprocess.run([sys.executable, "-c", THREAD_PROBE, mode], capture_output=True, text=True,
                          timeout=60, check=True)
    assert int(done.stdout) == arenas

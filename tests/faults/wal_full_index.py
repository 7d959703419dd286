"""A WAL engine on a full file system, in a process of its own: if the index mapping needs a page the disk no
longer has, the kernel kills the process with SIGBUS; the engine must answer with a clean error instead.

    python wal_full_index.py DIR FILLER SCENARIO

DIR and FILLER are on a small tmpfs. SCENARIO says where the index meets the full disk:
  page    the append whose index entry is the first one in a new page of the index file
  roll    the append that rolls into a new segment, with a new index file
  reopen  reopening a log whose active index is missing (recovery rebuilds it)

FILLER takes all the free space but what the record data of that append needs (none for page and reopen),
so only the index lacks room. Prints "ack FIRST LAST" per acknowledged (synced) append, "error TYPE MESSAGE"
for the refusal, then "freed", deletes FILLER and goes on: the same log (page, roll) or a reopened one
(reopen) must append again. Record i holds record(i). The engine is the one storage/wal_engine.py selects
(DANUBE_FAST_PURE=1: the twin).
"""

from __future__ import annotations

import errno
import mmap
import os
import sys
from typing import Any

from danube_fast.codec import frames
from danube_fast.errors import WalWriteError
from danube_fast.storage.segmented_log import SegmentedLog

PAGE = mmap.PAGESIZE
SEGMENT_BYTES = 8 * 1024  # roll: a few dozen batches per segment
OPTIONS = {"index_interval_bytes": 0, "index_max_bytes": 64 * 1024}  # an index entry per batch


def record(i: int) -> bytes:
    return b"record %d" % i


def batch(log: Any) -> bytes:
    data: bytes = frames.encode_payloads([record(log.next_offset)], publish_time=1_700_000_000_000)
    return data


def append(log: Any) -> None:
    result = log.append([batch(log)])
    log.sync()
    first, last = result.ranges[0]
    print("ack", first, last, flush=True)


def active_log_size(log: Any, directory: str) -> int:
    return os.path.getsize(os.path.join(directory, f"{log.segment_bases[-1]:020d}.log"))


def fill(filler: str, leave_pages: int) -> None:
    """Take every free page of the file system but `leave_pages`."""
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while True:
            try:
                os.write(fd, b"\xff" * PAGE)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
        size = os.fstat(fd).st_size // PAGE * PAGE
        os.ftruncate(fd, size - leave_pages * PAGE)
    finally:
        os.close(fd)
    free = os.statvfs(filler).f_bavail
    assert free == leave_pages, (free, leave_pages)


def pages_for(size: int, more: int) -> int:
    return -(-(size + more) // PAGE) - -(-size // PAGE)


def main(directory: str, filler: str, scenario: str) -> None:
    options = {**OPTIONS, "segment_bytes": SEGMENT_BYTES if scenario == "roll" else 1 << 20}
    log = SegmentedLog(directory, **options)
    if scenario == "page":
        # Fill the first page of the index (one entry per batch). The next batch fits in the last page of the
        # data (these sizes are chosen for that), so the disk can be full: only its index entry needs a page.
        while (log.next_offset + 1) * 8 <= PAGE:
            append(log)
        assert log.segment_bases == [0]
        assert pages_for(active_log_size(log, directory), len(batch(log))) == 0
        fill(filler, 0)
    elif scenario == "roll":
        # Fill the segment so that the next batch rolls into a new one, then leave room for that batch only.
        while active_log_size(log, directory) + len(batch(log)) <= SEGMENT_BYTES:
            append(log)
        fill(filler, pages_for(0, len(batch(log))))
    else:
        for _ in range(5):
            append(log)
        active = log.segment_bases[-1]
        log.close()
        os.unlink(os.path.join(directory, f"{active:020d}.idx"))
        fill(filler, 0)
    try:
        if scenario == "reopen":
            log = SegmentedLog(directory, **options)
        else:
            next_offset = log.next_offset
            append(log)
    except WalWriteError as e:
        print("error", type(e).__name__, str(e).replace("\n", " "), flush=True)
        if scenario != "reopen":
            assert log.next_offset == next_offset
    os.unlink(filler)
    print("freed", flush=True)
    if scenario == "reopen":
        log = SegmentedLog(directory, **options)
    for _ in range(3):
        append(log)
    log.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])

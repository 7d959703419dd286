"""One small, fixed pool of threads that does the disk work of every WAL in the process.

Threads per WAL would not scale (a writer and a syncer each: 12,000 threads for 6,000 Reliable topics).
Every WAL hands its work to one shared pool as tasks instead: "write what is queued" and "fdatasync what was
written". A WAL never has two tasks of the same kind queued or running, so
its writes stay in order, while its write and its fdatasync may run on two threads at once (the pipelining
the syncer thread gave: the next group is written while the previous one is flushed). An idle WAL costs no
thread at all. The engine releases the GIL for pwrite and fdatasync, so the threads overlap their disk
waits.

Tasks may be queued to run at a time (`submit_at`): the writer's linger and the interval sync policy use
that instead of a thread that sleeps.

Why not concurrent.futures.ThreadPoolExecutor: it has no delayed tasks, and it grows a thread per submission
up to its limit even when the tasks are microseconds long; this pool's threads wait on one condition.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger("danube_fast.wal")

Task = Callable[[], None]


def default_threads() -> int:
    """A few per core: enough that one topic's write and fdatasync overlap and that a slow disk wait does
    not stall other topics; few enough that 10,000 topics still run on a handful."""
    return max(4, min(32, 4 * (os.cpu_count() or 1)))


class IoPool:
    def __init__(self, threads: int | None = None, name: str = "wal-io") -> None:
        self.size = threads or default_threads()
        self._cv = threading.Condition()
        self._ready: deque[Task] = deque()
        self._timed: list[tuple[float, int, Task]] = []  # (monotonic due time, tie-break, task), a heap
        self._tie = itertools.count()
        self._closing = False
        self._name = name
        self._threads: list[threading.Thread] = []
        self._grow(self.size)

    _shared: IoPool | None = None
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls, threads: int | None = None) -> IoPool:
        """The process's pool, started on first use with `threads` (0 or None: default_threads()). A later
        call asking for more threads grows it: the pool is sized by the largest request, not by whichever WAL
        opened first (several brokers in one process, or a config read after a tool opened a WAL)."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls(threads)
            elif threads and threads > cls._shared.size:
                cls._shared._grow(threads)
            return cls._shared

    def _grow(self, threads: int) -> None:
        with self._cv:
            start = len(self._threads)
            self.size = max(self.size, threads)
            added = [threading.Thread(target=self._work, name=f"{self._name}-{i}", daemon=True)
                     for i in range(start, threads)]
            self._threads.extend(added)
        for t in added:
            t.start()

    def submit(self, task: Task) -> None:
        """Run `task` on a pool thread soon. It must not raise (an exception is logged and dropped)."""
        with self._cv:
            self._ready.append(task)
            self._cv.notify()

    def submit_at(self, when: float, task: Task) -> None:
        """Run `task` at `when` (time.monotonic()) or soon after."""
        with self._cv:
            heapq.heappush(self._timed, (when, next(self._tie), task))
            self._cv.notify()

    def close(self) -> None:
        """Run what is queued (not what is timed), then stop the threads (for pools a test made)."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        for t in self._threads:
            t.join()

    def _work(self) -> None:
        while True:
            with self._cv:
                while True:
                    now = time.monotonic()
                    while self._timed and self._timed[0][0] <= now:
                        self._ready.append(heapq.heappop(self._timed)[2])
                    if self._ready:
                        task = self._ready.popleft()
                        if self._ready:
                            self._cv.notify()  # more for another thread
                        break
                    if self._closing:
                        return
                    self._cv.wait(self._timed[0][0] - now if self._timed else None)
            try:
                task()
            except Exception:  # a WAL task handles its own errors; this is a bug, and the pool must go on
                log.exception("a WAL I/O task failed")

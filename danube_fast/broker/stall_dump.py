"""Where a stalled event loop is stuck: with `[broker] stall_dump_ms` set, a loop that does not run for that
long gets its stack logged (a warning of logger danube_fast.broker), once per stall, while it is stuck.

A task on the loop notes the time several times per period; a watchdog thread looks at that note and, when
it is a whole period old, logs the loop thread's current stack (`sys._current_frames`). The watchdog takes
the GIL to read it, which a loop running Python code gives up every few milliseconds; a loop stuck in a C
call holding the GIL is logged once the call returns. Not faulthandler's `dump_traceback_later`: its thread
reads the other threads' frames without the GIL, and a broker in the fault campaign died of SIGSEGV in the
middle of such a dump.

The pause detector (cluster/membership.py) says *that* the loop stalled; this says *where*. Off by default:
the fault campaign (docs/CHAOS.md) turns it on. Owner: the Broker (start, close).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
import traceback

log = logging.getLogger("danube_fast.broker")

BEATS = 4  # notes per period: a loop late by less than a period is never logged


class StallDump:
    def __init__(self, after_s: float) -> None:
        self._after = after_s
        self._beat = time.monotonic()
        self._logged_beat = -1.0  # the note of the stall logged last: one log per stall
        self._loop_thread = 0
        self._task: asyncio.Task[None] | None = None
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self.logged = 0  # stalls logged

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._task = asyncio.create_task(self._beat_forever(), name="stall-dump")
        self._watchdog = threading.Thread(target=self._watch, name="stall-dump", daemon=True)
        self._watchdog.start()

    async def _beat_forever(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(self._after / BEATS)

    def _watch(self) -> None:
        while not self._stop.wait(self._after / BEATS):
            beat = self._beat
            late = time.monotonic() - beat
            if late < self._after or beat == self._logged_beat:
                continue
            frame = sys._current_frames().get(self._loop_thread)
            if frame is None:
                continue
            self._logged_beat = beat
            self.logged += 1
            log.warning("the event loop has not run for %.1f s; it is at:\n%s", late,
                        "".join(traceback.format_stack(frame)).rstrip())

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._watchdog is not None:
            await asyncio.to_thread(self._watchdog.join)

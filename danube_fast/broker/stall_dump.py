"""Where a stalled event loop is stuck: with `[broker] stall_dump_ms` set, a loop that does not run for that
long gets the stack of every thread written to stderr (the broker's log), by the standard library's
faulthandler watchdog thread, which runs while the loop is blocked.

The loop re-arms the watchdog several times per period; a loop that is late by a whole period is stuck in a
call that does not yield (or the process was stopped: a SIGSTOP dumps once on SIGCONT). The pause detector
(cluster/membership.py) says *that* the loop stalled; this says *where*. Off by default: the fault campaign
(docs/CHAOS.md) turns it on.

faulthandler's watchdog is one per process, so one StallDump per broker process. Owner: the Broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import sys
from typing import TextIO

REARMS = 4  # re-arms per period: a loop late by less than a period never dumps


class StallDump:
    def __init__(self, after_s: float, file: TextIO | None = None) -> None:
        self._after = after_s
        self._file = file or sys.stderr
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._rearm_forever(), name="stall-dump")

    async def _rearm_forever(self) -> None:
        while True:
            faulthandler.dump_traceback_later(self._after, repeat=False, file=self._file, exit=False)
            await asyncio.sleep(self._after / REARMS)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        faulthandler.cancel_dump_traceback_later()

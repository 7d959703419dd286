"""The stall dump (broker/stall_dump.py): a loop blocked longer than the period leaves every thread's stack,
naming the call it is stuck in; a loop that keeps running leaves nothing."""

import asyncio
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from danube_fast.broker.stall_dump import StallDump


def _stuck_in_a_blocking_call(seconds: float) -> None:
    time.sleep(seconds)


def _run(path: Path, body: Coroutine[Any, Any, None]) -> str:
    with path.open("w") as out:
        async def main() -> None:
            dump = StallDump(0.2, file=out)
            dump.start()
            await asyncio.sleep(0.1)
            await body
            await dump.close()
        asyncio.run(main())
    return path.read_text()


def test_a_blocked_loop_dumps_the_call_it_is_stuck_in(tmp_path: Path) -> None:
    async def block() -> None:
        _stuck_in_a_blocking_call(0.6)

    text = _run(tmp_path / "dump", block())
    assert "_stuck_in_a_blocking_call" in text, text


def test_a_running_loop_dumps_nothing_and_close_disarms(tmp_path: Path) -> None:
    async def run() -> None:
        for _ in range(10):
            await asyncio.sleep(0.05)

    assert _run(tmp_path / "dump", run()) == ""
    time.sleep(0.4)  # closed: the watchdog is cancelled, so nothing comes later either
    assert (tmp_path / "dump").read_text() == ""

"""The stall dump (broker/stall_dump.py): a loop blocked longer than the period logs, once, the stack of the
loop thread naming the call it is stuck in; a loop that keeps running logs nothing."""

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from danube_fast.broker.stall_dump import StallDump


def _stuck_in_a_blocking_call(seconds: float) -> None:
    time.sleep(seconds)


def _spin(seconds: float) -> None:
    """Python code that holds the loop (as a long walk over offsets did): the watchdog gets the GIL between
    its bytecodes."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _run(body: Coroutine[Any, Any, None]) -> int:
    async def main() -> int:
        dump = StallDump(0.2)
        dump.start()
        await asyncio.sleep(0.1)
        await body
        await dump.close()
        return dump.logged
    return asyncio.run(main())


def test_a_blocked_loop_logs_the_call_it_is_stuck_in_once(caplog: pytest.LogCaptureFixture) -> None:
    async def block() -> None:
        _stuck_in_a_blocking_call(0.7)
        await asyncio.sleep(0.2)  # the loop runs again: the next block is another stall
        _spin(0.7)

    with caplog.at_level(logging.WARNING, logger="danube_fast.broker"):
        assert _run(block()) == 2  # one per stall, however long each lasts
    stalls = [r.getMessage() for r in caplog.records if "has not run" in r.getMessage()]
    assert len(stalls) == 2
    assert "_stuck_in_a_blocking_call" in stalls[0] and "_spin" in stalls[1], stalls


def test_a_running_loop_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        for _ in range(10):
            await asyncio.sleep(0.05)

    with caplog.at_level(logging.WARNING, logger="danube_fast.broker"):
        assert _run(run()) == 0
    assert not [r for r in caplog.records if "has not run" in r.getMessage()]

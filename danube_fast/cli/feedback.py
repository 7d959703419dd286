"""Feedback on long commands, on stderr and only on a terminal (tqdm's `disable=None`), so that pipes, logs
and `--output json` get the summary alone: a bar where the amount of work is known (`produce --count`,
`metadata restore`), elapsed time while a broker works on a call (`brokers unload` waits for its topics to
move).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import Never, TypeVar

from tqdm import tqdm

T = TypeVar("T")
TICK = 0.5  # seconds between redraws of a wait


def bar(total: int | None, unit: str) -> tqdm[Never]:
    """A progress bar to `update(n)` and `close()`; `total` None: a count without an end."""
    return tqdm(total=total, unit=unit, unit_scale=True, file=sys.stderr, disable=None, leave=False)


async def waiting(label: str, work: Awaitable[T]) -> T:
    """`work`'s result, with `label` and the time spent on it redrawn meanwhile."""
    shown = tqdm(total=None, desc=label, bar_format="{desc}: {elapsed}", file=sys.stderr, disable=None,
                 leave=False)
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            await asyncio.wait([task], timeout=TICK)
            shown.refresh()
        return task.result()
    finally:
        task.cancel()
        shown.close()

"""Named points where a test may have the broker die on the spot (SIGKILL to itself), to check that a crash
at that exact step (of a topic move, of a table commit) is recovered. A real crash cannot be placed
between two writes on demand; this is the one fault the tests inject instead of producing it.

Armed by the environment: DANUBE_FAST_CRASH_AT=<point>. Unset (always, outside tests), `reach` is a dict
lookup.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger("danube_fast.broker")

AFTER_SEAL = "after_seal"  # the old owner wrote the sealed state, before deleting its WAL
MID_LOAD = "mid_load"  # the new owner wrote its reservation and opened its WAL, before serving
TABLE_BEFORE_COMMIT = "table_before_commit"  # a table's Parquet files are written, its commit not made

ENV = "DANUBE_FAST_CRASH_AT"
_ARMED = os.environ.get(ENV, "")


def armed(point: str) -> bool:
    return point == _ARMED


def reach(point: str) -> None:
    if point == _ARMED:
        log.warning("crash point %s reached: killing this broker (DANUBE_FAST_CRASH_AT)", point)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)

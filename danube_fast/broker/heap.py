"""The broker process's long-lived objects kept out of the cyclic garbage collector's full passes.

A full (generation 2) collection walks every tracked object and holds the GIL while it does: when the
broker still loaded the table libraries itself (pyiceberg, pydantic, sqlalchemy: about 160 k objects; they
now live in the table worker process) one took 30-100 ms on this 2-core machine under load, and every
producer waiting for an ack waited that long too. Modules, classes and the parts assembled at start live as
long as the process, so they are collected once and then frozen (`gc.freeze`, CPython's permanent
generation): later full passes walk only what was created since. That first collection takes tens of
milliseconds, so it runs before the broker serves (Broker.start).
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("danube_fast.broker")


def settle(why: str) -> None:
    """Collect what start-up left, then move every object still alive out of the collector's passes, before
    the broker serves (`why` says when, for the log)."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.debug("heap settled after %s: %d objects frozen in %.1f ms", why, gc.get_freeze_count(),
              (time.perf_counter() - started) * 1000)

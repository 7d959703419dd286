"""broker/heap.py: the long-lived objects leave the collector's full passes."""

from __future__ import annotations

import gc

from danube_fast.broker import heap


def test_settle_moves_live_objects_out_of_the_collectors_passes() -> None:
    kept = [[i] for i in range(10_000)]
    walked = len(gc.get_objects())  # what a full collection walks
    try:
        heap.settle("a test")
        assert gc.get_freeze_count() >= len(kept)
        assert len(gc.get_objects()) < walked - len(kept)
        assert kept[-1] == [9_999]
    finally:
        gc.unfreeze()

"""The delay index (broker/dispatch/delays.py): never early, at most a fine bucket late, bounded, and what
it leaves out is named (cut, spill_from) so that the dispatcher can read it again."""

from __future__ import annotations

import random

from danube_fast.broker.dispatch.delays import COARSE_MS, FINE_MS, DelayIndex

T0 = 1_800_000_000_000


def test_released_no_earlier_than_the_time_and_by_the_end_of_its_fine_bucket() -> None:
    index = DelayIndex(1000)
    times = {o: T0 + random.Random(o).randrange(0, 3 * COARSE_MS) for o in range(300)}
    for offset, at in times.items():
        index.add(at, offset)
    released: dict[int, int] = {}
    now = T0
    while len(released) < len(times):
        for offset in index.due(now, 10_000):
            assert offset not in released
            released[offset] = now
        now += FINE_MS // 4
        assert now < T0 + 4 * COARSE_MS
    for offset, at in times.items():
        assert at <= released[offset] <= at + FINE_MS + FINE_MS // 4
    assert len(index) == 0 and index.next_release() is None


def test_due_takes_at_most_the_limit_in_offset_order_and_keeps_the_rest() -> None:
    index = DelayIndex(1000)
    for offset in range(10):
        index.add(T0, offset)
    assert index.due(T0 + FINE_MS, 4) == [0, 1, 2, 3]
    assert len(index) == 6
    assert index.due(T0 + FINE_MS, 100) == [4, 5, 6, 7, 8, 9]


def test_full_it_drops_the_latest_and_says_from_which_time_and_offset() -> None:
    index = DelayIndex(100)
    for offset in range(150):  # offset i due at minute i: the latest are the highest offsets
        index.add(T0 + offset * COARSE_MS, offset)
    assert len(index) <= 100
    assert index.cut is not None and index.spill_from is not None
    held = index.due(T0 + 200 * COARSE_MS, 1000)
    assert held == list(range(len(held)))  # the earliest were kept
    assert all(T0 + o * COARSE_MS < index.cut for o in held)
    assert index.spill_from == len(held)  # every later one is at or above it
    index.add(index.cut + 5, 999)  # at or after the cut: left out, not held
    assert len(index) == 0 and index.spill_from == len(held)
    assert index.take_spill() == (len(held), T0 + len(held) * COARSE_MS)
    assert index.cut is None and index.take_spill() is None


def test_earliest_and_lowest_offset_cover_what_is_held() -> None:
    index = DelayIndex(1000)
    assert index.earliest() is None and index.lowest_offset() is None
    index.add(T0 + 5 * COARSE_MS, 7)
    index.add(T0 + 2 * COARSE_MS + 250, 40)
    index.add(T0 + 9 * COARSE_MS, 3)
    assert index.lowest_offset() == 3
    earliest = index.earliest()
    assert earliest is not None and T0 + 2 * COARSE_MS <= earliest <= T0 + 2 * COARSE_MS + 250
    assert index.next_release() == (T0 + 2 * COARSE_MS + 250) // FINE_MS * FINE_MS + FINE_MS

"""The tail cache (storage/tail_cache.py): each topic's BatchCache is bounded by its own size and, in a
broker, by one CacheBudget for every topic together, the oldest groups going first whichever topic holds them;
and the WALs of a broker share that budget (reads of what it evicted come from the disk, unchanged)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from danube_fast.broker.config import ConfigError, load
from danube_fast.storage import Wal, WalConfig
from danube_fast.storage.tail_cache import BatchCache, CacheBudget, CachedGroup
from tests.storage.test_wal_facade import Run, batch, read_all, seq_of


def group(first: int, size: int, records: int = 1) -> CachedGroup:
    return CachedGroup(first, first + records, bytes(size), [first], [0])


def held(cache: BatchCache) -> list[int]:
    """The first offsets of the groups `cache` holds (by asking find for each offset it could hold)."""
    out = []
    for offset in range(0, 1000):
        found = cache.find(offset)
        if found is not None and found.first == offset:
            out.append(offset)
    return out


def test_a_cache_keeps_its_newest_groups_within_its_bound_and_always_the_newest() -> None:
    cache = BatchCache(250)
    for first in range(0, 10):
        cache.add(group(first, 100))
    assert held(cache) == [8, 9] and cache.nbytes == 200
    cache.add(group(10, 400))  # bigger than the bound alone: kept, alone
    assert held(cache) == [10] and cache.nbytes == 400
    cache.drop_before(11)
    assert held(cache) == [] and cache.nbytes == 0


def test_the_budget_drops_the_oldest_groups_of_any_topic_first() -> None:
    budget = CacheBudget(1000)
    a, b = BatchCache(10_000, budget), BatchCache(10_000, budget)
    for first in range(0, 6):
        a.add(group(first, 100))  # a: 0..5, 600 bytes
    for first in range(0, 4):
        b.add(group(first, 100))  # b: 0..3: 1,000 in all
    assert budget.nbytes == 1000 and held(a) == list(range(6)) and held(b) == list(range(4))
    b.add(group(4, 250))  # 250 over: a's three oldest go (they are the oldest of the broker)
    assert held(a) == [3, 4, 5] and held(b) == [0, 1, 2, 3, 4]
    assert budget.nbytes == a.nbytes + b.nbytes == 950
    a.clear()  # an idle release or a close gives the budget back its bytes
    assert budget.nbytes == b.nbytes == 650
    for first in range(6, 12):
        a.add(group(first, 100))  # b's old groups go now: a's cleared ones are no longer counted
    assert budget.nbytes == a.nbytes + b.nbytes <= 1000
    assert held(a) == list(range(6, 12)) and held(b) == [3, 4]


def test_the_budget_holds_whatever_mix_of_adds_drops_and_clears() -> None:
    rng = random.Random(5)
    budget = CacheBudget(5_000)
    caches = [BatchCache(rng.choice([800, 3_000, 100_000]), budget) for _ in range(4)]
    nexts = [0] * len(caches)
    added: list[tuple[int, int]] = []  # (cache, first) in the order added
    for _ in range(3_000):
        i = rng.randrange(len(caches))
        roll = rng.random()
        if roll < 0.8:
            caches[i].add(group(nexts[i], rng.randint(1, 900)))
            added.append((i, nexts[i]))
            nexts[i] += 1
        elif roll < 0.9:
            caches[i].drop_before(nexts[i] - rng.randint(0, 3))
        else:
            caches[i].clear()
        assert budget.nbytes == sum(c.nbytes for c in caches) <= budget.max_bytes
        # Every cache holds a run of its newest groups: what went, went oldest first.
        for c, n in zip(caches, nexts, strict=True):
            kept = [g for g in range(max(0, n - 40), n) if c.find(g) is not None]
            assert kept == list(range(n - len(kept), n))
    assert len(budget._order) <= 2 * sum(len(c._groups) for c in caches) + 1024  # dropped ones compacted


def test_a_budget_of_zero_keeps_nothing_and_a_negative_one_is_refused() -> None:
    budget = CacheBudget(0)
    cache = BatchCache(1 << 20, budget)
    cache.add(group(0, 10))
    assert cache.find(0) is None and budget.nbytes == cache.nbytes == 0
    with pytest.raises(ValueError):
        CacheBudget(-1)


@pytest.mark.parametrize("name", ["cache_bytes", "cache_total_bytes"])
def test_a_negative_cache_size_in_the_config_is_a_clear_error(tmp_path: Path, name: str) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(f"[wal]\n{name} = -1\n")
    with pytest.raises(ConfigError, match=f"{name} must not be negative"):
        load(str(path), {})


def test_the_wals_of_a_broker_share_one_budget_and_read_what_it_evicted_from_disk(tmp_path: Path,
                                                                                    run: Run) -> None:
    async def main() -> None:
        budget = CacheBudget(4096)
        config = WalConfig(segment_bytes=8192)
        wals: list[Any] = [await Wal.open(tmp_path / name, config, cache_budget=budget) for name in "ab"]
        for i in range(60):
            for wal in wals:
                await wal.append(batch(3 * i, size=64))
        assert 0 < budget.nbytes <= 4096
        assert wals[0]._cache.find(0) is None  # the oldest went first
        assert wals[1]._cache.find(177) is not None  # the newest of the broker is held
        for wal in wals:
            assert [seq_of(r.payload) for r in await read_all(wal)] == list(range(180))
        held_by_b = wals[1]._cache.nbytes
        await wals[0].close()
        assert budget.nbytes == held_by_b  # a closed log's groups leave the budget
        await wals[1].close()
        assert budget.nbytes == 0

    run(main())

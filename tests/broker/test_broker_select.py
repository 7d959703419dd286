"""Who gets the next message: Exclusive/Failover active consumer, Shared round-robin, Key-Shared hash ring."""

from __future__ import annotations

from collections import Counter

import pytest

from danube_fast.broker.consumer import Consumer, compile_filters
from danube_fast.broker.dispatch.select import VIRTUAL_NODES, Selector, fnv1a64, ring_hash
from danube_fast.broker.subscription import Subscription
from danube_fast.meta.resources import SubscriptionType

KEYS = [f"key-{i}" for i in range(3000)]


def consumers(kind: SubscriptionType, *specs: tuple[str, list[str]]) -> list[Consumer]:
    sub = Subscription("/default/t", "s", kind)
    return [Consumer(i + 1, name, sub, filters, 10) for i, (name, filters) in enumerate(specs)]


def named(*names: str, kind: SubscriptionType = SubscriptionType.KEY_SHARED) -> list[Consumer]:
    return consumers(kind, *[(n, []) for n in names])


def active(c: Consumer) -> bool:
    return c.active


def owner(selector: Selector, cs: list[Consumer], key: str) -> str | None:
    c, routable = selector.pick(cs, key, active)
    assert routable == (c is not None)
    return c.name if c is not None else None


# -- hashing ---------------------------------------------------------------------------------------------


def test_fnv1a64_reference_vectors() -> None:
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8


def test_ring_hash_is_fnv1a64_folded_then_murmur3_fmix32() -> None:
    """The placement upstream v0.12 uses (docs/WIRE.md C.10), restated from its definition."""

    def fmix32(h: int) -> int:
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & 0xFFFFFFFF
        return h ^ (h >> 16)

    for text in ["", "a", "key-1", "consumer#99", "ключ"]:
        h64 = fnv1a64(text.encode())
        assert ring_hash(text) == fmix32((h64 ^ (h64 >> 32)) & 0xFFFFFFFF), text


def test_ring_hash_is_32_bit_and_spreads() -> None:
    hashes = [ring_hash(k) for k in KEYS[:1000]]
    assert all(0 <= h < 1 << 32 for h in hashes)
    assert len(set(hashes)) == 1000
    assert 0.4 < sum(h >> 31 for h in hashes) / 1000 < 0.6  # the top bit is used (murmur3 mixing)


# -- Key-Shared ------------------------------------------------------------------------------------------


def test_key_affinity_is_stable_across_calls_and_selectors() -> None:
    cs = named("alpha", "beta", "gamma")
    first = Selector(SubscriptionType.KEY_SHARED)
    owners = [owner(first, cs, k) for k in KEYS[:500]]
    assert [owner(first, cs, k) for k in KEYS[:500]] == owners
    # a fresh selector (another broker, a restart) places keys the same way: by hash, not by history
    fresh = Selector(SubscriptionType.KEY_SHARED)
    assert [owner(fresh, cs, k) for k in KEYS[:500]] == owners
    # ... and so does one that sees the consumers in another order
    reordered = Selector(SubscriptionType.KEY_SHARED)
    assert [owner(reordered, cs[::-1], k) for k in KEYS[:500]] == owners


def test_keys_spread_over_three_consumers() -> None:
    cs = named("alpha", "beta", "gamma")
    selector = Selector(SubscriptionType.KEY_SHARED)
    counts = Counter(owner(selector, cs, k) for k in KEYS)
    assert set(counts) == {"alpha", "beta", "gamma"}
    assert min(counts.values()) > len(KEYS) * 0.2, counts  # an even split would be a third each
    assert VIRTUAL_NODES == 100


def test_losing_a_consumer_moves_only_its_keys() -> None:
    cs = named("alpha", "beta", "gamma")
    selector = Selector(SubscriptionType.KEY_SHARED)
    before = {k: owner(selector, cs, k) for k in KEYS[:1000]}
    cs[2].active = False  # gamma's stream went away
    after = {k: owner(selector, cs, k) for k in KEYS[:1000]}
    assert all(after[k] == before[k] for k in KEYS[:1000] if before[k] != "gamma")
    moved = [after[k] for k in KEYS[:1000] if before[k] == "gamma"]
    assert moved and set(moved) == {"alpha", "beta"}
    # removing it from the list (a rebuilt ring) gives the same placement
    assert {k: owner(selector, cs[:2], k) for k in KEYS[:1000]} == after


def test_key_filters_restrict_the_ring() -> None:
    cs = consumers(SubscriptionType.KEY_SHARED, ("dash", ["a-*"]), ("two", ["?x"]))
    selector = Selector(SubscriptionType.KEY_SHARED)
    assert owner(selector, cs, "a-1") == "dash"
    assert owner(selector, cs, "a-") == "dash"  # * matches nothing too
    assert owner(selector, cs, "a-x") == "dash"
    assert owner(selector, cs, "zx") == "two"
    assert owner(selector, cs, "ax") == "two"
    assert owner(selector, cs, "x") is None  # ? is exactly one character
    assert owner(selector, cs, "zzx") is None
    assert owner(selector, cs, "b-1") is None
    assert selector.pick(cs, "b-1", active) == (None, False)  # accepted by none: not routable


def test_a_filtered_consumer_gets_all_its_keys_even_if_the_ring_points_elsewhere() -> None:
    cs = consumers(SubscriptionType.KEY_SHARED, ("all", []), ("evens", ["*[02468]"]))
    selector = Selector(SubscriptionType.KEY_SHARED)
    counts = Counter(owner(selector, cs, k) for k in KEYS[:1000])
    assert counts["all"] == 1000  # "[02468]" is literal: the glob has no character classes
    cs[0].active = False
    assert owner(selector, cs, "k*[02468]") == "evens"
    # Only the inactive "all" accepts this key: wait for it (routable), do not drop the message.
    assert selector.pick(cs, "key-2", active) == (None, True)


def test_key_owner_without_room_means_wait_not_another_consumer() -> None:
    cs = named("alpha", "beta")
    selector = Selector(SubscriptionType.KEY_SHARED)
    key = next(k for k in KEYS if owner(selector, cs, k) == "alpha")
    assert selector.pick(cs, key, lambda c: c.name != "alpha") == (None, True)


def test_no_consumers_is_not_routable() -> None:
    for kind in SubscriptionType:
        assert Selector(kind).pick([], "k", active) == (None, False)


# -- Shared ----------------------------------------------------------------------------------------------


def test_shared_round_robin() -> None:
    cs = named("a", "b", "c", kind=SubscriptionType.SHARED)
    selector = Selector(SubscriptionType.SHARED)
    assert [owner(selector, cs, "") for _ in range(7)] == ["a", "b", "c", "a", "b", "c", "a"]


def test_shared_skips_consumers_without_room_and_inactive_ones() -> None:
    cs = named("a", "b", "c", "d", kind=SubscriptionType.SHARED)
    cs[3].active = False
    selector = Selector(SubscriptionType.SHARED)
    full = {"b"}

    def room(c: Consumer) -> bool:
        return c.active and c.name not in full

    picks = [selector.pick(cs, "", room)[0] for _ in range(4)]
    assert [c.name if c else None for c in picks] == ["a", "c", "a", "c"]
    full.clear()
    picks = [selector.pick(cs, "", room)[0] for _ in range(3)]
    assert [c.name if c else None for c in picks] == ["a", "b", "c"]


def test_shared_with_every_consumer_full_waits_and_with_none_active_cannot_route() -> None:
    cs = named("a", "b", kind=SubscriptionType.SHARED)
    selector = Selector(SubscriptionType.SHARED)
    assert selector.pick(cs, "", lambda c: False) == (None, True)
    for c in cs:
        c.active = False
    assert selector.pick(cs, "", active) == (None, False)


# -- Exclusive / Failover --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER])
def test_first_active_consumer_owns_the_stream_and_the_next_takes_over(kind: SubscriptionType) -> None:
    cs = named("first", "second", "third", kind=kind)
    selector = Selector(kind)
    assert [owner(selector, cs, "") for _ in range(3)] == ["first"] * 3
    cs[0].active = False
    assert owner(selector, cs, "") == "second"  # real failover (v0.7.3 never promotes, docs/WIRE.md C.7)
    cs[1].active = False
    assert owner(selector, cs, "") == "third"
    cs[0].active = True
    assert owner(selector, cs, "") == "first"  # attach order decides
    assert selector.active(cs) is cs[0]


@pytest.mark.parametrize("kind", [SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER])
def test_active_consumer_without_room_means_wait(kind: SubscriptionType) -> None:
    cs = named("first", "second", kind=kind)
    selector = Selector(kind)
    assert selector.pick(cs, "", lambda c: c.name != "first") == (None, True)  # not handed to a standby
    for c in cs:
        c.active = False
    assert selector.pick(cs, "", active) == (None, False)
    assert selector.active(cs) is None


# -- key filter globs ------------------------------------------------------------------------------------


def test_compile_filters() -> None:
    assert compile_filters([]) is None
    f = compile_filters(["a-*", "?x", "lit.e[r]al+"])
    assert f is not None

    def accepts(key: str) -> bool:
        return f.match(key) is not None

    assert accepts("a-") and accepts("a-anything") and accepts("a-\nline")
    assert not accepts("ba-1") and not accepts("A-1")
    assert accepts("zx") and accepts("\nx") and not accepts("x") and not accepts("zzx") and not accepts("zxz")
    assert accepts("lit.e[r]al+")
    assert not accepts("litxe[r]al+") and not accepts("litrall") and not accepts("lit.eral+")


def test_consumer_accepts() -> None:
    any_key, star, prefix = consumers(SubscriptionType.KEY_SHARED, ("any", []), ("star", ["*"]),
                                      ("prefix", ["eu-*", "us-?"]))
    for key in ["", "x", "eu-west", "us-1"]:
        assert any_key.accepts(key) and star.accepts(key)
    assert prefix.accepts("eu-west") and prefix.accepts("eu-") and prefix.accepts("us-1")
    assert not prefix.accepts("us-12") and not prefix.accepts("us-") and not prefix.accepts("") \
        and not prefix.accepts("asia-1")

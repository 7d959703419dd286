"""Which consumer of a subscription gets the next message, for each subscription type.

- Exclusive and Failover: the active consumer is the first one, in attach order, whose stream is active;
  when it goes, the next one takes over (real failover, unlike v0.7.3 which never promotes: docs/WIRE.md C.7).
- Shared: round-robin over the consumers that can take a message.
- Key-Shared: a consistent-hash ring (100 virtual nodes per consumer name, FNV-1a-64 folded to 32 bits and
  mixed with murmur3's finaliser, as upstream v0.12) restricted to the consumers whose `key_filters` accept
  the key; a key no consumer accepts has no consumer (the caller drops it).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from danube_fast.broker.consumer import Consumer
from danube_fast.meta.resources import SubscriptionType

VIRTUAL_NODES = 100
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_M64 = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _M64
    return h


def ring_hash(text: str) -> int:
    h = fnv1a64(text.encode("utf-8"))
    h = (h ^ (h >> 32)) & 0xFFFFFFFF
    h ^= h >> 16  # murmur3 fmix32
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


class Selector:
    """Chooses a consumer; `usable` says whether a consumer may take a message now (active, window room)."""

    def __init__(self, kind: SubscriptionType) -> None:
        self.kind = kind
        self._next = 0
        self._ring: list[tuple[int, int]] = []  # (hash, index into the consumer list it was built from)
        self._ring_of: list[int] = []  # ids of the consumers the ring was built from, in order

    def active(self, consumers: Sequence[Consumer]) -> Consumer | None:
        """Exclusive / Failover: the consumer that owns the subscription's stream of messages now."""
        for c in consumers:
            if c.active:
                return c
        return None

    def pick(self, consumers: Sequence[Consumer], key: str, usable: Callable[[Consumer], bool]
             ) -> tuple[Consumer | None, bool]:
        """(consumer, routable): `routable` False means no consumer of the subscription takes this message
        now or when it reconnects (no consumer at all, no active one for Exclusive/Failover/Shared, or a key
        no consumer's filters accept); a None consumer with routable True means wait."""
        if not consumers:
            return None, False
        if self.kind in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER):
            c = self.active(consumers)
            if c is None:
                return None, False
            return (c if usable(c) else None), True
        if self.kind == SubscriptionType.SHARED:
            n = len(consumers)
            any_active = False
            for i in range(n):
                c = consumers[(self._next + i) % n]
                any_active = any_active or c.active
                if usable(c):
                    self._next = (self._next + i + 1) % n
                    return c, True
            return None, any_active
        return self._by_key(consumers, key, usable)

    def _by_key(self, consumers: Sequence[Consumer], key: str, usable: Callable[[Consumer], bool]
                ) -> tuple[Consumer | None, bool]:
        ids = [c.id for c in consumers]
        if ids != self._ring_of:
            self._build(consumers)
        accepting = [c.accepts(key) for c in consumers]
        if not any(accepting):
            return None, False  # no consumer, connected or not, takes this key
        eligible = [a and c.active for a, c in zip(accepting, consumers, strict=True)]
        if not any(eligible):
            return None, True  # its consumers are away: wait for them
        start = bisect.bisect_left(self._ring, (ring_hash(key), -1))
        size = len(self._ring)
        for i in range(size):
            _, index = self._ring[(start + i) % size]
            if eligible[index]:
                c = consumers[index]
                return (c if usable(c) else None), True
        return None, False

    def _build(self, consumers: Sequence[Consumer]) -> None:
        ring = [(ring_hash(f"{c.name}#{v}"), i)
                for i, c in enumerate(consumers) for v in range(VIRTUAL_NODES)]
        ring.sort()
        self._ring = ring
        self._ring_of = [c.id for c in consumers]

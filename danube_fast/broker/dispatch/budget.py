"""The broker's byte budget for delivery ([dispatch] broker_bytes), shared by every dispatcher.

What counts, in bytes of records (their share of their batch in the WAL) or, NonReliable, of payloads:
- Reliable, Danube API: from the WAL read until the message is acknowledged, dead-lettered or dropped (no
  consumer's key filter accepts it), or the dispatcher closes. That covers read-ahead, messages queued for a
  stream, delivered and unacknowledged, and waiting for redelivery: all of it is held in memory.
- Reliable, fast API: what was sent and not acknowledged, released by acks, a nack (delivery goes back, the
  bytes are read again) and the stream's end; and the one read ahead of a subscription behind the tail
  (read_ahead.py: the size it asked) until its delivery takes it or it is dropped.
- NonReliable: messages queued for a consumer's stream until the stream takes them (or the stream goes).

Beyond the budget, Reliable dispatch reads nothing more from the WAL (the data waits there) and NonReliable
dispatch drops, counted per subscription as when a consumer's buffer is full. A Reliable subscription that
holds nothing may still read once, and a NonReliable consumer whose buffer is empty may still take one
message, so that a few stalled consumers slow everybody else down instead of stopping them for as long as
they stall; the bound is then the budget plus one read per Reliable subscription and one message per
NonReliable consumer.

Ownership: the event loop. Dispatchers `take` and `give`; one blocked on the budget asks to be woken by
`wait` and is, once bytes were given back and the budget has room again.
"""

from __future__ import annotations

from collections.abc import Callable


class ByteBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held = 0
        self._waiting: dict[Callable[[], None], None] = {}  # wake-ups, in the order they asked

    @property
    def held(self) -> int:
        return self._held

    @property
    def spent(self) -> bool:
        return self._held >= self.limit

    def room_for(self, size: int) -> bool:
        return self._held + size <= self.limit

    def take(self, size: int) -> None:
        self._held += size

    def give(self, size: int) -> None:
        self._held -= size
        if self._waiting and self._held < self.limit:
            waiting, self._waiting = self._waiting, {}
            for wake in waiting:
                wake()

    def wait(self, wake: Callable[[], None]) -> None:
        """Call `wake` (once) the next time bytes are given back and the budget has room."""
        self._waiting[wake] = None

    def forget(self, wake: Callable[[], None]) -> None:
        self._waiting.pop(wake, None)

"""What every dispatcher does, whichever way it delivers: the Subscription and the services hold a
`Dispatcher` and never ask which kind it is.

Three kinds implement it: LiveDispatcher (a NonReliable topic: messages handed on as they are published,
nothing stored), ReliableDispatcher (a Reliable topic served per message to Danube API consumers) and
BatchDispatcher (a Reliable topic served by whole batches to one fast-API stream). Which one a subscription
gets is the topic's decision (topic.py), and switching between the last two is the subscriptions'
(subscriptions.py).
"""

from __future__ import annotations

from typing import Protocol

from danube_fast.broker.consumer import Consumer


class Dispatcher(Protocol):
    kind: str  # live | per_message | batches: for describing a subscription, never for branching on

    def notify(self) -> None:
        """The topic's log grew."""

    def consumer_changed(self) -> None:
        """A consumer joined or its stream started."""

    def consumer_lost(self, consumer: Consumer) -> None:
        """`consumer`'s stream ended: what it held is delivered again (at least once) or dropped (live)."""

    def stream_replaced(self, consumer: Consumer) -> None:
        """A new stream of `consumer` took over (docs/WIRE.md C.8)."""

    def taken(self, size: int) -> None:
        """A stream took `size` bytes of what was queued for it."""

    def ack(self, offset: int) -> bool: ...

    def nack(self, offset: int, delay_ms: int | None) -> bool: ...

    @property
    def backlog(self) -> int: ...

    @property
    def held_bytes(self) -> int: ...

    def counters(self) -> dict[str, int]:
        """What this kind counts, by metric (metrics.py names the families): only counters that mean
        something for it."""

    def stop_streams(self) -> None:
        """The broker is stopping."""

    async def close(self, *, save: bool = True) -> None: ...

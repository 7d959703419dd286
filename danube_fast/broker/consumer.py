"""A consumer session: the messages on their way to one client stream, and whether a stream is attached.

Ownership: the subscription's dispatcher pushes messages, with their size in bytes, and keeps the counts of
what is in flight; the ReceiveMessages handler that holds the current stream token takes them, and the
dispatcher hears how many bytes it took (`taken`). A new stream for the same consumer takes over and the
old one ends with OK (docs/WIRE.md C.8); so does every stream when the consumer is removed, which is what
makes the official client notice a health-check CLOSE (B.8, D.8).
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from typing import Protocol

from danube_fast.proto import DanubeApi_pb2 as pb


class Home(Protocol):
    """What a consumer session and its stream handlers tell the subscription it belongs to
    (broker/subscription.py; a protocol so that the subscription may import this module and not back)."""

    topic_name: str  # "/namespace/topic"

    def taken(self, messages: int, size: int) -> None:
        """A stream took `messages` queued messages of `size` bytes."""
        ...

    def stream_started(self, consumer: Consumer) -> None: ...

    def stream_replaced(self, consumer: Consumer) -> None: ...

    def stream_ended(self, consumer: Consumer) -> None: ...

    def remove(self, consumer: Consumer) -> None: ...


def compile_filters(patterns: list[str]) -> re.Pattern[str] | None:
    """Key-Shared `key_filters`: globs with `*` and `?`, every other character literal (fnmatch would also
    read `[...]`); no filters accept every key."""
    if not patterns:
        return None
    parts = []
    for p in patterns:
        parts.append("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in p))
    return re.compile("(?s:" + "|".join(f"(?:{p})" for p in parts) + r")\Z")


class Consumer:
    def __init__(self, consumer_id: int, name: str, subscription: Home, key_filters: list[str],
                 window: int) -> None:
        self.id = consumer_id
        self.name = name
        self.subscription = subscription
        self._key_filters = list(key_filters)
        self._filter = compile_filters(self._key_filters)
        self.window = window  # reliable: unacknowledged deliveries allowed
        # Reliable: delivered (or queued) and not yet acked or nacked, and their bytes. Changed only through
        # deliver / settled / settled_all, which the ReliableDispatcher calls.
        self._inflight = 0
        self._inflight_bytes = 0
        self.active = True  # a new consumer starts active: messages may queue before its stream opens (C.7)
        self.removed = False
        self._queue: deque[pb.StreamMessage] = deque()
        self._sizes: deque[int] = deque()  # of the queued messages, in bytes
        self.queued_bytes = 0
        self._wakeup = asyncio.Event()
        self._stream = 0  # token of the attached stream (0: none)
        self._next_token = 0
        self.delivered = 0

    @property
    def key_filters(self) -> list[str]:
        return list(self._key_filters)

    @key_filters.setter
    def key_filters(self, patterns: list[str]) -> None:
        self._key_filters = list(patterns)
        self._filter = compile_filters(self._key_filters)

    def accepts(self, key: str) -> bool:
        return self._filter is None or self._filter.match(key) is not None

    @property
    def has_room(self) -> bool:
        return self.active and self._inflight < self.window

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def inflight_bytes(self) -> int:
        return self._inflight_bytes

    def deliver(self, msg: pb.StreamMessage, size: int) -> None:
        """A Reliable delivery: queued, and in flight until `settled` (acked, nacked or timed out)."""
        self._inflight += 1
        self._inflight_bytes += size
        self.push(msg, size)

    def settled(self, size: int) -> None:
        """One delivery of `size` bytes is no longer in flight for this consumer."""
        self._inflight -= 1
        self._inflight_bytes -= size

    def settled_all(self) -> None:
        """The consumer lost its stream: nothing is in flight for it any more (its dispatcher takes
        every delivery back)."""
        self._inflight = 0
        self._inflight_bytes = 0

    @property
    def queued(self) -> int:
        return len(self._queue)

    def push(self, msg: pb.StreamMessage, size: int = 0) -> None:
        """Queue `msg`, holding `size` bytes of the dispatcher's until the stream takes it."""
        self._queue.append(msg)
        self._sizes.append(size)
        self.queued_bytes += size
        self._wakeup.set()

    def drain_queue(self) -> list[pb.StreamMessage]:
        """Take back what was queued and not yet written (the stream went away); `queued_bytes` of them."""
        out = list(self._queue)
        self._queue.clear()
        self._sizes.clear()
        self.queued_bytes = 0
        return out

    # -- streams ---------------------------------------------------------------------------------------

    def attach(self) -> int:
        """A ReceiveMessages stream starts; any previous stream of this consumer ends."""
        self._next_token += 1
        self._stream = self._next_token
        self.active = True
        self._wakeup.set()
        return self._stream

    @property
    def generation(self) -> int:
        """Changes whenever a stream attaches or is taken over."""
        return self._next_token

    @property
    def streaming(self) -> bool:
        return self._stream != 0

    def is_current(self, token: int) -> bool:
        return self._stream == token and not self.removed

    def detach(self, token: int) -> bool:
        """The stream with `token` ended; True if it was the current one (the consumer is now inactive)."""
        if self._stream != token:
            return False
        self._stream = 0
        self.active = False
        return True

    def resubscribed(self) -> None:
        """Subscribe again under the same name: the stream it has ends, and it is active again, waiting for
        its next stream (messages may queue for it meanwhile, C.7)."""
        self.detach(self.attach())
        self.active = True

    def went_quiet(self, generation: int) -> bool:
        """Subscribed (at `generation`) but no stream ever opened: it stops being active (it must not hold an
        Exclusive or Failover subscription for ever). False if a stream came, or it is gone anyway."""
        if self._next_token != generation or self.streaming or not self.active or self.removed:
            return False
        self.active = False
        return True

    def end_streams(self) -> None:
        self.removed = True
        self.active = False
        self._wakeup.set()

    async def take(self, token: int, limit: int = 256) -> list[pb.StreamMessage]:
        """Queued messages for the stream `token`, waiting for some; [] when that stream must end."""
        while True:
            if not self.is_current(token):
                return []
            if self._queue:
                n = min(limit, len(self._queue))
                queue, sizes = self._queue, self._sizes
                out = [queue.popleft() for _ in range(n)]
                size = sum([sizes.popleft() for _ in range(n)])
                self.queued_bytes -= size
                self.delivered += n
                self.subscription.taken(n, size)
                return out
            self._wakeup.clear()
            await self._wakeup.wait()

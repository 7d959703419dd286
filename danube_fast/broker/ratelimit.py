"""Policy rates (`max_publish_rate`, `max_subscription_dispatch_rate`, messages per second, 0 = unlimited).

A rate limit slows the caller down instead of failing it: a refusal would have to be a non-retriable status
(docs/WIRE.md D.7), which would surface a passing condition to the application as a permanent error.
"""

from __future__ import annotations

import asyncio
import time


class RateLimiter:
    """A token bucket holding up to one second of tokens."""

    def __init__(self, per_second: int) -> None:
        self.per_second = per_second
        self._tokens = float(per_second)
        self._stamp = time.monotonic()

    def delay(self, n: int = 1) -> float:
        """Take `n` tokens; the seconds to wait before acting on them (0 when within the rate)."""
        if not self.per_second:
            return 0.0
        now = time.monotonic()
        self._tokens = min(float(self.per_second), self._tokens + (now - self._stamp) * self.per_second)
        self._stamp = now
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.per_second

    async def acquire(self, n: int = 1) -> None:
        wait = self.delay(n)
        if wait > 0:
            await asyncio.sleep(wait)

"""The broker's recent history: messages and bytes in and out over the last hour, and each served topic's
current rates, answered by BrokerStats (services/stats.py) for the web console's charts (docs/CONSOLE.md)
without a Prometheus.

A task samples the counters the topics and subscriptions already keep every `period` seconds and keeps one
hour of samples (360 of 10 s): four integers a sample, a few kilobytes in all, whatever the topic count.
A topic's rate is the difference between its last two samples; a topic that went (deleted, moved) leaves
the totals' next difference short, never negative: a total that went down is counted from zero.

Owner: the sampling task (`start`, `close`); readers take `points()` and `rates`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass

from danube_fast.broker.topic_registry import TopicRegistry

PERIOD_S = 10.0
KEPT_S = 3600.0


@dataclass(frozen=True)
class Totals:
    messages_in: int = 0
    bytes_in: int = 0
    messages_out: int = 0
    bytes_out: int = 0


@dataclass(frozen=True)
class Point:
    """Rates per second over the period ending at `time` (seconds since the epoch)."""
    time: float
    messages_in: float
    bytes_in: float
    messages_out: float
    bytes_out: float


@dataclass(frozen=True)
class TopicRates:
    messages_in: float = 0.0
    bytes_in: float = 0.0
    messages_out: float = 0.0


def _per_second(now: int, before: int, seconds: float) -> float:
    return max(0, now - before) / seconds if seconds > 0 else 0.0


class History:
    def __init__(self, topics: TopicRegistry, period: float = PERIOD_S, kept: float = KEPT_S) -> None:
        self._topics = topics
        self.period = period
        self._points: deque[Point] = deque(maxlen=max(1, int(kept / period)))
        self._last: tuple[float, Totals] | None = None
        self._last_topics: dict[str, tuple[int, int, int]] = {}
        self.rates: dict[str, TopicRates] = {}  # stored topic -> its rates over the last period
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="history")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def points(self) -> list[Point]:
        return list(self._points)

    def totals(self) -> Totals:
        """The counters of the topics served now, over their lives here."""
        m_in = b_in = m_out = b_out = 0
        for t in self._topics.served():
            m_in += t.messages_in
            b_in += t.bytes_in
            for s in t.subscriptions.values():
                m_out += s.delivered
                b_out += s.delivered_bytes
        return Totals(m_in, b_in, m_out, b_out)

    def sample(self) -> None:
        now = time.time()
        totals = self.totals()
        if self._last is not None:
            then, before = self._last
            seconds = now - then
            self._points.append(Point(
                now, _per_second(totals.messages_in, before.messages_in, seconds),
                _per_second(totals.bytes_in, before.bytes_in, seconds),
                _per_second(totals.messages_out, before.messages_out, seconds),
                _per_second(totals.bytes_out, before.bytes_out, seconds)))
        topics: dict[str, tuple[int, int, int]] = {}
        rates: dict[str, TopicRates] = {}
        seconds = now - self._last[0] if self._last is not None else 0.0
        for t in self._topics.served():
            counts = (t.messages_in, t.bytes_in, sum(s.delivered for s in t.subscriptions.values()))
            topics[t.full] = counts
            before_t = self._last_topics.get(t.full)
            if before_t is not None:
                rates[t.full] = TopicRates(*(_per_second(c, b, seconds) for c, b in zip(counts, before_t,
                                                                                      strict=True)))
        self._last = (now, totals)
        self._last_topics, self.rates = topics, rates

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            self.sample()

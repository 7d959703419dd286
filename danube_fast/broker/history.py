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
from collections.abc import Iterable
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


def _rates(now: Totals, before: Totals, seconds: float) -> tuple[float, float, float, float]:
    return (_per_second(now.messages_in, before.messages_in, seconds),
            _per_second(now.bytes_in, before.bytes_in, seconds),
            _per_second(now.messages_out, before.messages_out, seconds),
            _per_second(now.bytes_out, before.bytes_out, seconds))


def _sum(counts: Iterable[Totals]) -> Totals:
    m_in = b_in = m_out = b_out = 0
    for c in counts:
        m_in, b_in = m_in + c.messages_in, b_in + c.bytes_in
        m_out, b_out = m_out + c.messages_out, b_out + c.bytes_out
    return Totals(m_in, b_in, m_out, b_out)


class History:
    def __init__(self, topics: TopicRegistry, period: float = PERIOD_S, kept: float = KEPT_S) -> None:
        self._topics = topics
        self.period = period
        self._points: deque[Point] = deque(maxlen=max(1, int(kept / period)))
        self._last: tuple[float, Totals] | None = None
        self._last_topics: dict[str, Totals] = {}
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

    def _counts(self) -> dict[str, Totals]:
        """Each served topic's counters, over its life here (messages and bytes in, and out to every
        subscription)."""
        out = {}
        for t in self._topics.served():
            subs = t.subscriptions.values()
            out[t.full] = Totals(t.messages_in, t.bytes_in, sum(s.delivered for s in subs),
                                 sum(s.delivered_bytes for s in subs))
        return out

    def totals(self) -> Totals:
        """The counters of the topics served now, over their lives here."""
        return _sum(self._counts().values())

    def sample(self) -> None:
        now = time.time()
        counts = self._counts()
        totals = _sum(counts.values())
        rates: dict[str, TopicRates] = {}
        if self._last is not None:
            then, before = self._last
            seconds = now - then
            self._points.append(Point(now, *_rates(totals, before, seconds)))
            for name, c in counts.items():
                was = self._last_topics.get(name)
                if was is not None:
                    m_in, b_in, m_out, _ = _rates(c, was, seconds)
                    rates[name] = TopicRates(m_in, b_in, m_out)
        self._last = (now, totals)
        self._last_topics, self.rates = counts, rates

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            self.sample()

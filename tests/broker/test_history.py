"""The broker's recent history (broker/history.py): rates over each period from the topics' own counters,
per topic and in all, and a counter that went down (a topic gone) counted from zero, never negative."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from danube_fast.broker import history as history_module
from danube_fast.broker.history import History, Totals


class Served:
    def __init__(self) -> None:
        self.topics: list[Any] = []

    def served(self) -> list[Any]:
        return self.topics


def topic(name: str, m_in: int, b_in: int, *delivered: tuple[int, int]) -> Any:
    subs = {f"s{i}": SimpleNamespace(delivered=m, delivered_bytes=b) for i, (m, b) in enumerate(delivered)}
    return SimpleNamespace(full=name, messages_in=m_in, bytes_in=b_in, subscriptions=subs)


def test_rates_per_topic_and_in_all(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(history_module.time, "time", lambda: now[0])
    served = Served()
    h = History(served, period=10, kept=30)  # type: ignore[arg-type]
    served.topics = [topic("/a/x", 10, 100, (5, 50)), topic("/a/y", 0, 0)]
    h.sample()
    assert h.points() == [] and h.rates == {}
    now[0] += 10
    served.topics = [topic("/a/x", 110, 1100, (55, 550), (20, 200)), topic("/a/y", 50, 500)]
    h.sample()
    (p,) = h.points()
    assert (p.messages_in, p.bytes_in, p.messages_out, p.bytes_out) == (15.0, 150.0, 7.0, 70.0)
    assert h.rates["/a/x"].messages_in == 10.0 and h.rates["/a/x"].messages_out == 7.0
    assert h.rates["/a/y"].bytes_in == 50.0
    assert h.totals() == Totals(160, 1600, 75, 750)
    now[0] += 10
    served.topics = [topic("/a/y", 60, 600)]  # /a/x went: the totals fell
    h.sample()
    assert h.points()[-1].messages_in == 0.0 and set(h.rates) == {"/a/y"}
    for _ in range(5):
        now[0] += 10
        h.sample()
    assert len(h.points()) == 3  # one hour is kept: here, 30 s

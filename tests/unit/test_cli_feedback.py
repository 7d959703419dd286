"""The CLI's feedback (danube_fast/cli/feedback.py): drawn on a terminal only, and a wait returns (or raises)
what its work does."""

from __future__ import annotations

import asyncio
import io

import pytest

from danube_fast.cli import feedback


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_draws_on_a_terminal_and_nowhere_else(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    shown = feedback.bar(10, "rec")
    shown.update(4)
    shown.close()
    assert "/10.0 [" in terminal.getvalue() and "rec/s" in terminal.getvalue()  # redrawn at most each 0.1 s
    pipe = io.StringIO()
    monkeypatch.setattr("sys.stderr", pipe)
    shown = feedback.bar(10, "rec")
    shown.update(4)
    shown.close()
    assert pipe.getvalue() == ""


def test_waiting_returns_or_raises_what_the_work_does(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setattr(feedback, "TICK", 0.01)

    async def work(fail: bool) -> int:
        await asyncio.sleep(0.05)
        if fail:
            raise RuntimeError("broken")
        return 7

    assert asyncio.run(feedback.waiting("moving", work(False))) == 7
    assert "moving: 00:00" in terminal.getvalue()
    with pytest.raises(RuntimeError, match="broken"):
        asyncio.run(feedback.waiting("moving", work(True)))

"""The console's sessions end when idle, when too old, when their token expires, at sign-out, and the oldest
goes first when too many are open (console/sessions.py); the console refuses certificate-only security."""

from __future__ import annotations

import time

import pytest

from danube_fast.broker.config import BrokerConfig
from danube_fast.console.build import ConsoleConfigError, build_console
from danube_fast.console.sessions import Sessions
from danube_fast.security.config import SecurityConfig


def test_a_session_ends_idle_old_expired_or_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    sessions = Sessions(idle_s=10, max_s=25)
    s = sessions.open("t", "alice")
    assert sessions.get(s.id) is s and s.csrf_ok(s.csrf) and not s.csrf_ok("other") and not s.csrf_ok(None)
    clock[0] += 9
    assert sessions.get(s.id) is s  # used: idle counts from now
    clock[0] += 9
    assert sessions.get(s.id) is s
    clock[0] += 8  # 26 s after it began: too old, however busy
    assert sessions.get(s.id) is None
    idle = sessions.open("t", "bob")
    clock[0] += 11
    assert sessions.get(idle.id) is None
    expired = sessions.open("t", "carol", token_expires=time.time() - 1)
    assert sessions.get(expired.id) is None
    closed = sessions.open(None, "anonymous")
    sessions.close(closed.id)
    assert sessions.get(closed.id) is None and sessions.get(None) is None and sessions.get("forged") is None


def test_the_oldest_session_goes_when_too_many_are_open() -> None:
    sessions = Sessions(max_sessions=2)
    first, second = sessions.open(None, "a"), sessions.open(None, "b")
    sessions.get(first.id)  # used last: the second is now the oldest
    third = sessions.open(None, "c")
    assert len(sessions) == 2 and sessions.get(second.id) is None
    assert sessions.get(first.id) is first and sessions.get(third.id) is third


def test_a_console_cannot_act_for_certificate_only_users() -> None:
    config = BrokerConfig(security=SecurityConfig(mode="tls", verify_client=True, cert_file="c", key_file="k",
                                                  ca_file="ca"))
    with pytest.raises(ConsoleConfigError, match="tls_jwt"):
        build_console(config, 1, None)  # type: ignore[arg-type]

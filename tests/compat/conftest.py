"""Fixtures of the compatibility suite: a real broker subprocess on free loopback ports.

* `broker`: one broker per test module, shared by its tests (each test uses its own topic names, see `topic`).
  A module may set `BROKER_CONFIG = "...toml..."` for its shared broker. The broker must be alive when a test
  starts and still alive when it ends.
* `broker_factory`: brokers of the test's own (for restarts, kills and special configs), killed at teardown.

When a test fails, the tail of each of its brokers' logs is added to the report.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Generator

import pytest
from broker_fixtures import broker, broker_factory, shared_broker
from compat_support import Broker, BrokerFactory

__all__ = ["broker", "broker_factory", "shared_broker"]  # fixtures, shared with tests/spark


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name in /default unique to this test: its node name made a valid topic name, plus a hash of the
    original when characters had to be replaced (`[a.b]` and `[a b]` must not meet)."""
    name: str = request.node.name
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:150]
    if safe != name:
        safe += "-" + hashlib.blake2s(name.encode()).hexdigest()[:8]
    return "/default/" + safe


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
        None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        brokers: list[Broker] = []
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, Broker):
                brokers.append(value)
            elif isinstance(value, BrokerFactory):
                brokers.extend(value.brokers)
        for b in dict.fromkeys(brokers):
            report.sections.append((f"broker log ({b.log_path})", b.log_tail()))
    return report

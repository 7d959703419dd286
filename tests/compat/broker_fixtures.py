"""The broker fixtures of the suites that drive broker processes (tests/compat, tests/spark): import them
into a conftest.

* `shared_broker` / `broker`: one broker per test module, shared by its tests (each test uses its own topic
  names). A module may set `BROKER_CONFIG = "...toml..."` for it. The broker must be alive when a test starts
  and still alive when it ends.
* `broker_factory`: brokers of the test's own (for restarts, kills and special configs), killed at teardown.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from compat_support import Broker, BrokerFactory


@pytest.fixture(scope="module")
def shared_broker(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    broker = Broker(tmp_path_factory.mktemp("broker"), getattr(request.module, "BROKER_CONFIG", None))
    try:
        broker.start()
        yield broker
    finally:
        broker.close()


@pytest.fixture
def broker(shared_broker: Broker) -> Iterator[Broker]:
    assert shared_broker.running, f"the module's broker died before this test:\n{shared_broker.log_tail()}"
    yield shared_broker
    assert shared_broker.running, f"the broker died during this test:\n{shared_broker.log_tail()}"


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[BrokerFactory]:
    factory = BrokerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()

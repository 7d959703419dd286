"""Fixtures of the compatibility suite. The broker fixtures (`broker`, `shared_broker`, `broker_factory`) are
the harness plugin's (danube_fast/testing/plugin.py); each test uses its own topic names (`topic`)."""

from __future__ import annotations

import hashlib
import re

import pytest


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name in /default unique to this test: its node name made a valid topic name, plus a hash of the
    original when characters had to be replaced (`[a.b]` and `[a b]` must not meet)."""
    name: str = request.node.name
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:150]
    if safe != name:
        safe += "-" + hashlib.blake2s(name.encode()).hexdigest()[:8]
    return "/default/" + safe


"""The harness's pytest plugin (danube_fast/testing/plugin.py: `run`, etcd, moto, brokers, cluster), and the
record-batch codec fixture."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

pytest_plugins = ["danube_fast.testing.plugin"]

FRAMES_MODULES = {"native": "danube_fast.codec._frames", "pure": "danube_fast.codec._frames_py"}


@pytest.fixture(scope="session", params=sorted(FRAMES_MODULES))
def frames_impl(request: pytest.FixtureRequest) -> ModuleType:
    """The record-batch codec under test: the Cython module or its pure-Python twin (ids `native`, `pure`).

    Session-scoped so that hypothesis tests may use it (a module holds no per-test state).
    """
    return importlib.import_module(FRAMES_MODULES[request.param])

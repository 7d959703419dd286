"""Fixtures shared by every test directory."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from types import ModuleType
from typing import Any, TypeVar

import pytest
import uvloop

T = TypeVar("T")

FRAMES_MODULES = {"native": "danube_fast._frames", "pure": "danube_fast._frames_py"}


@pytest.fixture(scope="session", params=sorted(FRAMES_MODULES))
def frames_impl(request: pytest.FixtureRequest) -> ModuleType:
    """The record-batch codec under test: the Cython module or its pure-Python twin (ids `native`, `pure`).

    Session-scoped so that hypothesis tests may use it (a module holds no per-test state).
    """
    return importlib.import_module(FRAMES_MODULES[request.param])


LOOPS = ["asyncio", "uvloop"]


@pytest.fixture(params=LOOPS)
def run(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """Run a coroutine on a fresh asyncio or uvloop loop, with a timeout; an exception the loop only logs
    (a failed callback, a never-retrieved task exception) fails the test."""

    def runner(coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        loop = uvloop.new_event_loop() if request.param == "uvloop" else asyncio.new_event_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        try:
            return loop.run_until_complete(asyncio.wait_for(coro, timeout))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
            assert not errors, f"the event loop reported unhandled errors: {errors}"

    return runner

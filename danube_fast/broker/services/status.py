"""From the error tree to gRPC statuses: every DanubeError carries the code the contract prescribes."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc

from danube_fast.broker.services.wire_guard import throttled
from danube_fast.errors import DanubeError
from danube_fast.names import clip

Req = TypeVar("Req")
Resp = TypeVar("Resp")
S = TypeVar("S")
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


def unary(fn: Callable[[S, Req, Context], Awaitable[Resp]]
          ) -> Callable[[S, Req, Context], Awaitable[Resp]]:
    """Answer a DanubeError with its status and message; anything else is a bug: INTERNAL, and logged with
    its traceback (at most once per wire_guard.LOG_INTERVAL per method: a client repeating the call that
    trips it must not flood the log)."""

    @functools.wraps(fn)
    async def handler(self: S, request: Req, context: Context) -> Resp:
        try:
            return await fn(self, request, context)
        except DanubeError as e:
            await context.abort(grpc.StatusCode[e.grpc_code], str(e))
        except (grpc.aio.AbortError, grpc.aio.BaseError):
            raise
        except Exception as e:
            throttled(fn.__qualname__ + ":bug", logging.ERROR, f"{fn.__qualname__} failed", exc_info=True)
            await context.abort(grpc.StatusCode.INTERNAL, f"{fn.__name__} failed: {clip(repr(e))}")
        raise AssertionError("unreachable: abort raises")

    return handler

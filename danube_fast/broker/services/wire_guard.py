"""How every RPC reaches its servicer: a malformed or truncated request gets INVALID_ARGUMENT and one short,
rate-limited log line, every call ends with a status, and the servers carry limits a client cannot exhaust.

grpc.aio (1.85) leaves two holes that a hostile or broken client can open at will:
- a request that does not parse is answered UNKNOWN ("Unexpected DecodeError") and logs a full traceback per
  call, so a loop of bad calls floods the log;
- a unary call whose request stream ends without a message (the client half-closes at once) is never
  answered: grpc returns without sending a status, and the call hangs until the client's deadline.

The method's cardinality is not on the wire (a unary request is an HTTP/2 stream carrying one message), so
each method is registered here with raw bytes in and its request read as a stream: unary methods take
exactly one message from it, and this module decodes every message itself. The generated
`add_*Servicer_to_server` functions are given a stand-in for the server (`register`), which wraps their
method handlers before they reach the real one: no interceptor, so nothing is added to a call's path
beyond the decode that grpc would have done anyway.

With security on (danube_fast/security/gate.py), every call's first request also passes the gate here, before
the servicer sees it: UNAUTHENTICATED or PERMISSION_DENIED end the call with nothing done.

A DanubeError escaping a streaming handler is answered with its status (the unary handlers map theirs in
services/status.py); anything else is a bug: INTERNAL, logged with its traceback at most once per
LOG_INTERVAL per method.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from danube_fast.errors import DanubeError, invalid
from danube_fast.names import clip
from danube_fast.security.gate import Gate

log = logging.getLogger("danube_fast.api")

LOG_INTERVAL = 10.0  # seconds between two log lines about bad requests (or failures) of one method

# Limits of the client and admin servers (README, "Operations"). A connection carries at most
# MAX_CONCURRENT_STREAMS calls at once; one with no call for IDLE_MS is closed; after MAX_AGE_MS a connection
# is asked to go away (GOAWAY: its open streams carry on, new calls go to a new connection, so a consumer's
# long stream is not cut); the server pings a silent client every KEEPALIVE_MS and drops it without an answer
# in KEEPALIVE_TIMEOUT_MS (a crashed client host leaves no FIN); a client may ping every MIN_PING_MS, more
# often is a strike; request headers are at most MAX_METADATA_BYTES.
MAX_CONCURRENT_STREAMS = 1024
IDLE_MS = 10 * 60 * 1000
MAX_AGE_MS = 60 * 60 * 1000
KEEPALIVE_MS = 60 * 1000
KEEPALIVE_TIMEOUT_MS = 20 * 1000
MIN_PING_MS = 10 * 1000
MAX_METADATA_BYTES = 16 * 1024


def server_options(max_receive: int | None = None) -> list[tuple[str, int]]:
    """grpc.aio.server options with the limits above (and the inbound message limit when given)."""
    options = [
        ("grpc.so_reuseport", 0),
        ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
        ("grpc.max_connection_idle_ms", IDLE_MS),
        ("grpc.max_connection_age_ms", MAX_AGE_MS),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_MS),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
    ]
    if max_receive is not None:
        options.append(("grpc.max_receive_message_length", max_receive))
    return options


class _Throttled:
    """Log lines of one kind, at most one per LOG_INTERVAL; the next line counts those left out."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def __call__(self, key: str, level: int, message: str, *, exc_info: bool = False) -> None:
        now = time.monotonic()
        if now - self._last.get(key, -LOG_INTERVAL) < LOG_INTERVAL:
            self._skipped[key] = self._skipped.get(key, 0) + 1
            return
        self._last[key] = now
        skipped = self._skipped.pop(key, 0)
        suffix = f" ({skipped} more since the last such line)" if skipped else ""
        log.log(level, "%s%s", message, suffix, exc_info=exc_info)


throttled = _Throttled()

Decode = Callable[[bytes], Any]


def _decode(raw: bytes, decode: Decode, method: str) -> Any:
    try:
        return decode(raw)
    except Exception as e:  # protobuf raises DecodeError, and others for some malformed inputs
        throttled(method + ":malformed", logging.WARNING,
                  f"{method}: malformed request ({len(raw)} bytes): {clip(str(e))}")
        raise invalid(f"malformed {method} request ({len(raw)} bytes): {clip(str(e))}") from e


async def _one(requests: AsyncIterator[bytes], decode: Decode, method: str, context: Any) -> Any:
    """The request of a unary method, or INVALID_ARGUMENT when it is missing or malformed."""
    raw = await anext(requests, None)
    try:
        if raw is None:
            throttled(method + ":empty", logging.WARNING, f"{method}: request stream ended without a message")
            raise invalid(f"{method}: the request stream ended without its message (a unary call sends one)")
        return _decode(raw, decode, method)
    except DanubeError as e:
        await context.abort(grpc.StatusCode[e.grpc_code], str(e))


async def _decoded(requests: AsyncIterator[bytes], decode: Decode, method: str) -> AsyncIterator[Any]:
    """A streaming method's requests; a malformed one raises INVALID_ARGUMENT where the handler reads it."""
    async for raw in requests:
        yield _decode(raw, decode, method)


async def _answer(error: BaseException, method: str, context: Any) -> None:
    """The status for an exception that escaped a streaming handler."""
    if isinstance(error, DanubeError):
        await context.abort(grpc.StatusCode[error.grpc_code], str(error))
    throttled(method + ":bug", logging.ERROR, f"{method} failed", exc_info=True)
    await context.abort(grpc.StatusCode.INTERNAL, f"{method} failed: {clip(repr(error))}")


async def _admit(gate: Gate, method: str, request: Any, context: Any) -> None:
    """The gate's answer for this call's first request; a refusal ends the call with its status."""
    try:
        gate.admit(method, request, context)
    except DanubeError as e:
        throttled(method + ":refused", logging.INFO, f"{method}: refused ({e.grpc_code}): {e}")
        await context.abort(grpc.StatusCode[e.grpc_code], str(e))


async def _then(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item


Responses = Callable[[AsyncIterator[bytes], Any], Awaitable[AsyncIterator[Any]]]


def _relaying(responses: Responses, method: str) -> Callable[[AsyncIterator[bytes], Any], AsyncIterator[Any]]:
    """A streaming handler yielding what `responses(requests, context)` gives (one generator between grpc and
    the servicer, as before), with the status for an exception that escapes it."""

    async def handler(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[Any]:
        try:
            async for response in await responses(requests, context):
                yield response
        except (grpc.aio.AbortError, grpc.aio.BaseError):
            raise
        except Exception as e:
            await _answer(e, method, context)

    return handler


def _guard(method: str, handler: grpc.RpcMethodHandler, decode: Decode | None = None,
           serialize: Callable[[Any], bytes] | None = None,
           gate: Gate | None = None) -> grpc.RpcMethodHandler:
    """`handler` guarded; `decode` reads its requests and `serialize` writes its responses instead of the
    generated code when given; `gate` admits each call on its first request."""
    decode = decode or handler.request_deserializer
    serialize = serialize or handler.response_serializer
    if handler.unary_unary is not None:
        unary_unary: Callable[[Any, Any], Awaitable[Any]] = handler.unary_unary

        async def one_in_one_out(requests: AsyncIterator[bytes], context: Any) -> Any:
            request = await _one(requests, decode, method, context)
            if gate is not None:
                await _admit(gate, method, request, context)
            return await unary_unary(request, context)

        return grpc.stream_unary_rpc_method_handler(one_in_one_out, response_serializer=serialize)
    if handler.unary_stream is not None:
        unary_stream: Callable[[Any, Any], AsyncIterator[Any]] = handler.unary_stream

        async def one_in(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[Any]:
            request = await _one(requests, decode, method, context)
            if gate is not None:
                await _admit(gate, method, request, context)
            return unary_stream(request, context)

        return grpc.stream_stream_rpc_method_handler(_relaying(one_in, method),
                                                     response_serializer=serialize)
    if handler.stream_stream is not None:
        stream_stream: Callable[[Any, Any], AsyncIterator[Any]] = handler.stream_stream

        async def streams(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[Any]:
            decoded = _decoded(requests, decode, method)
            if gate is not None:
                first = await anext(decoded, None)
                if first is None:
                    return stream_stream(decoded, context)  # nothing asked, nothing to admit
                await _admit(gate, method, first, context)
                decoded = _then(first, decoded)
            return stream_stream(decoded, context)

        return grpc.stream_stream_rpc_method_handler(_relaying(streams, method),
                                                     response_serializer=serialize)
    raise TypeError(f"{method}: client-streaming unary methods are not served by this broker")


class _Registrar:
    """Stands in for the server in a generated `add_*Servicer_to_server`: wraps its method handlers."""

    def __init__(self, server: grpc.aio.Server, decoders: dict[str, Decode],
                 serializers: dict[str, Callable[[Any], bytes]], gate: Gate | None) -> None:
        self._server = server
        self._gate = gate
        self._decoders = decoders
        self._serializers = serializers
        self.registered = False

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """The generated code passes the same handlers here and to add_registered_method_handlers, where
        they are taken (the generic form is built from the wrapped ones there)."""

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
                                       ) -> None:
        wrapped = {name: _guard(f"{service}/{name}", h, self._decoders.get(name), self._serializers.get(name),
                                self._gate)
                   for name, h in handlers.items()}
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))
        self._server.add_registered_method_handlers(service, wrapped)
        self.registered = True


def register(add: Callable[[Any, Any], None], servicer: Any, server: grpc.aio.Server,
             gate: Gate | None = None) -> None:
    """`add(servicer, server)` (a generated `add_*Servicer_to_server`) with every method guarded, and admitted
    by `gate` when given. A servicer's `request_decoders` (method name -> decoder of the raw request) and
    `response_serializers` (method name -> serializer) replace the generated ones."""
    registrar = _Registrar(server, getattr(servicer, "request_decoders", {}),
                           getattr(servicer, "response_serializers", {}), gate)
    add(servicer, registrar)
    if not registrar.registered:
        raise RuntimeError(f"{add.__name__} registered no method handlers: the generated code changed shape")

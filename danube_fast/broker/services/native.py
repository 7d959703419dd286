"""The native transport's listener (docs/TRANSPORT.md): the fast API's produce path as frames over TCP,
served on the event loop with `asyncio.BufferedProtocol`.

Why not gRPC: grpcio copies every message into its own slices under the GIL, once to send and twice to
receive; here a PRODUCE frame's body is read by the kernel straight into a buffer of its own size (only the
first, at most 64 KiB, of it passes through the connection's staging buffer), and that buffer is the one
the WAL appends from. Small frames (HELLO, PING, PRODUCE_OPEN) are parsed from the staging buffer.

Semantics are the gRPC fast API's (services/fast.py, whose checks and publish it calls): a PRODUCE is one
Batch request, acknowledged with its offsets once durable per the topic's settings; a producer's ACKs (or
ERRORs) go out in the order of its PRODUCEs; several producers may share a connection. Unacknowledged
produce bytes per connection are bounded (`max_inflight_bytes`, told in WELCOME): past it the connection
stops reading until acks drain, which TCP's flow control passes on to the client.

Not yet: TLS and the JWT/mTLS principal (the listener is refused when `[security]` authenticates), the
consume path, lookup, keepalive PINGs from the broker's side.

Owner: the event loop. Each `Connection` owns its buffers, its producers and their ack queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from dataclasses import dataclass, field
from typing import cast

from danube_fast.broker.context import BrokerContext
from danube_fast.broker.services.fast import check_batch, open_producer, publish
from danube_fast.broker.topic import Topic
from danube_fast.codec import frames as codec
from danube_fast.errors import DanubeError, FrameCorrupt, invalid
from danube_fast.transport import frames
from danube_fast.transport.frames import FrameError, FrameType

log = logging.getLogger("danube_fast.transport")

STAGE_BYTES = 64 * 1024  # a connection's staging buffer: every small frame fits
HANDSHAKE_S = 5.0  # a connection that has not sent its HELLO by then is closed
KEEPALIVE_MS = 30_000
MAX_INFLIGHT_BYTES = 64 * 1024 * 1024  # unacknowledged produce bytes per connection


@dataclass
class _Producer:
    topic: Topic
    name: str
    acks: asyncio.Queue[tuple[int, asyncio.Future[tuple[int, int, int]], int] | None] = field(
        default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None


class NativeServer:
    def __init__(self, ctx: BrokerContext, max_inflight_bytes: int = MAX_INFLIGHT_BYTES) -> None:
        self._ctx = ctx
        self.max_inflight_bytes = max_inflight_bytes
        self._server: asyncio.Server | None = None
        self.connections: set[Connection] = set()

    @property
    def broker_id(self) -> int:
        return self._ctx.broker_id

    async def bind(self, host: str, port: int) -> int:
        """Bind host:port (0: any free port), not accepting yet; the port."""
        self._server = await asyncio.get_running_loop().create_server(
            lambda: Connection(self), host, port, reuse_address=True, backlog=1024, start_serving=False)
        return int(self._server.sockets[0].getsockname()[1])

    async def serve(self) -> None:
        assert self._server is not None
        await self._server.start_serving()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.goodbye("UNAVAILABLE", "the broker is stopping")
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)


class Connection(asyncio.BufferedProtocol):
    def __init__(self, server: NativeServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._stage = bytearray(STAGE_BYTES)
        self._staged = 0
        self._body: bytearray | None = None  # a large frame's body being read into its own buffer
        self._body_got = 0
        self._head: tuple[int, FrameType, int, int] | None = None
        self._max_frame = frames.DEFAULT_MAX_FRAME
        self._welcomed = False
        self._handshake: asyncio.TimerHandle | None = None
        self._producers: dict[int, _Producer] = {}
        self._opening: set[asyncio.Task[None]] = set()
        self._inflight = 0
        self._paused = False
        self._closed = False

    # -- asyncio --------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        self._server.connections.add(self)
        self._handshake = asyncio.get_running_loop().call_later(HANDSHAKE_S, self._handshake_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._server.connections.discard(self)
        if self._handshake is not None:
            self._handshake.cancel()
        for task in self._opening:
            task.cancel()
        for producer in self._producers.values():
            if producer.task is not None:
                producer.task.cancel()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is not None:
            return memoryview(self._body)[self._body_got:]
        return memoryview(self._stage)[self._staged:]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self._body is not None:
                self._body_got += nbytes
                if self._body_got == len(self._body):
                    body, head = self._body, self._head
                    self._body = self._head = None
                    assert head is not None
                    self._frame(head, memoryview(body))
                return
            self._staged += nbytes
            self._parse_stage()
        except FrameError as e:
            self._fatal(e.code, str(e))

    def eof_received(self) -> bool:
        return False

    # -- frames ---------------------------------------------------------------------------------------------

    def _parse_stage(self) -> None:
        view = memoryview(self._stage)
        at = 0
        try:
            while not self._closed and self._staged - at >= frames.HEADER_BYTES:
                head = frames.parse_header(view[at:at + frames.HEADER_BYTES], self._max_frame)
                size = head[0]
                start = at + frames.HEADER_BYTES
                if self._staged - start >= size:
                    body = bytes(view[start:start + size])
                    at = start + size
                    self._frame(head, memoryview(body))
                    continue
                if start + size <= len(self._stage):
                    break  # a small frame not all in yet: it will be, here
                # A large body: the rest of it is read straight into a buffer of its own.
                have = self._staged - start
                self._body = bytearray(size)
                self._body[:have] = view[start:self._staged]
                self._body_got, self._head = have, head
                at = self._staged
                break
            rest = self._staged - at
            if rest and at:
                view[:rest] = view[at:self._staged]
            self._staged = rest
        finally:
            view.release()

    def _frame(self, head: tuple[int, FrameType, int, int], body: memoryview) -> None:
        _, kind, _, request_id = head
        if not self._welcomed:
            if kind != FrameType.HELLO:
                raise FrameError(f"the first frame must be HELLO, not {kind.name}")
            self._hello(body)
            return
        try:  # the framing is intact: a body that does not decode fails its request, not the connection
            if kind == FrameType.PRODUCE:
                self._produce(request_id, body)
            elif kind == FrameType.PRODUCE_OPEN:
                opening = self._open(request_id, frames.ProduceOpen.decode(body))
                task = asyncio.get_running_loop().create_task(opening)
                self._opening.add(task)
                task.add_done_callback(self._opening.discard)
            elif kind == FrameType.PING:
                nonce = frames.decode_ping(body)
                self._send(frames.frame(FrameType.PONG, frames.ping_body(nonce), request_id))
            elif kind == FrameType.GOODBYE:
                self._close()
            else:
                self._error(request_id, "UNIMPLEMENTED", f"{kind.name} is not served by this broker yet")
        except FrameError as e:
            self._error(request_id, e.code, str(e))

    def _hello(self, body: memoryview) -> None:
        hello = frames.Hello.decode(body)
        version, self._max_frame = hello.agree(frames.DEFAULT_MAX_FRAME)
        self._welcomed = True
        if self._handshake is not None:
            self._handshake.cancel()
            self._handshake = None
        self._send(frames.frame(FrameType.WELCOME, frames.Welcome(
            version, self._max_frame, self._server.broker_id, KEEPALIVE_MS,
            self._server.max_inflight_bytes).encode()))

    async def _open(self, request_id: int, request: frames.ProduceOpen) -> None:
        try:
            topic, producer_id = await open_producer(self._server._ctx.topics, request.topic,
                                                     request.producer, request.reliable)
        except DanubeError as e:
            self._error(request_id, e.grpc_code, str(e), e.retriable)
            return
        if producer_id not in self._producers:
            producer = _Producer(topic, request.producer)
            producer.task = asyncio.get_running_loop().create_task(self._answer(producer))
            self._producers[producer_id] = producer
        self._send(frames.frame(FrameType.PRODUCE_OPENED, frames.BodyWriter().u64(producer_id).done(),
                                request_id))

    def _produce(self, request_id: int, body: memoryview) -> None:
        records, data = frames.decode_produce(body)
        try:
            producer_id = codec.parse_header(data).producer_id
        except FrameCorrupt as e:
            self._error(request_id, "INVALID_ARGUMENT", f"malformed record batch: {e}")
            return
        producer = self._producers.get(producer_id)
        if producer is None:
            self._error(request_id, "FAILED_PRECONDITION",
                        f"producer {producer_id} was not opened on this connection: send PRODUCE_OPEN first")
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[int, int, int]]
        try:
            counted, sequenced = check_batch(data, producer.topic, producer_id, producer.name)
            if counted != records:
                raise invalid(f"PRODUCE says {records} records, its batches hold {counted}")
        except DanubeError as e:
            fut = loop.create_future()
            fut.set_exception(e)
        else:
            fut = producer.topic.publish_once(producer.name, sequenced,
                                              functools.partial(publish, producer.topic, data, counted))
            fut.add_done_callback(_retrieved)
        self._inflight += len(body)
        producer.acks.put_nowait((request_id, fut, len(body)))
        if self._inflight > self._server.max_inflight_bytes and not self._paused and self._transport:
            self._paused = True
            self._transport.pause_reading()

    async def _answer(self, producer: _Producer) -> None:
        """A producer's ACKs and ERRORs, in the order of its PRODUCEs."""
        while (item := await producer.acks.get()) is not None:
            request_id, fut, size = item
            try:
                # Shielded: a connection that drops while a batch is appended must not cut the append short.
                first, last, _ = await asyncio.shield(fut)
            except DanubeError as e:
                self._error(request_id, e.grpc_code, str(e), e.retriable)
            else:
                self._send(frames.header(FrameType.ACK, 16, request_id) + frames.offsets_body(first, last))
            self._inflight -= size
            if self._paused and self._inflight <= self._server.max_inflight_bytes // 2 and self._transport:
                self._paused = False
                self._transport.resume_reading()

    # -- out ------------------------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        if not self._closed and self._transport is not None:
            self._transport.write(data)

    def _error(self, request_id: int, code: str, message: str, retriable: bool = False) -> None:
        self._send(frames.frame(FrameType.ERROR, frames.Error(code, retriable, message).encode(), request_id))

    def _fatal(self, code: str, message: str) -> None:
        """A broken protocol: an ERROR about the connection, then the close (docs/TRANSPORT.md, "Frames")."""
        log.info("native connection closed: %s", message)
        self._error(0, code, message)
        self._close()

    def goodbye(self, code: str, message: str) -> None:
        self._send(frames.frame(FrameType.GOODBYE, frames.Goodbye(code, message).encode()))
        self._close()

    def _handshake_late(self) -> None:
        self._fatal("DEADLINE_EXCEEDED", f"no HELLO within {HANDSHAKE_S:g} s")

    def _close(self) -> None:
        if not self._closed and self._transport is not None:
            self._closed = True
            self._transport.close()


def _retrieved(fut: asyncio.Future[tuple[int, int, int]]) -> None:
    if not fut.cancelled():
        fut.exception()

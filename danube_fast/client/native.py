"""A client of the native transport (docs/TRANSPORT.md): a connection, and the fast API's producer and
consumer over it.

The connection reads with transport/receiver.py: a RECORDS frame's batches land in a buffer of their own,
handed to the consumer as they are. `NativeProducer` sends each batch as one PRODUCE frame written with the
batch itself (`writelines`: framing and batch, the batch not copied in Python) and pipelines them up to the
connection's `max_inflight_bytes`; answers are matched by request id. Neither reconnects: a dropped
connection fails what is unanswered with a retriable UNAVAILABLE (FastProducer and FastConsumer, over gRPC,
resend and resubscribe; the native transport joins them there next).
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import grpc

from danube_fast.client.credentials import Credentials
from danube_fast.client.status import Offsets, ProduceRejected, retriable
from danube_fast.codec import frames as codec
from danube_fast.proto import FastApi_pb2 as fast
from danube_fast.proto import FastApi_pb2_grpc as fast_grpc
from danube_fast.security.tls import client_ssl_context
from danube_fast.transport import frames
from danube_fast.transport.frames import Frame, FrameType
from danube_fast.transport.receiver import FrameReceiver

if TYPE_CHECKING:
    from typing_extensions import Buffer

Part = bytes | bytearray | memoryview
PRODUCE_FIELDS = 4  # a PRODUCE body's `records` before its batches
# A stream's frames waiting for its reader: past STREAM_HIGH the connection stops reading (TCP then holds
# the broker, which sends a READ's next frame only once its write buffer drains), and reads again at
# STREAM_LOW, so a reader slower than the network holds a few frames, not the whole read.
STREAM_HIGH, STREAM_LOW = 8, 2
SILENT_PERIODS = 3  # keepalive periods without a byte from the broker before the connection is given up
TRANSPORTS = ("auto", "grpc", "native")  # what the fast clients' `transport` option takes


class TransportChoice:
    """A fast client's `transport` option, and what it asked each broker: `native_for` gives the native
    address to use for the broker behind a channel, or "" for gRPC."""

    def __init__(self, transport: str) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}, expected one of {', '.join(TRANSPORTS)}")
        self.transport = transport
        self._asked: dict[str, str] = {}  # gRPC target -> its broker's native address ("" for none)

    async def native_for(self, channel: grpc.aio.Channel, target: str) -> str:
        """The native address to use for `target`; "" for gRPC. FAILED_PRECONDITION for "native" and a
        broker without the listener."""
        if self.transport == "grpc":
            return ""
        if target not in self._asked:
            self._asked[target] = await native_address(channel)
        if not self._asked[target] and self.transport == "native":
            raise ProduceRejected("FAILED_PRECONDITION", f"the broker at {target} serves no native transport "
                                                         "(its fast_addr is not set)")
        return self._asked[target]


async def native_address(channel: grpc.aio.Channel) -> str:
    """Where the broker behind `channel` (its gRPC client port) serves the native transport; "" where it
    does not (also a broker from before FastTransports: UNIMPLEMENTED). Raises ProduceRejected for any
    other failure of the call, retriable by client/status.py's rule."""
    stub: Any = fast_grpc.FastTransportsStub(channel)  # type: ignore[no-untyped-call]
    try:
        reply = await stub.Native(fast.NativeRequest(), timeout=10)
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.UNIMPLEMENTED:
            return ""
        raise ProduceRejected(e.code().name, e.details() or "could not ask for the native transport",
                              retriable(e)) from e
    return str(reply.address)


class NativeConnection(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        self._receiver = FrameReceiver(self._received)
        self._transport: asyncio.Transport | None = None
        self._raw: asyncio.Transport | None = None  # under TLS, the TCP transport beneath
        self._lost_now = asyncio.get_running_loop().create_future()  # connection_lost was called
        self._keepalive: asyncio.Task[None] | None = None
        self._sent = False  # anything written since the keepalive task last looked
        self._heard = False  # anything received since the keepalive task last looked
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Frame]] = {}
        self._streams: dict[int, asyncio.Queue[Frame | ProduceRejected]] = {}  # subscriptions' frames
        self._welcome: asyncio.Future[frames.Welcome] = asyncio.get_running_loop().create_future()
        self.welcome: frames.Welcome | None = None
        self.token = ""  # what HELLO sent: the connection's principal for as long as it lasts
        self._lost: ProduceRejected | None = None
        self._drained = asyncio.Event()
        self._drained.set()
        self._reading_paused = False  # a stream's reader is behind (STREAM_HIGH)

    @classmethod
    async def connect(cls, target: str, *, client: str = "danube-fast", timeout: float = 10.0,
                      credentials: Credentials | None = None) -> NativeConnection:
        """Connect to a broker's native listener at `target` (host:port) and make the handshake; with
        `credentials`, over TLS (a client certificate for mTLS), the token sent in HELLO."""
        host, _, port = target.rpartition(":")
        loop = asyncio.get_running_loop()
        tls = None if credentials is None else client_ssl_context(
            credentials.ca_file, credentials.cert_file, credentials.key_file)
        raw, conn = await asyncio.wait_for(loop.create_connection(cls, host, int(port)), timeout)
        try:
            # TLS started on the open connection rather than by create_connection, so that a refused
            # handshake leaves a transport this code holds, and closes.
            if tls is not None:
                starting = loop.start_tls(raw, conn, tls, server_hostname=host)
                secured = await asyncio.wait_for(starting, timeout)
                if secured is None:
                    raise ProduceRejected("UNAVAILABLE", "the broker closed the connection during TLS", True)
                conn._raw, conn._transport = conn._transport, secured
            token = ""
            if credentials is not None:
                token = (credentials.token_supplier() if credentials.token_supplier
                         else credentials.token or "")
            conn.token = token
            conn._write([frames.frame(FrameType.HELLO, frames.Hello(
                frames.VERSION, frames.VERSION, frames.DEFAULT_MAX_FRAME, token, client).encode())])
            conn.welcome = await asyncio.wait_for(asyncio.shield(conn._welcome), timeout)
        except BaseException:
            # Nobody awaits the WELCOME now: the connection's later loss must not leave it failed and unread
            # (asyncio logs such a future; the chaos campaign's partitions made many).
            conn._welcome.cancel()
            conn.close()
            raw.abort()
            raise
        conn._receiver.max_frame = conn.welcome.max_frame
        conn._keepalive = loop.create_task(conn._ping(conn.welcome.keepalive_ms / 1000))
        return conn

    @classmethod
    async def open(cls, address: str, credentials: Credentials | None) -> NativeConnection:
        """connect(), a broker out of reach being a retriable ProduceRejected (UNAVAILABLE), as the fast
        clients retry it."""
        try:
            return await cls.connect(address, credentials=credentials)
        except (OSError, TimeoutError) as e:
            raise ProduceRejected("UNAVAILABLE", f"cannot reach the native transport at {address}: {e}",
                                  True) from e

    # -- asyncio --------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._receiver.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._heard = True
        try:
            self._receiver.buffer_updated(nbytes)
        except frames.FrameError as e:
            self._receiver.stop()
            self._fail(ProduceRejected("INTERNAL", f"the broker broke the native protocol: {e}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
        if not self._lost_now.done():
            self._lost_now.set_result(None)
        why = f"the connection to the broker was lost: {exc}" if exc else "the broker closed the connection"
        self._fail(self._lost or ProduceRejected("UNAVAILABLE", why, True))

    def pause_writing(self) -> None:
        self._drained.clear()

    def resume_writing(self) -> None:
        self._drained.set()

    # -- frames ---------------------------------------------------------------------------------------------

    def _received(self, frame: Frame) -> None:
        if frame.request_id == 0:
            if frame.type == FrameType.WELCOME and not self._welcome.done():
                self._welcome.set_result(frames.Welcome.decode(frame.body))
            elif frame.type == FrameType.ERROR:
                error = frames.Error.decode(frame.body)
                self._lost = ProduceRejected(error.code, error.message, error.retriable)
                self._fail(self._lost)
            elif frame.type == FrameType.PING:  # the broker heard nothing for a period: still here
                with contextlib.suppress(ProduceRejected, frames.FrameError):
                    pong = frames.ping_body(frames.decode_ping(frame.body))
                    self._write([frames.frame(FrameType.PONG, pong)])
            elif frame.type == FrameType.GOODBYE:
                bye = frames.Goodbye.decode(frame.body)
                self._lost = ProduceRejected("UNAVAILABLE", f"the broker said goodbye: {bye.message}", True)
            return
        stream = self._streams.get(frame.request_id)
        if stream is not None:
            stream.put_nowait(frame)
            if stream.qsize() >= STREAM_HIGH and not self._reading_paused and self._transport is not None:
                self._reading_paused = True
                self._transport.pause_reading()
            return
        waiting = self._waiting.pop(frame.request_id, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(frame)

    def _fail(self, error: ProduceRejected) -> None:
        if not self._welcome.done():
            self._welcome.set_exception(error)
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(error)
        self._waiting.clear()
        for stream in self._streams.values():
            stream.put_nowait(error)

    def _write(self, parts: Sequence[Part]) -> None:
        if self._transport is None or self._transport.is_closing():
            raise self._lost or ProduceRejected("UNAVAILABLE", "the connection to the broker is closed", True)
        self._transport.writelines(parts)
        self._sent = True

    async def _ping(self, period: float) -> None:
        """A PING after each keepalive period in which nothing was sent: the broker closes a connection
        silent for three of them. And the other way round: a broker that sent nothing for SILENT_PERIODS
        periods (it PINGs, or PONGs ours, when there is nothing else) is gone or cut off, and the
        connection fails with UNAVAILABLE (retriable: the clients look the topic up again). Periods in
        which this side stopped reading (a slow stream reader) do not count."""
        nonce = itertools.count(1)
        quiet = 0
        while True:
            await asyncio.sleep(period)
            if self._heard or self._reading_paused:
                quiet = 0
            else:
                quiet += 1
                if quiet >= SILENT_PERIODS:
                    self._lost = ProduceRejected(
                        "UNAVAILABLE", f"nothing heard from the broker for {quiet * period:g} s", True)
                    self._fail(self._lost)
                    if self._transport is not None:
                        self._transport.abort()
                    return
            self._heard = False
            if not self._sent:
                with contextlib.suppress(ProduceRejected):
                    self._write([frames.frame(FrameType.PING, frames.ping_body(next(nonce)))])
            self._sent = False

    def send(self, kind: FrameType, parts: Sequence[Part], body_bytes: int) -> asyncio.Future[Frame]:
        """Send a request of `kind` whose body is `parts` (`body_bytes` in all); the future of its answer."""
        request_id = next(self._ids)
        answer: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = answer
        try:
            self._write([frames.header(kind, body_bytes, request_id), *parts])
        except ProduceRejected:
            self._waiting.pop(request_id, None)
            raise
        return answer

    async def lookup(self, topic: str, timeout: float = 30.0) -> str:
        """host:port of the native listener of the broker that serves `topic` (LOOKUP); ProduceRejected
        with the broker's status when it cannot say (NOT_FOUND; FAILED_PRECONDITION: that broker has no
        native listener; a connection gone: UNAVAILABLE)."""
        body = frames.string_body(topic)
        answer = await asyncio.wait_for(self.send(FrameType.LOOKUP, [body], len(body)), timeout)
        if answer.type != FrameType.LOCATED:
            raise native_refusal(answer, "LOOKUP")
        return frames.decode_string(answer.body, "LOCATED", "address")

    def open_stream(self, kind: FrameType, parts: Sequence[Part], body_bytes: int
                    ) -> tuple[int, asyncio.Queue[Frame | ProduceRejected]]:
        """Send a request whose answers are many frames (SUBSCRIBE): its request id and their queue (an
        error in it: the connection is gone)."""
        request_id = next(self._ids)
        queue: asyncio.Queue[Frame | ProduceRejected] = asyncio.Queue()
        self._streams[request_id] = queue
        self._write([frames.header(kind, body_bytes, request_id), *parts])
        return request_id, queue

    async def next_frame(self, request_id: int) -> Frame | ProduceRejected:
        """The next frame of stream `request_id` (an error: the connection is gone); reading resumes once
        every stream's backlog is down to STREAM_LOW."""
        queue = self._streams.get(request_id)
        if queue is None:
            return ProduceRejected("FAILED_PRECONDITION", f"request {request_id} names no open stream")
        frame = await queue.get()
        if self._reading_paused and self._transport is not None and \
                all(q.qsize() <= STREAM_LOW for q in self._streams.values()):
            self._reading_paused = False
            self._transport.resume_reading()
        return frame

    def close_stream(self, request_id: int) -> None:
        self._streams.pop(request_id, None)
        if self._reading_paused and self._transport is not None and \
                all(q.qsize() <= STREAM_LOW for q in self._streams.values()):
            self._reading_paused = False
            self._transport.resume_reading()

    def send_frame(self, kind: FrameType, body: bytes, request_id: int, flags: int = 0) -> None:
        """A frame nobody answers (ACKNOWLEDGE)."""
        self._write([frames.frame(kind, body, request_id, flags)])

    async def drained(self) -> None:
        """Until the transport's write buffer is below its high-water mark."""
        await self._drained.wait()

    def close(self) -> None:
        """Say GOODBYE and close; the connection ends once what is buffered is sent (`aclose` waits)."""
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._transport is not None and not self._transport.is_closing():
            with contextlib.suppress(ProduceRejected):
                self._write([frames.frame(FrameType.GOODBYE, frames.Goodbye("OK", "closing").encode())])
            self._transport.close()

    async def aclose(self, timeout: float = 2.0) -> None:
        """close(), and wait until the connection is gone (TLS's closing exchange included)."""
        self.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._lost_now), timeout)
        if self._raw is not None and not self._raw.is_closing():
            self._raw.abort()


def native_refusal(frame: Frame, what: str) -> ProduceRejected:
    if frame.type == FrameType.ERROR:
        error = frames.Error.decode(frame.body)
        return ProduceRejected(error.code, error.message, error.retriable)
    return ProduceRejected("INTERNAL", f"the broker answered {what} with {frame.type.name}")


class NativeProducer:
    def __init__(self, conn: NativeConnection, topic: str, name: str, producer_id: int,
                 max_inflight_bytes: int | None = None) -> None:
        self._conn = conn
        self.topic = topic
        self.name = name
        self.producer_id = producer_id
        assert conn.welcome is not None
        # At most what the broker takes unacknowledged on the connection (WELCOME), or less when asked.
        self._max_inflight = min(conn.welcome.max_inflight_bytes, max_inflight_bytes or 1 << 62)
        self._inflight = 0
        self._room = asyncio.Event()
        self._pending: set[asyncio.Future[Offsets]] = set()

    @classmethod
    async def open(cls, conn: NativeConnection, topic: str, name: str, *, reliable: bool = True,
                   max_inflight_bytes: int | None = None) -> NativeProducer:
        body = frames.ProduceOpen(topic, name, reliable).encode()
        answer = await conn.send(FrameType.PRODUCE_OPEN, [body], len(body))
        if answer.type != FrameType.PRODUCE_OPENED:
            raise native_refusal(answer, "PRODUCE_OPEN")
        return cls(conn, topic, name, frames.BodyReader(answer.body, "PRODUCE_OPENED").u64("producer_id"),
                   max_inflight_bytes)

    async def send_batch(self, payloads: Sequence[bytes]) -> asyncio.Future[Offsets]:
        """Send `payloads` as one record batch; the future of its offsets once the broker acknowledged it."""
        data = codec.encode_payloads(list(payloads), publish_time=int(time.time() * 1000),
                                     producer_id=self.producer_id, producer_name=self.name)
        return await self.send_data(data, len(payloads))

    async def send_data(self, data: Buffer, records: int) -> asyncio.Future[Offsets]:
        """Send encoded record batches holding `records` records (this producer's id in their headers)."""
        view = memoryview(data)
        size = view.nbytes
        while self._inflight and self._inflight + size > self._max_inflight:
            self._room.clear()
            await self._room.wait()
        await self._conn.drained()
        answer = self._conn.send(FrameType.PRODUCE, [frames.produce_head(records), view],
                                 PRODUCE_FIELDS + size)
        self._inflight += size
        done: asyncio.Future[Offsets] = asyncio.get_running_loop().create_future()
        self._pending.add(done)
        answer.add_done_callback(lambda a: self._answered(a, done, size))
        return done

    def _answered(self, answer: asyncio.Future[Frame], done: asyncio.Future[Offsets], size: int) -> None:
        self._inflight -= size
        self._room.set()
        self._pending.discard(done)
        if done.done():
            return
        if answer.cancelled():
            done.cancel()
        elif (error := answer.exception()) is not None:
            done.set_exception(error)
        elif (frame := answer.result()).type == FrameType.ACK:
            first, last, _ = frames.decode_offsets(frame.body, "ACK", "first_offset", "last_offset")
            done.set_result((first, last))
        else:
            done.set_exception(native_refusal(frame, "PRODUCE"))

    async def flush(self) -> None:
        """Until every batch sent so far is answered (a refusal is raised by its own future)."""
        if self._pending:
            await asyncio.wait(list(self._pending))


Records = tuple[memoryview, int, int]  # whole batches, first offset, last offset


class NativeConsumer:
    """A fast consumer over the native transport: `async for data, first, last in consumer` yields the
    subscription's RECORDS (whole batches, as the broker sent them) within its byte window; `ack` moves the
    cursor (cumulative `up_to`, individual `offsets`) and frees window bytes, `nack` redelivers. The
    iteration ends with ProduceRejected when the broker ends the subscription's stream (UNAVAILABLE, a
    retriable one: the topic moved or the broker stops; subscribe again)."""

    def __init__(self, conn: NativeConnection, request_id: int, queue: asyncio.Queue[Frame | ProduceRejected],
                 consumer_id: int, start_offset: int) -> None:
        self._conn = conn
        self._request_id = request_id
        self._queue = queue
        self.consumer_id = consumer_id
        self.start_offset = start_offset

    @classmethod
    async def subscribe(cls, conn: NativeConnection, topic: str, subscription: str, consumer: str, *,
                        window_bytes: int = 0, earliest: bool = False) -> NativeConsumer:
        body = frames.Subscribe(topic, subscription, consumer, window_bytes, earliest).encode()
        request_id, queue = conn.open_stream(FrameType.SUBSCRIBE, [body], len(body))
        first = await conn.next_frame(request_id)
        if isinstance(first, ProduceRejected):
            raise first
        if first.type != FrameType.SUBSCRIBED:
            conn.close_stream(request_id)
            raise native_refusal(first, "SUBSCRIBE")
        consumer_id, start, _ = frames.decode_offsets(first.body, "SUBSCRIBED", "consumer_id", "start_offset")
        return cls(conn, request_id, queue, consumer_id, start)

    def __aiter__(self) -> NativeConsumer:
        return self

    async def __anext__(self) -> Records:
        frame = await self._conn.next_frame(self._request_id)
        if isinstance(frame, ProduceRejected):
            raise frame
        if frame.type != FrameType.RECORDS:
            self._conn.close_stream(self._request_id)
            raise native_refusal(frame, "SUBSCRIBE")
        first, last, data = frames.decode_offsets(frame.body, "RECORDS", "first_offset", "last_offset",
                                                  more=True)
        return data, first, last

    def send_ack(self, up_to: int | None, offsets: list[int], nacks: list[int], nack_delay_ms: int) -> None:
        """One ACKNOWLEDGE: a cumulative ack, individual acks and nacks together."""
        ack = frames.Acknowledge(up_to, offsets, nacks, nack_delay_ms)
        self._conn.send_frame(FrameType.ACKNOWLEDGE, ack.encode(), self._request_id, ack.flags)

    def ack(self, up_to: int | None = None, offsets: Sequence[int] = ()) -> None:
        self.send_ack(up_to, list(offsets), [], 0)

    def nack(self, offsets: Sequence[int], delay_ms: int = 0) -> None:
        self.send_ack(None, [], list(offsets), delay_ms)

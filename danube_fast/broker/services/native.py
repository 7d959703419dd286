"""The native transport's listener (docs/TRANSPORT.md): the fast API (produce, consume, the offset
reader's OFFSETS and READ, and LOOKUP) as frames over TCP, served on the event loop with
`asyncio.BufferedProtocol`.

Why not gRPC: grpcio copies every message into its own slices under the GIL, once to send and twice to
receive; here a PRODUCE frame's body is read by the kernel straight into a buffer of its own size (only the
first, at most 64 KiB, of it passes through the connection's staging buffer), and that buffer is the one
the WAL appends from. Small frames (HELLO, PING, PRODUCE_OPEN) are parsed from the staging buffer.

Semantics are the gRPC fast API's (services/fast.py, whose checks and publish it calls): a PRODUCE is one
Batch request, acknowledged with its offsets once durable per the topic's settings; a producer's ACKs (or
ERRORs) go out in the order of its PRODUCEs; several producers may share a connection. Unacknowledged
produce bytes are bounded per connection (`max_inflight_bytes`, told in WELCOME) and on all connections
together (`[broker] fast_inflight_bytes`): past either a connection stops reading until acks bring it
under half of them, which TCP's flow control passes on to the client.

Security as on the gRPC ports: TLS with the broker's certificate in the tls modes (the client's
certificate checked on mTLS); when the broker checks identities, HELLO's token or the client certificate is
the connection's principal (security/gate.py `connection_principal`, refused with UNAUTHENTICATED and the
close), and each PRODUCE_OPEN, SUBSCRIBE, OFFSETS and READ passes the same RBAC rule as the gRPC fast API's
Produce, Consume, Offsets and Read (PERMISSION_DENIED for that request; the connection stays), a LOOKUP
Discovery.TopicLookup's.

LOOKUP answers where a topic is served by the Danube API's lookup rules (discovery.py `locate`): this
listener, or the native listener its owner registered (`fast_addr` in `/cluster/register/{id}`).

REPLICA_FETCH (transport/replica_frames.py) is a follower's fetch of a replicated topic this broker owns,
answered as the Replication service's Fetch is (`replicas`, cluster mode's), under its RBAC rule.

Owner: the event loop. Each `Connection` owns its buffers, its producers and their ack queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import ssl
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from danube_fast import latency
from danube_fast.broker.clients import new_id
from danube_fast.broker.context import BrokerContext
from danube_fast.broker.dispatch.batches import BatchDispatcher
from danube_fast.broker.services.discovery import locate
from danube_fast.broker.services.fast import check_batch, open_producer, publish
from danube_fast.broker.services.fast_reader import next_chunks, read_range, read_room, readable
from danube_fast.broker.services.native_sendfile import FileSender
from danube_fast.broker.topic import Topic
from danube_fast.codec import frames as codec
from danube_fast.codec.replication_wire import FetchParts
from danube_fast.errors import DanubeError, FrameCorrupt, invalid, precondition
from danube_fast.names import parse_topic
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import FastApi_pb2 as fast
from danube_fast.proto import Replication_pb2 as replication_pb
from danube_fast.security.gate import Gate
from danube_fast.security.tls import common_name
from danube_fast.storage import file_span
from danube_fast.storage.file_span import FileSpan
from danube_fast.transport import frames, replica_frames
from danube_fast.transport.frames import FrameError, FrameType
from danube_fast.transport.receiver import FrameReceiver

log = logging.getLogger("danube_fast.transport")

# Unacknowledged bytes per subscription when SUBSCRIBE names none: 16 MiB, the [dispatch] window_bytes cap,
# not the gRPC stream's 8 MiB (services/fast.py). Over frames, a consumer catching up on settled 64 KiB
# records read 2.7-2.9 GB/s with 16 MiB against 1.9-2.2 GB/s with 8 (1 MiB batches: 8 in flight were too
# few), and 256 B records as fast or faster (2026-11-30, three alternating pairs on this 2-core machine).
DEFAULT_WINDOW = 16 * 1024 * 1024

HANDSHAKE_S = 5.0  # a connection that has not sent its HELLO by then is closed
SILENT_PERIODS = 3  # keepalive periods of silence, or of a client not reading, before the close
MAX_INFLIGHT_BYTES = 64 * 1024 * 1024  # unacknowledged produce bytes per connection


@dataclass
class _Producer:
    topic: Topic
    name: str
    acks: asyncio.Queue[tuple[int, asyncio.Future[tuple[int, int, int]], int] | None] = field(
        default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None


PRODUCE_METHOD = "danube_fast.v1.FastProducer/Produce"  # security/rules.py: what opening a producer needs
CONSUME_METHOD = "danube_fast.v1.FastConsumer/Consume"
OFFSETS_METHOD = "danube_fast.v1.FastReader/Offsets"
READ_METHOD = "danube_fast.v1.FastReader/Read"
LOOKUP_METHOD = "danube.Discovery/TopicLookup"
REPLICA_FETCH_METHOD = "danube_fast.replication.v1.Replication/Fetch"


class ReplicaFetches(Protocol):
    """The replicated topics this broker owns, as their followers fetch them (cluster mode's Replication,
    broker/cluster/replication/manager.py): `fetch` answers a FetchRequest or raises its refusal."""

    async def fetch(self, request: replication_pb.FetchRequest, transport: str) -> FetchParts: ...


class NativeServer:
    def __init__(self, ctx: BrokerContext, gate: Gate | None = None, tls: ssl.SSLContext | None = None,
                 max_inflight_bytes: int = MAX_INFLIGHT_BYTES, keepalive_ms: int = 30_000,
                 max_connections: int = 10_000, inflight_bytes: int = 256 * 1024 * 1024,
                 max_per_principal: int = 1000, sendfile: bool = True) -> None:
        self._ctx = ctx
        self.address = ""  # host:port clients reach this listener at (set once it is bound and advertised)
        self.gate = gate  # None: the broker checks no identities
        self._tls = tls
        self.max_inflight_bytes = max_inflight_bytes
        self.keepalive_ms = keepalive_ms  # told in WELCOME: the client PINGs when it has nothing to send
        self.max_connections = max_connections
        self._server: asyncio.Server | None = None
        self.connections: set[Connection] = set()
        self.max_per_principal = max_per_principal  # when the broker checks identities
        self.principals: dict[str, int] = {}  # principal -> its connections past HELLO
        self.inflight_limit = inflight_bytes  # unacknowledged produce bytes, all connections together
        self.inflight = 0
        self.inflight_peak = 0  # the most there ever was (the tests' check of the bound)
        self.held: set[Connection] = set()  # connections not reading until the total drains
        # Batches read from segment files go by sendfile on plaintext connections (native_sendfile.py).
        self.files = FileSender() if sendfile and tls is None else None
        self.replicas: ReplicaFetches | None = None  # set in cluster mode: followers fetch here

    def took(self, size: int) -> None:
        self.inflight += size
        self.inflight_peak = max(self.inflight_peak, self.inflight)

    def gave(self, size: int) -> None:
        self.inflight -= size
        if self.held and self.inflight <= self.inflight_limit // 2:
            for conn in list(self.held):
                conn.resume_if_room()

    @property
    def broker_id(self) -> int:
        return self._ctx.broker_id

    async def bind(self, host: str, port: int) -> int:
        """Bind host:port (0: any free port), not accepting yet; the port."""
        self._server = await asyncio.get_running_loop().create_server(
            lambda: Connection(self), host, port, reuse_address=True, backlog=1024, start_serving=False,
            ssl=self._tls, ssl_handshake_timeout=HANDSHAKE_S if self._tls else None)
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
        if self.files is not None:
            self.files.close()


class Connection(asyncio.BufferedProtocol):
    def __init__(self, server: NativeServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._receiver = FrameReceiver(self._frame)
        self._writable = asyncio.Event()  # the transport's write buffer is under its high-water mark
        self._writable.set()
        self._welcomed = False
        self._principal = ""  # who HELLO said (when the broker checks identities)
        self._counted = False  # counted in the server's principals
        self._handshake: asyncio.TimerHandle | None = None
        self._producers: dict[int, _Producer] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # opening producers, serving subscriptions
        self._consumers: dict[int, BatchDispatcher] = {}  # by their SUBSCRIBE's request id
        self._subscribing: set[int] = set()  # SUBSCRIBE request ids whose subscription is being made
        self._reads: dict[int, asyncio.Task[None]] = {}  # by their READ's request id (CANCEL stops one)
        self._inflight = 0
        self._paused = False
        self._closed = False
        self._heard = False  # anything received since the keepalive timer last looked
        self._quiet = 0  # keepalive periods in a row in which nothing was received
        self._pings = itertools.count(1)
        self._silence: asyncio.TimerHandle | None = None
        self._period_s = server.keepalive_ms / 1000
        self._silent_s = self._period_s * SILENT_PERIODS
        self._held: list[Any] | None = None  # frames written while a span goes by sendfile, sent after it
        self._spanning = asyncio.Lock()  # one frame with spans at a time: its bytes must not interleave

    # -- asyncio --------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        if len(self._server.connections) >= self._server.max_connections:
            self._fatal("RESOURCE_EXHAUSTED", f"the broker serves {self._server.max_connections} native "
                                              "connections already ([broker] fast_max_connections)")
            return
        self._server.connections.add(self)
        loop = asyncio.get_running_loop()
        self._handshake = loop.call_later(HANDSHAKE_S, self._handshake_late)
        self._silence = loop.call_later(self._period_s, self._keepalive)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._server.connections.discard(self)
        for timer in (self._handshake, self._silence):
            if timer is not None:
                timer.cancel()
        self._receiver.stop()
        if self._counted:
            self._counted = False
            left = self._server.principals[self._principal] - 1
            if left:
                self._server.principals[self._principal] = left
            else:
                del self._server.principals[self._principal]
        self._server.held.discard(self)
        self._server.gave(self._inflight)  # what its producers had unacknowledged is no longer counted
        self._inflight = 0
        for task in self._tasks:
            task.cancel()
        for producer in self._producers.values():
            if producer.task is not None:
                producer.task.cancel()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._receiver.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._heard = True
        try:
            self._receiver.buffer_updated(nbytes)
        except FrameError as e:
            self._fatal(e.code, str(e))

    def eof_received(self) -> bool:
        return False

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # -- frames ---------------------------------------------------------------------------------------------

    def _frame(self, frame: frames.Frame) -> None:
        kind, request_id, body = frame.type, frame.request_id, frame.body
        if not self._welcomed:
            if kind != FrameType.HELLO:
                raise FrameError(f"the first frame must be HELLO, not {kind.name}")
            self._hello(body)
            return
        try:  # the framing is intact: a body that does not decode fails its request, not the connection
            if kind == FrameType.PRODUCE:
                self._produce(request_id, body)
            elif kind == FrameType.PRODUCE_OPEN:
                self._start(self._open(request_id, frames.ProduceOpen.decode(body)))
            elif kind == FrameType.ACKNOWLEDGE:
                self._acknowledge(request_id, frames.Acknowledge.decode(body, frame.flags))
            elif kind == FrameType.SUBSCRIBE:
                self._start(self._subscribe(request_id, frames.Subscribe.decode(body)))
            elif kind == FrameType.PING:
                nonce = frames.decode_ping(body)
                self._send(frames.frame(FrameType.PONG, frames.ping_body(nonce), request_id))
            elif kind == FrameType.PONG:
                pass  # the answer to our PING: hearing it is what counts (buffer_updated)
            elif kind == FrameType.GOODBYE:
                self._start(self._goodbye())
            elif kind == FrameType.LOOKUP:
                self._start(self._lookup(request_id, frames.decode_string(body, "LOOKUP", "topic")))
            elif kind == FrameType.OFFSETS:
                self._offsets(request_id, frames.decode_string(body, "OFFSETS", "topic"))
            elif kind == FrameType.READ:
                read = frames.Read.decode(body)
                if request_id in self._reads:
                    self._error(request_id, "ALREADY_EXISTS", f"request id {request_id} already names a read")
                else:
                    self._reads[request_id] = self._start(self._read(request_id, read))
            elif kind == FrameType.CANCEL:
                if (reading := self._reads.get(request_id)) is not None:
                    reading.cancel()
            elif kind == FrameType.REPLICA_FETCH:
                self._start(self._replica_fetch(request_id, replica_frames.ReplicaFetch.decode(body)))
            else:
                self._error(request_id, "UNIMPLEMENTED", f"{kind.name} is not a request a broker serves")
        except FrameError as e:
            self._error(request_id, e.code, str(e))

    def _hello(self, body: memoryview) -> None:
        hello = frames.Hello.decode(body)
        version, self._receiver.max_frame = hello.agree(frames.DEFAULT_MAX_FRAME)
        gate = self._server.gate
        if gate is not None:
            assert self._transport is not None
            try:
                principal = gate.connection_principal(
                    hello.token or None, common_name(self._transport.get_extra_info("peercert")))
            except DanubeError as e:
                raise FrameError(str(e), e.grpc_code) from None
            counts = self._server.principals
            if counts.get(principal, 0) >= self._server.max_per_principal:
                raise FrameError(f"{principal} has {self._server.max_per_principal} native connections to "
                                 "this broker already ([broker] fast_max_connections_per_principal)",
                                 "RESOURCE_EXHAUSTED")
            counts[principal] = counts.get(principal, 0) + 1
            self._principal = principal
            self._counted = True
        self._welcomed = True
        if self._handshake is not None:
            self._handshake.cancel()
            self._handshake = None
        self._send(frames.frame(FrameType.WELCOME, frames.Welcome(
            version, self._receiver.max_frame, self._server.broker_id, self._server.keepalive_ms,
            self._server.max_inflight_bytes).encode()))

    async def _open(self, request_id: int, request: frames.ProduceOpen) -> None:
        try:
            self._authorize(PRODUCE_METHOD, fast.ProduceRequest(open=fast.Open(
                topic=request.topic, producer_name=request.producer, reliable=request.reliable)))
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

    def _start(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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
        self._server.took(len(body))
        producer.acks.put_nowait((request_id, fut, len(body)))
        server = self._server
        if (self._inflight > server.max_inflight_bytes or server.inflight > server.inflight_limit) \
                and not self._paused and self._transport:
            self._paused = True
            self._transport.pause_reading()
            server.held.add(self)

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
            self._server.gave(size)
            self.resume_if_room()

    def resume_if_room(self) -> None:
        """Read again once this connection's and every connection's unacknowledged bytes are under half
        their bounds."""
        server = self._server
        room = (self._inflight <= server.max_inflight_bytes // 2
                and server.inflight <= server.inflight_limit // 2)
        if self._paused and not self._closed and self._transport is not None and room:
            self._paused = False
            self._transport.resume_reading()
            server.held.discard(self)

    async def _subscribe(self, request_id: int, request: frames.Subscribe) -> None:
        """A consumer: SUBSCRIBED, then RECORDS within its byte window for as long as it holds the
        subscription (services/fast.py `FastConsumerService.Consume`, frame for message)."""
        if request_id in self._consumers or request_id in self._subscribing:
            self._error(request_id, "ALREADY_EXISTS", f"request id {request_id} already names a subscription")
            return
        ctx = self._server._ctx
        self._subscribing.add(request_id)  # taken from here on: a second SUBSCRIBE meanwhile is refused
        try:
            self._authorize(CONSUME_METHOD, fast.ConsumeRequest(subscribe=fast.Subscribe(
                topic=request.topic, subscription=request.subscription, consumer_name=request.consumer)))
            topic = ctx.topics.topic_for_consumer(parse_topic(request.topic))
            batches = await ctx.subscriptions.subscribe_batches(
                topic, request.subscription, request.consumer, earliest=request.earliest)
        except DanubeError as e:
            self._error(request_id, e.grpc_code, str(e), e.retriable)
            return
        finally:
            self._subscribing.discard(request_id)
        holder = new_id()
        batches.holder = holder
        self._consumers[request_id] = batches
        window = request.window_bytes or DEFAULT_WINDOW  # next_records caps it at [dispatch] window_bytes
        try:
            self._send(frames.frame(FrameType.SUBSCRIBED, frames.offsets_body(holder, batches.floor + 1),
                                    request_id))
            while not self._closed:
                got = await batches.next_chunks(window, spans=self._server.files is not None)
                subscription = topic.subscriptions.get(request.subscription)
                if got is None or subscription is None or subscription.dispatcher is not batches:
                    _close_spans(got[0] if got is not None else [])
                    break
                chunks, first, last = got
                latency.observe_age(latency.DELIVERY_FAST, file_span.first_batch(chunks[0])[1])
                size = sum(len(c) for c in chunks)  # (bytes, byte views and spans: len is their size)
                parts = [frames.header(FrameType.RECORDS, 16 + size, request_id),
                         frames.offsets_body(first, last), *chunks]  # cached groups not joined
                try:
                    await self._send_records(parts)
                    await asyncio.wait_for(self._writable.wait(), self._silent_s)
                except TimeoutError:
                    self._fatal("DEADLINE_EXCEEDED", f"the client read nothing for {self._silent_s:g} s, "
                                                     "its records stayed unsent")
                    break
                except OSError as e:  # the connection broke under a sendfile
                    log.info("native connection closed: %s", e)
                    self._close()
                    break
            why = _ended(batches, ctx, topic)
            if why is not None:
                self._error(request_id, "UNAVAILABLE", why, True)
            else:
                self._error(request_id, "ABORTED", f"subscription {request.subscription} of {topic.full} was "
                                                   "taken over by another consumer, or deleted")
        finally:
            self._consumers.pop(request_id, None)
            if batches.holder == holder:
                batches.holder = 0
                batches.consumer_lost()
                with contextlib.suppress(DanubeError):
                    await batches.save_cursor()

    async def _lookup(self, request_id: int, topic: str) -> None:
        """LOCATED: the native listener of the broker that serves `topic`, by Discovery.TopicLookup's rules
        (waiting for a topic being placed); FAILED_PRECONDITION when that broker has no native listener."""
        try:
            self._authorize(LOOKUP_METHOD, pb.TopicLookupRequest(topic=topic))
            owner = await locate(self._server._ctx, parse_topic(topic))
        except DanubeError as e:
            self._error(request_id, e.grpc_code, str(e), e.retriable)
            return
        address = self._server.address if owner is None else owner.fast_addr
        if not address:
            where = "this broker" if owner is None else f"the broker at {owner.broker_addr}"
            self._error(request_id, "FAILED_PRECONDITION", f"{topic} is served by {where}, which serves no "
                                                           "native transport: use its gRPC port")
            return
        self._send(frames.frame(FrameType.LOCATED, frames.string_body(address), request_id))

    def _offsets(self, request_id: int, topic: str) -> None:
        """RANGE: the first offset still stored and the one after the last committed (FastReader.Offsets)."""
        try:
            self._authorize(OFFSETS_METHOD, fast.OffsetsRequest(topic=topic))
            log = readable(self._server._ctx.topics, topic)[1]
        except DanubeError as e:
            self._error(request_id, e.grpc_code, str(e), e.retriable)
            return
        self._send(frames.frame(FrameType.RANGE, frames.offsets_body(log.start_offset, log.committed_offset),
                                request_id))

    async def _replica_fetch(self, request_id: int, request: replica_frames.ReplicaFetch) -> None:
        """A follower's fetch of a replicated topic this broker owns (docs/REPLICATION.md): REPLICA_DATA
        with the records as the log holds them, written after its fields without a copy."""
        asked = replication_pb.FetchRequest(
            topic=request.topic, follower_id=request.follower_id, epoch=request.epoch,
            from_offset=request.from_offset, max_bytes=request.max_bytes, wait_ms=request.wait_ms,
            durable_offset=request.durable_offset)
        try:
            self._authorize(REPLICA_FETCH_METHOD, asked)
            if self._server.replicas is None:
                raise precondition(f"broker {self._server.broker_id} replicates no topic (not in a cluster)")
            answer = await self._server.replicas.fetch(asked, "native")
        except DanubeError as e:
            self._error(request_id, e.grpc_code, str(e), e.retriable)
            return
        except Exception as e:  # answered all the same: the follower would wait out its timeout
            log.exception("a replica fetch of %s failed", request.topic)
            self._error(request_id, "INTERNAL", f"the fetch of {request.topic} failed: {e!r}")
            return
        fields = replica_frames.data_fields(answer.next_offset, answer.start_offset, answer.uploaded_through,
                                            answer.reset)
        size = len(fields) + answer.nbytes
        self._send_parts([frames.header(FrameType.REPLICA_DATA, size, request_id), fields, *answer.chunks])

    async def _read(self, request_id: int, request: frames.Read) -> None:
        """RECORDS frames of [from_offset, to_offset), then READ_DONE (FastReader.Read, frame for message):
        nothing written anywhere; the end fixed when the read starts; one frame in the transport's buffer
        at a time; a topic that leaves this broker ends the read with UNAVAILABLE (the client reads on from
        the next broker)."""
        ctx = self._server._ctx
        try:
            asked = fast.ReadRequest(topic=request.topic, from_offset=request.from_offset,
                                     to_offset=request.to_offset, max_bytes=request.max_bytes)
            self._authorize(READ_METHOD, asked)
            topic, log = readable(ctx.topics, request.topic)
            low, end = read_range(asked, log)
            room = read_room(request.max_bytes)
            while low < end:
                if ctx.subscriptions.stopping or ctx.topics.find(topic.full) is not topic:
                    why = "the broker is stopping" if ctx.subscriptions.stopping else \
                        "the topic left this broker"
                    self._error(request_id, "UNAVAILABLE", f"{why}: look {topic.full} up again and read on "
                                                           f"from offset {low}", True)
                    return
                held = await ctx.reads.reserve(room)  # released once the frame left the write buffer
                try:
                    got = await next_chunks(log, low, end, room, spans=self._server.files is not None)
                    if got is None:
                        break
                    chunks, first, low = got
                    size = sum(len(c) for c in chunks)
                    held.grow(size)
                    parts = [frames.header(FrameType.RECORDS, 16 + size, request_id),
                             frames.offsets_body(first, low - 1), *chunks]
                    try:
                        await self._send_records(parts)
                        await asyncio.wait_for(self._writable.wait(), self._silent_s)
                    except TimeoutError:
                        self._fatal("DEADLINE_EXCEEDED", f"the client read nothing for {self._silent_s:g} s")
                        return
                    except OSError:  # the connection broke under a sendfile
                        self._close()
                        return
                finally:
                    held.release()
        except DanubeError as e:
            self._error(request_id, e.grpc_code, str(e), e.retriable)
            return
        finally:
            self._reads.pop(request_id, None)
        self._send(frames.frame(FrameType.READ_DONE, b"", request_id))

    async def _goodbye(self) -> None:
        """The client's orderly close: its subscriptions end first (acks applied, cursors saved, the
        subscriptions free for the next consumer), then the connection, which the client waits for."""
        me = asyncio.current_task()
        serving = [task for task in self._tasks if task is not me]
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)
        self._close()

    def _authorize(self, method: str, request: Any) -> None:
        """PERMISSION_DENIED unless this connection's principal may make `request` (the gRPC fast API's
        rule for `method`)."""
        if self._server.gate is not None:
            self._server.gate.authorize(self._principal, method, request)

    def _acknowledge(self, request_id: int, ack: frames.Acknowledge) -> None:
        batches = self._consumers.get(request_id)
        if batches is None:
            self._error(request_id, "FAILED_PRECONDITION",
                        f"request id {request_id} names no subscription of this connection")
            return
        batches.acknowledge(ack.up_to, ack.offsets)
        if ack.nacks:
            batches.nack(min(ack.nacks), ack.nack_delay_ms or None)

    # -- out ------------------------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        if self._held is not None:
            self._held.append(data)
        elif not self._closed and self._transport is not None:
            self._transport.write(data)

    def _send_parts(self, parts: list[Any]) -> None:
        """One frame as its parts (header, fields, batches): written together, the batches not copied."""
        if self._held is not None:
            self._held.extend(parts)
        elif not self._closed and self._transport is not None:
            self._transport.writelines(parts)

    async def _send_records(self, parts: list[Any]) -> None:
        """A RECORDS frame as its parts. Batches named as FileSpans are sent from their file
        (native_sendfile.py), the parts in memory written as usual, while the connection's other frames wait
        in `_held`. A frame left half sent (a timeout, a broken connection) ends the connection: the caller
        closes it."""
        if not any(isinstance(part, FileSpan) for part in parts):
            self._send_parts(parts)
            return
        async with self._spanning:  # another subscription's or read's spanned frame goes first
            await self._send_spanned_now(parts)

    async def _send_spanned_now(self, parts: list[Any]) -> None:
        assert self._server.files is not None and self._transport is not None
        held: list[Any] = []
        self._held = held
        try:
            in_memory: list[Any] = []
            for part in parts:
                if not isinstance(part, FileSpan):
                    in_memory.append(part)
                    continue
                if self._closed:
                    return
                if in_memory:
                    self._transport.writelines(in_memory)
                    in_memory = []
                await self._server.files.send(self._transport, part, self._silent_s)
            if in_memory and not self._closed:
                self._transport.writelines(in_memory)
        finally:
            self._held = None
            _close_spans(parts)
            if held and not self._closed:
                self._transport.writelines(held)

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

    def _keepalive(self) -> None:
        """Each keepalive period: a PING when nothing was received in it (a client that is alive answers,
        and one whose broker is gone learns it from the silence), and the close after SILENT_PERIODS of
        them in a row (the peer or the network is gone)."""
        if self._closed:
            return
        if self._heard:
            self._heard, self._quiet = False, 0
        else:
            self._quiet += 1
            if self._quiet >= SILENT_PERIODS:
                self._fatal("DEADLINE_EXCEEDED", f"nothing received for {self._silent_s:g} s")
                return
            if self._welcomed:
                self._send(frames.frame(FrameType.PING, frames.ping_body(next(self._pings))))
        self._silence = asyncio.get_running_loop().call_later(self._period_s, self._keepalive)

    def _handshake_late(self) -> None:
        self._fatal("DEADLINE_EXCEEDED", f"no HELLO within {HANDSHAKE_S:g} s")

    def _close(self) -> None:
        """Close once what is buffered is sent; a peer that does not read it is cut off (abort) after the
        same silence that closes an idle connection, or its buffer would be held for ever."""
        if not self._closed and self._transport is not None:
            self._closed = True
            self._transport.close()
            asyncio.get_running_loop().call_later(self._silent_s, self._transport.abort)


def _ended(batches: BatchDispatcher, ctx: BrokerContext, topic: Topic) -> str | None:
    """Why a subscription's stream ended when the client should subscribe again (UNAVAILABLE), or None."""
    if batches.moved:  # an operator moved the subscription: resubscribing starts at its position
        return batches.moved
    if ctx.subscriptions.stopping:
        return f"the broker is stopping: look {topic.full} up again and resubscribe"
    if ctx.topics.find(topic.full) is not topic:
        return f"the topic left this broker: look {topic.full} up again and resubscribe"
    return None


def _close_spans(parts: list[Any]) -> None:
    for part in parts:
        if isinstance(part, FileSpan):
            part.close()


def _retrieved(fut: asyncio.Future[tuple[int, int, int]]) -> None:
    if not fut.cancelled():
        fut.exception()

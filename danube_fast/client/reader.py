"""TopicReader: a Reliable topic's records by offset range, read-only (FastReader in proto/FastApi.proto).

Why: a Spark data source plans a query on a fixed range of offsets and must see every record committed when
the query starts, also those not uploaded to the object tier yet; tools must be able to look at a topic
without changing it. A consumer cannot do either: subscribing writes a subscription and moves a cursor.

What it guarantees:
* Nothing is written on any broker: no subscription, no cursor, no metadata.
* `offsets(topic)` is (start, next): the first offset still stored anywhere, one past the last committed
  (durable and acknowledged to its producer) offset.
* `read(topic, start, end)` yields `(data, first_offset, last_offset)` per response: whole record batches
  (docs/FORMAT.md; decode with `danube_fast.codec.frames`) in offset order, each offset once, covering every
  stored offset of [start, end) that is committed when the read starts; the first and the last batch may
  hold offsets outside the range: skip them (`records_in` does). `end` 0 is `offsets(topic)[1]`, asked once
  when the read starts, so a retried read covers the same range. Offsets that retention deleted inside the
  range are missing (the broker skips what no tier holds); `start` below the first stored offset fails with
  OUT_OF_RANGE instead of silently starting later.
* It follows the topic: the first use of a topic looks it up (Discovery, as the official client does) and
  goes to the broker serving it. A call that fails retriably (client/status.py: UNAVAILABLE when the topic
  moved or the broker stops, a broken transport) is looked up again and retried, at most `retries` times
  in a row with a backoff; a read resumes after the last offset it yielded. Any other status
  (INVALID_ARGUMENT: bad name or no such topic; FAILED_PRECONDITION: a NonReliable topic; OUT_OF_RANGE;
  NOT_FOUND; ...) fails at once. Failures are `ReadFailed`, chained from the call's error.
* Transport (`transport`): as the fast clients' (client/native.py TransportChoice): "auto" (the default)
  reads over the native transport (OFFSETS, READ: docs/TRANSPORT.md) from a broker that serves it and over
  gRPC from one that does not; "grpc" never asks; "native" refuses a broker without it. The guarantees above
  are the same on both.

Owner: the event loop that opened it; `read()`s of several topics may run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

import grpc

from danube_fast.client.credentials import Credentials, open_channel
from danube_fast.client.lookup import CHANNEL_OPTIONS, lookup
from danube_fast.client.native import NativeConnection, TransportChoice, native_refusal
from danube_fast.client.status import ProduceRejected, retriable
from danube_fast.codec import frames
from danube_fast.codec.fast_wire import RecordsResponse, decode_read_response
from danube_fast.errors import DanubeError
from danube_fast.proto import FastApi_pb2 as fast
from danube_fast.proto import FastApi_pb2_grpc as fast_grpc
from danube_fast.transport import frames as wire
from danube_fast.transport.frames import FrameType

T = TypeVar("T")

OFFSETS_TIMEOUT = 10.0  # seconds per Offsets call
# A channel whose broker went away reconnects within this backoff (gRPC's default starts at 1 s and grows to
# 120 s, longer than a broker restart); its own subchannel pool, so another client's connection in a long
# backoff is not shared.
READER_CHANNEL_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1),
                          ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                          ("grpc.max_reconnect_backoff_ms", 2000)]

Records = tuple[bytes | memoryview, int, int]  # data (bytes-like), first offset, last offset
READ_METHOD = "/danube_fast.v1.FastReader/Read"


class _Stub:
    """FastReader on one channel, its Read responses read without copying their data (fast_wire.py)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        generated: Any = fast_grpc.FastReaderStub(channel)  # type: ignore[no-untyped-call]
        self.Offsets = generated.Offsets
        self.Read = channel.unary_stream(READ_METHOD, request_serializer=fast.ReadRequest.SerializeToString,
                                         response_deserializer=decode_read_response)


class ReadFailed(DanubeError):
    """A FastReader call failed for good: `grpc_code` is the status name the broker (or the transport)
    gave; `retriable` is True when it gave up retrying."""

    def __init__(self, code: str, message: str, retriable: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.grpc_code = code
        self.retriable = retriable


class TopicReader:
    """`async with TopicReader("host:port") as reader:` on any broker of the cluster (its client API; an
    `http://` in front, as in a broker's advertised URL, is dropped)."""

    def __init__(self, target: str, *, retries: int = 10, backoff: float = 0.1, max_backoff: float = 2.0,
                 credentials: Credentials | None = None, transport: str = "auto") -> None:
        self._bootstrap = target.removeprefix("http://").removeprefix("https://")
        self._credentials = credentials  # TLS and token (client/credentials.py); None: plaintext
        self._retries = retries
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._where: dict[str, str] = {}  # topic -> host:port of the broker last found serving it
        self._transport = TransportChoice(transport)
        self._natives: dict[str, NativeConnection] = {}  # native address -> its open connection
        self.retried = 0  # calls made again after a retriable failure
        self.native_reads = 0  # reads and offsets answered over the native transport

    async def __aenter__(self) -> TopicReader:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every channel; reads still running fail."""
        channels, self._channels = list(self._channels.values()), {}
        natives, self._natives = list(self._natives.values()), {}
        for conn in natives:
            await conn.aclose()
        for channel in channels:
            await channel.close()

    async def offsets(self, topic: str) -> tuple[int, int]:
        """(start_offset, next_offset): the first offset still stored, one past the last committed one."""
        async def ask(stub: Any) -> tuple[int, int]:
            if isinstance(stub, NativeConnection):
                body = wire.string_body(topic)
                answer = await asyncio.wait_for(stub.send(FrameType.OFFSETS, [body], len(body)),
                                                OFFSETS_TIMEOUT)
                if answer.type != FrameType.RANGE:
                    raise native_refusal(answer, "OFFSETS")
                start, next_offset, _ = wire.decode_offsets(answer.body, "RANGE", "start_offset",
                                                             "next_offset")
                self.native_reads += 1
                return start, next_offset
            r = await stub.Offsets(fast.OffsetsRequest(topic=topic), timeout=OFFSETS_TIMEOUT)
            return r.start_offset, r.next_offset

        return await self._retrying(topic, "read the offsets of", ask)

    async def read(self, topic: str, start: int, end: int, max_bytes: int = 0) -> AsyncIterator[Records]:
        """(data, first_offset, last_offset) of each Records holding offsets [start, end), in order (module
        docstring). `end` 0: what is committed now; `max_bytes` per response, 0 = the broker's default."""
        if end == 0:
            end = (await self.offsets(topic))[1]
        low = start  # the next offset not yielded yet
        failures = 0
        while low < end:
            try:
                stub = await self._stub(topic, located=failures == 0 and topic in self._where)
            except ProduceRejected as e:
                failures = await self._failed(e, topic, "read", failures)
                continue
            if isinstance(stub, NativeConnection):
                responses = _native_read(stub, wire.Read(topic, low, end, max_bytes))
                self.native_reads += 1
            else:
                responses = _grpc_read(stub, fast.ReadRequest(topic=topic, from_offset=low, to_offset=end,
                                                              max_bytes=max_bytes))
            try:
                async for data, first, last in responses:
                    if last < low:
                        continue  # nothing new (cannot happen with a correct broker; never yield twice)
                    failures = 0
                    yield data, first, last
                    low = last + 1
                return  # the broker ended the read: nothing more in the range
            except (grpc.aio.AioRpcError, ProduceRejected) as e:
                failures = await self._failed(e, topic, "read", failures)
            finally:
                await responses.aclose()

    # -- following the topic --------------------------------------------------------------------------

    async def _retrying(self, topic: str, what: str, attempt: Callable[[Any], Awaitable[T]]) -> T:
        failures = 0
        while True:
            try:
                return await attempt(await self._stub(topic, located=failures == 0 and topic in self._where))
            except (grpc.aio.AioRpcError, ProduceRejected) as e:
                failures = await self._failed(e, topic, what, failures)
            except TimeoutError:
                late = ProduceRejected("DEADLINE_EXCEEDED", f"no answer to {what}", True)
                failures = await self._failed(late, topic, what, failures)

    async def _failed(self, error: grpc.aio.AioRpcError | ProduceRejected, topic: str, what: str,
                      failures: int) -> int:
        """After a failed call: raise ReadFailed unless the failure is retriable and tries are left; else
        wait the backoff and return the failures in a row so far. A native connection that failed is
        dropped (the next call opens another)."""
        if isinstance(error, ProduceRejected):
            code, details, again = error.grpc_code, str(error), error.retriable
            if again:
                self._drop_natives()
        else:
            code, details, again = error.code().name, error.details(), retriable(error)
        details = details or f"could not {what} {topic}"
        if not again:
            raise ReadFailed(code, details) from error
        if failures >= self._retries:
            raise ReadFailed(code, f"gave up after {failures + 1} tries to {what} {topic}: {details}",
                             True) from error
        await asyncio.sleep(min(self._backoff * 2 ** failures, self._max_backoff))
        self.retried += 1
        return failures + 1

    def _drop_natives(self) -> None:
        for conn in self._natives.values():
            conn.close()
        self._natives.clear()

    async def _stub(self, topic: str, *, located: bool) -> Any:
        """What reads `topic`: a native connection to the broker serving it, where it offers one and the
        transport allows, else a FastReader stub on its gRPC port. That broker is looked up unless `located`
        (known and no call to it failed since); when the lookup says nothing (the broker asked is down, the
        topic is being placed), the broker last known, else the one this reader was opened on."""
        if not located:
            found = None
            for target in dict.fromkeys((self._where.get(topic, self._bootstrap), self._bootstrap)):
                found = await lookup(self._channel(target), topic)
                if found is not None:
                    break
            self._where[topic] = found or self._where.get(topic, self._bootstrap)
        target = self._where[topic]
        address = await self._transport.native_for(self._channel(target), target)
        if not address:
            return _Stub(self._channel(target))
        conn = self._natives.get(address)
        supplier = self._credentials.token_supplier if self._credentials is not None else None
        if conn is not None and supplier is not None and supplier() != conn.token:
            # A connection's principal is its HELLO's token; a call after the token was refreshed goes as
            # the new one, as it would over gRPC, where every call carries the token.
            conn.close()
            conn = None
        if conn is None:
            conn = self._natives[address] = await NativeConnection.open(address, self._credentials)
        return conn

    def _channel(self, target: str) -> grpc.aio.Channel:
        channel = self._channels.get(target)
        if channel is None:
            channel = open_channel(target, READER_CHANNEL_OPTIONS, self._credentials)
            self._channels[target] = channel
        return channel


def records_in(data: bytes, start: int, end: int) -> list[frames.Record]:
    """The records of `data` (one `read` item) whose offsets lie in [start, end)."""
    return [r for r in frames.decode_records(data) if start <= r.offset < end]


async def _grpc_read(stub: _Stub, request: fast.ReadRequest) -> AsyncGenerator[Records, None]:
    call = stub.Read(request)
    try:
        async for response in call:
            r = response if isinstance(response, RecordsResponse) else response.records
            yield r.data, r.first_offset, r.last_offset
    finally:
        call.cancel()


async def _native_read(conn: NativeConnection, request: wire.Read) -> AsyncGenerator[Records, None]:
    """READ's RECORDS frames until READ_DONE; an ERROR (or the connection's loss) raised as ProduceRejected;
    a read left early is CANCELled."""
    body = request.encode()
    request_id, _ = conn.open_stream(FrameType.READ, [body], len(body))
    done = False
    try:
        while True:
            frame = await conn.next_frame(request_id)
            if isinstance(frame, ProduceRejected):
                done = True
                raise frame
            if frame.type == FrameType.READ_DONE:
                done = True
                return
            if frame.type != FrameType.RECORDS:
                done = True
                raise native_refusal(frame, "READ")
            first, last, data = wire.decode_offsets(frame.body, "RECORDS", "first_offset", "last_offset",
                                                    more=True)
            yield data, first, last
    finally:
        conn.close_stream(request_id)
        if not done:
            with contextlib.suppress(ProduceRejected):
                conn.send_frame(FrameType.CANCEL, b"", request_id)

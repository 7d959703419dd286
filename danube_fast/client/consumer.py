"""FastConsumer: a Reliable subscription's records as whole batches on one Consume stream.

`batches()` yields `Delivery(data, first_offset, last_offset)`: record batches straight from the broker's
WAL (docs/FORMAT.md); decode them with `danube_fast.codec.frames` (`decode_records`, or `decode_arrow` for a
pyarrow RecordBatch), skipping offsets below `start_offset` (a batch is delivered whole). `records()` does
that for you, one Record at a time. Acknowledge with `ack_cumulative(offset)` (everything up to it) or
`ack(offsets)`; the broker sends more while the unacknowledged bytes stay under `window_bytes` (0, the
default: the broker's default, DEFAULT_WINDOW of services/fast.py over gRPC and of services/native.py over
the native transport; a window above its `[dispatch] window_bytes` gets that).

The consumer follows its topic: when the stream fails with a retriable status (client/status.py: the broker
stops, crashes or the topic moves to another broker in a cluster: UNAVAILABLE, or the INTERNAL that grpc
gives an ack the dying connection could not write), it looks the topic up (Discovery, as the official client
does), subscribes again on the broker that serves it and goes on from the subscription's saved cursor.
Records not acknowledged before that come again (at least once); so may records whose ack was in flight.
Subscribing again is retried `reconnect_tries` times (about 25 s of backoff) and stops at once on a refusal
that is not retriable. The stream ends for good (`batches()` returns) when the subscription is deleted or
taken back by a Danube API consumer.

Transport (`transport`): as FastProducer's: "auto" (the default) subscribes over the native transport where
the located broker serves it (docs/TRANSPORT.md), with the same window, acks, nacks and resubscribing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from danube_fast.client.credentials import Credentials, open_channel
from danube_fast.client.lookup import CHANNEL_OPTIONS, follow
from danube_fast.client.native import NativeConnection, NativeConsumer, TransportChoice
from danube_fast.client.producer import ProduceRejected, first_answer, rejection
from danube_fast.client.status import retriable, write_or_broken
from danube_fast.codec import frames
from danube_fast.codec.fast_wire import RecordsResponse, decode_consume_response, serialize_request
from danube_fast.proto import FastApi_pb2 as fast

# While the old stream of a reconnecting consumer is still being torn down, its broker may still name it
# the holder of the subscription for a moment.
RESUBSCRIBE_CODES = frozenset({"PERMISSION_DENIED"})


@dataclass(frozen=True)
class Delivery:
    data: bytes | memoryview  # a view into the response grpc received (not copied): bytes-like
    first_offset: int
    last_offset: int


CONSUME_METHOD = "/danube_fast.v1.FastConsumer/Consume"
POSITIONS = {"latest": fast.LATEST, "earliest": fast.EARLIEST}


def consume_method(channel: grpc.aio.Channel) -> Any:
    """The Consume stream of `channel`, reading Records responses without copying their data
    (fast_wire.py)."""
    return channel.stream_stream(CONSUME_METHOD, request_serializer=serialize_request,
                                 response_deserializer=decode_consume_response)


class FastConsumer:
    def __init__(self, target: str, topic: str, subscription: str, name: str, *, window_bytes: int = 0,
                 reconnect_tries: int = 50, credentials: Credentials | None = None,
                 initial_position: str = "latest", transport: str = "auto") -> None:
        """`initial_position`: where a subscription this consumer creates starts, "latest" (what is
        published from now on) or "earliest" (the first record the topic keeps); an existing one goes on
        from its cursor."""
        if initial_position not in POSITIONS:
            raise ValueError(f"initial_position must be one of {sorted(POSITIONS)}, not {initial_position!r}")
        self._transport = TransportChoice(transport)
        self.topic = topic
        self.subscription = subscription
        self.name = name
        self.start_offset = 0  # the first offset the current stream delivers
        self.consumer_id = 0
        self.reconnects = 0
        self._target = target
        self._bootstrap = target  # asked too when the broker last known says nothing (lookup.follow)
        self._window = window_bytes
        self._position = POSITIONS[initial_position]
        self._reconnect_tries = reconnect_tries
        self._credentials = credentials  # TLS and token (client/credentials.py); None: plaintext
        self._channel = open_channel(target, CHANNEL_OPTIONS, credentials)
        self._call: Any = None
        self._write_lock = asyncio.Lock()
        self._closed = False
        self._native: NativeConnection | None = None  # the native connection consuming now, if any
        self._native_stream: NativeConsumer | None = None

    @classmethod
    async def connect(cls, target: str, topic: str, subscription: str, name: str, **options: Any
                      ) -> FastConsumer:
        """Subscribe `name` to `subscription` of `topic`, asking `target` (host:port of a broker's client
        API) where the topic is served. Options: window_bytes, reconnect_tries, credentials,
        initial_position."""
        consumer = cls(target, topic, subscription, name, **options)
        try:
            await consumer._open(resubscribing=False)
        except BaseException:
            if consumer._native is not None:
                await consumer._native.aclose()
            await consumer._channel.close()
            raise
        return consumer

    @property
    def over_native(self) -> bool:
        """The current subscription's stream is on the native transport."""
        return self._native is not None

    async def batches(self) -> AsyncIterator[Delivery]:
        """Deliveries until the subscription ends (deleted, or taken back by a Danube API consumer) or the
        consumer is closed; across reconnects. Raises ProduceRejected when reconnecting gave up, and the
        stream's AioRpcError for a status that is not retriable."""
        while not self._closed:
            if self._native_stream is not None:
                try:
                    data, first, last = await anext(self._native_stream)
                except ProduceRejected as e:
                    ended = e.grpc_code == "ABORTED"  # taken over or deleted: as a gRPC stream's EOF
                    if self._closed or ended or not await self._resubscribe(e, e.retriable):
                        return
                    continue
                yield Delivery(data, first, last)
                continue
            try:
                response = await self._call.read()
            except grpc.aio.AioRpcError as e:
                if self._closed or not await self._resubscribe(e, retriable(e)):
                    return
                continue
            if response is grpc.aio.EOF:
                return
            r = response if isinstance(response, RecordsResponse) else response.records
            yield Delivery(r.data, r.first_offset, r.last_offset)

    async def _resubscribe(self, error: Exception, retried: bool) -> bool:
        """After the stream failed with `error`: raise it when it is not `retried`; else subscribe again
        (True), or, when the consumer was closed meanwhile, False."""
        if not retried:
            raise error
        try:
            await self._open(resubscribing=True)
        except ProduceRejected:
            if self._closed:
                return False
            raise
        return True

    async def records(self) -> AsyncIterator[frames.Record]:
        """Record by record (per-record Python objects: use batches() where throughput matters)."""
        async for d in self.batches():
            for record in frames.decode_records(d.data, verify=False):
                if record.offset >= self.start_offset:
                    yield record

    async def ack_cumulative(self, offset: int) -> None:
        await self._send_ack(fast.Acknowledge(up_to=offset))

    async def ack(self, offsets: Sequence[int]) -> None:
        await self._send_ack(fast.Acknowledge(offsets=list(offsets)))

    async def nack(self, offsets: Sequence[int], delay_ms: int | None = None) -> None:
        """Have the broker deliver again from the lowest of `offsets` (whole batches from the one holding
        it; records acknowledged one by one above it stay acknowledged), after `delay_ms`."""
        ack = fast.Acknowledge(nacks=list(offsets))
        if delay_ms is not None:
            ack.nack_delay_ms = delay_ms
        await self._send_ack(ack)

    async def _send_ack(self, ack: fast.Acknowledge) -> None:
        """An ack on a stream that just failed is dropped: the records come again after the reconnect, and
        the broker ignores acks of offsets it has not sent on the new stream yet."""
        async with self._write_lock:
            if self._native_stream is not None:
                with contextlib.suppress(ProduceRejected):  # the connection is gone: see above
                    self._native_stream.send_ack(ack.up_to if ack.HasField("up_to") else None,
                                                 list(ack.offsets), list(ack.nacks),
                                                 ack.nack_delay_ms if ack.HasField("nack_delay_ms") else 0)
                return
            await write_or_broken(self._call, fast.ConsumeRequest(ack=ack))

    async def close(self, timeout: float = 5.0) -> None:
        """Stop, and return once the broker ended the stream: it has then applied every ack sent, saved the
        cursor and released the subscription (another consumer may take it at once). Deliveries still on
        their way are dropped; they come again to the next consumer."""
        self._closed = True
        if self._native is not None:
            # GOODBYE: the broker ends the subscription (acks applied, cursor saved), then the connection.
            await self._native.aclose(timeout)
            await self._channel.close()
            return
        if not (self._call.done() or self._call.cancelled()):  # a task cancelled in read() cancels it
            async with self._write_lock:
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    await self._call.done_writing()
            with contextlib.suppress(grpc.aio.AioRpcError, TimeoutError):
                await asyncio.wait_for(self._drain(), timeout)
        self._call.cancel()
        await self._channel.close()

    async def _drain(self) -> None:
        while await self._call.read() is not grpc.aio.EOF:
            pass

    # -- following the topic --------------------------------------------------------------------------

    async def _open(self, *, resubscribing: bool) -> None:
        """Look the topic up and subscribe on the broker that serves it, retrying retriable refusals (the
        topic is being placed or moved) with a short backoff."""
        if resubscribing:
            self.reconnects += 1
            if self._call is not None:
                self._call.cancel()
            if self._native is not None:
                self._native.close()
                self._native = self._native_stream = None
        error: ProduceRejected | None = None
        for attempt in range(self._reconnect_tries):
            await asyncio.sleep(min(0.02 * attempt, 1.0))
            if self._closed:
                raise ProduceRejected("CANCELLED", "the consumer is closed")
            try:
                self._channel, self._target = await follow(self._channel, self._target, self.topic,
                                                           self._credentials, self._bootstrap)
                async with self._write_lock:
                    await self._subscribe()
                return
            except ProduceRejected as e:
                if not (e.retriable or (resubscribing and e.grpc_code in RESUBSCRIBE_CODES)):
                    raise
                error = e
        assert error is not None
        raise ProduceRejected(error.grpc_code, f"gave up subscribing after {self._reconnect_tries} tries: "
                                               f"{error}", True)

    async def _subscribe(self) -> None:
        address = await self._transport.native_for(self._channel, self._target)
        if address:
            await self._subscribe_native(address)
            return
        call = consume_method(self._channel)()
        try:
            await call.write(fast.ConsumeRequest(subscribe=fast.Subscribe(
                topic=self.topic, subscription=self.subscription, consumer_name=self.name,
                window_bytes=self._window, initial_position=self._position)))
            response = await first_answer(call, "subscribed", "subscribe the consumer")
        except grpc.aio.AioRpcError as e:  # the write failed: the broker is not there (yet)
            call.cancel()
            raise rejection(e, "subscribe the consumer") from e
        except BaseException:
            call.cancel()
            raise
        self._call = call
        self.start_offset = response.subscribed.start_offset
        self.consumer_id = response.subscribed.consumer_id

    async def _subscribe_native(self, address: str) -> None:
        conn = await NativeConnection.open(address, self._credentials)
        try:
            stream = await NativeConsumer.subscribe(conn, self.topic, self.subscription, self.name,
                                                    window_bytes=self._window,
                                                    earliest=self._position == fast.EARLIEST)
        except BaseException:
            await conn.aclose()
            raise
        self._native, self._native_stream = conn, stream
        self.start_offset, self.consumer_id = stream.start_offset, stream.consumer_id

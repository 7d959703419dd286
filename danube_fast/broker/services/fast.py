"""danube_fast.v1.FastProducer and FastConsumer: streams of record batches (proto/FastApi.proto,
docs/FORMAT.md).

Per stream: the first request opens a producer (the Danube API's topic and producer rules, C.4 and C.5);
then batches flow in and acks flow out in the same order. A reader task checks each batch and starts its
publish at once, so up to MAX_INFLIGHT batches of a stream are being appended or fsynced together (the WAL
groups them into one write and one fsync); the handler answers them in order as they complete. When
MAX_INFLIGHT are pending the reader stops reading, and gRPC's flow control holds the client back.

Checks per batch (no per-record Python work unless a batch is larger than the topic's max_message_size):
structure (and CRC where no WAL will check it), producer id in every batch header, max_message_size per
record. A batch that fails is answered with Rejected and nothing of it is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable

import grpc

from danube_fast import latency
from danube_fast.broker.clients import new_id
from danube_fast.broker.context import BrokerContext
from danube_fast.broker.dispatch.batches import BatchDispatcher
from danube_fast.broker.services.status import Context
from danube_fast.broker.topic import Topic
from danube_fast.broker.topic_registry import TopicRegistry
from danube_fast.codec import frames
from danube_fast.codec.fast_wire import (
    BatchRequest,
    decode_produce_request,
    encode_records_response,
    serialize_request,
)
from danube_fast.errors import ApiError, DanubeError, FrameCorrupt, invalid
from danube_fast.meta.resources import DeliveryMode
from danube_fast.names import check_name, parse_topic
from danube_fast.proto import FastApi_pb2 as fast
from danube_fast.proto import FastApi_pb2_grpc as fast_grpc

ProduceRequest = fast.ProduceRequest | BatchRequest  # as decode_produce_request reads them

MAX_INFLIGHT = 64  # batches per stream being published at once


class FastProducerService(fast_grpc.FastProducerServicer):
    # A Batch request's data is taken as a view into the message grpc received (fast_wire.py), not parsed
    # into a protobuf message and copied out of it again.
    request_decoders = {"Produce": decode_produce_request}

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self._topics = ctx.topics
        self._subscriptions = ctx.subscriptions

    async def Produce(self, request_iterator: AsyncIterator[ProduceRequest], context: Context
                      ) -> AsyncIterator[fast.ProduceResponse]:
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None:
            return
        try:
            topic, producer_id, name = await self._open(first)
        except DanubeError as e:
            await context.abort(grpc.StatusCode[e.grpc_code], str(e))
            return
        yield fast.ProduceResponse(opened=fast.Opened(producer_id=producer_id, reliable=topic.reliable))
        pending: asyncio.Queue[tuple[int, asyncio.Future[tuple[int, int, int]]] | None] = \
            asyncio.Queue(MAX_INFLIGHT)
        reader = asyncio.create_task(self._read(requests, topic, producer_id, name, pending))
        try:
            while (item := await pending.get()) is not None:
                seq, fut = item
                try:
                    # Shielded: a stream that dies while a batch is appended must not cut the append short
                    # (the batches after it would be stored, not it); the client's retry then finds it stored.
                    first_offset, last_offset, records = await asyncio.shield(fut)
                except DanubeError as e:
                    yield fast.ProduceResponse(rejected=fast.Rejected(
                        seq=seq, code=e.grpc_code, message=str(e), retriable=e.retriable))
                    continue
                yield fast.ProduceResponse(ack=fast.Ack(seq=seq, first_offset=first_offset,
                                                        last_offset=last_offset, records=records))
            await asyncio.wait([reader])
            error = None if reader.cancelled() else reader.exception()
            if isinstance(error, DanubeError):
                await context.abort(grpc.StatusCode[error.grpc_code], str(error))
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, DanubeError):
                await reader

    async def _open(self, request: ProduceRequest) -> tuple[Topic, int, str]:
        if isinstance(request, BatchRequest) or request.WhichOneof("kind") != "open":
            raise invalid("the first request of a Produce stream must be Open (topic, producer name)")
        req = request.open
        topic, producer_id = await open_producer(self._topics, req.topic, req.producer_name, req.reliable)
        return topic, producer_id, req.producer_name

    async def _read(self, requests: AsyncIterator[ProduceRequest], topic: Topic, producer_id: int, name: str,
                    pending: asyncio.Queue[tuple[int, asyncio.Future[tuple[int, int, int]]] | None]) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for request in requests:
                if isinstance(request, BatchRequest):
                    seq, data = request.seq, request.data  # a view into the request: not copied
                elif request.WhichOneof("kind") == "batch":
                    seq, data = request.batch.seq, request.batch.data
                else:
                    raise invalid("after Open, every request of a Produce stream must be a Batch")
                fut: asyncio.Future[tuple[int, int, int]]
                try:
                    records, sequenced = check_batch(data, topic, producer_id, name)
                except DanubeError as e:
                    fut = loop.create_future()
                    fut.set_exception(e)
                else:
                    append = functools.partial(publish, topic, data, records)
                    fut = topic.publish_once(name, sequenced, append)
                    # Should the client go first, nobody answers this one: its outcome is not an error here.
                    fut.add_done_callback(_retrieved)
                await pending.put((seq, fut))
        finally:
            await pending.put(None)


def _retrieved(fut: asyncio.Future[tuple[int, int, int]]) -> None:
    if not fut.cancelled():
        fut.exception()


async def open_producer(topics: TopicRegistry, topic_name: str, producer_name: str, reliable: bool
                        ) -> tuple[Topic, int]:
    """The topic (created per the Danube API's rules, docs/WIRE.md C.4) and the producer's id, ready for
    batches; any transport's fast producer opens this way."""
    check_name(producer_name, "Open.producer_name")  # before the topic is created
    delivery = DeliveryMode.RELIABLE if reliable else DeliveryMode.NON_RELIABLE
    topic = await topics.topic_for_producer(parse_topic(topic_name), delivery)
    if topic.schema_gate is not None:
        raise ApiError("FAILED_PRECONDITION", f"topic {topic.full} validates payloads against a schema: "
                                              "publish to it through the Danube API")
    producer_id = await topics.add_producer(topic, producer_name, 0)
    await topic.ready_for_batches()
    return topic, producer_id


async def publish(topic: Topic, data: bytes | memoryview, records: int,
                  stored: Callable[[int, int], None] | None = None) -> tuple[int, int, int]:
    started = time.perf_counter()
    first, last = await topic.publish_batch(data, records, stored)
    latency.PUBLISH_FAST.observe(time.perf_counter() - started)
    return first, last, records


def check_batch(data: bytes | memoryview, topic: Topic, producer_id: int, name: str
                ) -> tuple[int, tuple[int, int] | None]:
    """The batch's record count and, for a sequenced batch, its (session, sequence); or raise: structure
    (CRC too when no WAL checks it), the producer id in every header, a sequenced batch alone in its request
    and named for this stream's producer, max_message_size per record."""
    if not data:
        raise invalid("Batch.data is empty")
    try:
        headers = frames.scan_batches(data, verify=not topic.reliable)
    except FrameCorrupt as e:
        raise invalid(f"malformed record batch: {e}") from e
    limit = topic.policy.max_message_size
    records = 0
    sequenced = None
    for h in headers:
        if h.producer_id != producer_id:
            raise invalid(f"batch at byte {h.position} names producer {h.producer_id}, but this stream "
                          f"is producer {producer_id}")
        if h.session:
            if len(headers) != 1:
                raise invalid(f"batch at byte {h.position} is sequenced: a sequenced batch must be the only "
                              "one in its Batch request")
            if h.producer_name != name:
                raise invalid(f"the sequenced batch names producer {h.producer_name!r}, but this stream is "
                              f"producer {name!r}")
            sequenced = (h.session, h.sequence)
        records += h.record_count
        if limit and max(h.length, h.raw_size) > limit:  # a compressed batch: its records' size
            for r in frames.iter_records(memoryview(data)[h.position:h.end], verify=False):
                if len(r.payload) > limit:
                    raise invalid(f"a record of {len(r.payload)} bytes exceeds the max_message_size policy "
                                  f"of {topic.full} ({limit} bytes)")
    return records, sequenced


# Unacknowledged bytes per Consume stream when Subscribe names none (the client's default). Not the 16 MiB cap
# of [dispatch] window_bytes: a consumer catching up while the broker uploads read 4.2-4.8 M records/s with
# 8 MiB and 3.3-4.5 M with 16 MiB in one session (`python -m bench fast`, fast_consume_catchup, 2026-11-29).
DEFAULT_WINDOW = 8 * 1024 * 1024


class FastConsumerService(fast_grpc.FastConsumerServicer):
    """Consume: the holder of a BatchDispatcher (dispatch/batches.py). A reader task applies acks as they
    come; this handler sends Records while the window allows. The stream ends when the client stops
    writing or goes, when a Danube API consumer takes the subscription over, or at broker shutdown."""

    # Records go out as bytes written by fast_wire.py (the batches copied once, not twice through a message).
    response_serializers = {"Consume": serialize_request}

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self._topics = ctx.topics
        self._subscriptions = ctx.subscriptions

    async def Consume(self, request_iterator: AsyncIterator[fast.ConsumeRequest], context: Context
                      ) -> AsyncIterator[fast.ConsumeResponse | bytes]:
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None:
            return
        try:
            if first.WhichOneof("kind") != "subscribe":
                raise invalid("the first request of a Consume stream must be Subscribe")
            req = first.subscribe
            topic = self._topics.topic_for_consumer(parse_topic(req.topic))
            batches = await self._ctx.subscriptions.subscribe_batches(
                topic, req.subscription, req.consumer_name, earliest=req.initial_position == fast.EARLIEST)
        except DanubeError as e:
            await context.abort(grpc.StatusCode[e.grpc_code], str(e))
            return
        holder = new_id()
        batches.holder = holder
        window = req.window_bytes or DEFAULT_WINDOW  # next_records caps it at [dispatch] window_bytes
        reader = asyncio.create_task(_apply_acks(requests, batches))
        try:
            yield fast.ConsumeResponse(subscribed=fast.Subscribed(consumer_id=holder,
                                                                  start_offset=batches.floor + 1))
            while True:
                records = asyncio.ensure_future(batches.next_records(window))
                await asyncio.wait([records, reader], return_when=asyncio.FIRST_COMPLETED)
                if not records.done() or topic.subscriptions.get(req.subscription) is None or \
                        topic.subscriptions[req.subscription].dispatcher is not batches:
                    records.cancel()  # and consumer_lost() below voids it, should the cancel come too late
                    break
                got = records.result()
                if got is None:
                    break
                latency.observe_age(latency.DELIVERY_FAST, frames.parse_header(got[0]).base_timestamp)
                yield encode_records_response(*got)
            if reader.done() and not reader.cancelled() and isinstance(reader.exception(), DanubeError):
                error = reader.exception()
                assert isinstance(error, DanubeError)
                await context.abort(grpc.StatusCode[error.grpc_code], str(error))
            if batches.moved:  # an operator moved the subscription: resubscribing starts at its position
                await context.abort(grpc.StatusCode.UNAVAILABLE, batches.moved)
            if self._subscriptions.stopping or self._topics.find(topic.full) is not topic:
                # Not the end of the subscription: the client looks the topic up and subscribes again.
                why = "the broker is stopping" if self._subscriptions.stopping else \
                    "the topic left this broker"
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    f"{why}: look {topic.full} up again and resubscribe")
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, DanubeError, grpc.aio.AioRpcError):
                await reader
            if batches.holder == holder:
                batches.holder = 0
                batches.consumer_lost()
                with contextlib.suppress(DanubeError):
                    await batches.save_cursor()


async def _apply_acks(requests: AsyncIterator[fast.ConsumeRequest], batches: BatchDispatcher) -> None:
    async for request in requests:
        if request.WhichOneof("kind") != "ack":
            raise invalid("after Subscribe, every request of a Consume stream must be Acknowledge")
        ack = request.ack
        batches.acknowledge(ack.up_to if ack.HasField("up_to") else None, list(ack.offsets))
        if ack.nacks:
            batches.nack(min(ack.nacks), ack.nack_delay_ms if ack.HasField("nack_delay_ms") else None)


class FastTransportsService(fast_grpc.FastTransportsServicer):
    """Where this broker serves the native transport (services/native.py), for clients choosing one."""

    def __init__(self, native_address: str, tls: bool) -> None:
        self._answer = fast.NativeResponse(address=native_address, tls=tls)

    async def Native(self, request: fast.NativeRequest, context: Context) -> fast.NativeResponse:
        return self._answer

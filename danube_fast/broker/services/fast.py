"""danube_fast.v1.FastProducer: streams of record batches (proto/FastApi.proto, docs/FORMAT.md).

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
from collections.abc import AsyncIterator

import grpc

from danube_fast import frames
from danube_fast.broker.errors import ApiError, invalid
from danube_fast.broker.names import parse_topic
from danube_fast.broker.services.status import Context
from danube_fast.broker.topic import Topic
from danube_fast.broker.topics import Topics
from danube_fast.errors import DanubeError, FrameCorrupt
from danube_fast.meta.resources import DeliveryMode
from danube_fast.proto import FastApi_pb2 as fast
from danube_fast.proto import FastApi_pb2_grpc as fast_grpc

MAX_INFLIGHT = 64  # batches per stream being published at once


class FastProducerService(fast_grpc.FastProducerServicer):
    def __init__(self, topics: Topics) -> None:
        self._topics = topics

    async def Produce(self, request_iterator: AsyncIterator[fast.ProduceRequest], context: Context
                      ) -> AsyncIterator[fast.ProduceResponse]:
        requests = aiter(request_iterator)
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            return
        try:
            topic, producer_id = await self._open(first)
        except DanubeError as e:
            await context.abort(grpc.StatusCode[e.grpc_code], str(e))
            return
        yield fast.ProduceResponse(opened=fast.Opened(producer_id=producer_id, reliable=topic.reliable))
        pending: asyncio.Queue[tuple[int, asyncio.Future[tuple[int, int, int]]] | None] = \
            asyncio.Queue(MAX_INFLIGHT)
        reader = asyncio.create_task(self._read(requests, topic, producer_id, pending))
        try:
            while (item := await pending.get()) is not None:
                seq, fut = item
                try:
                    first_offset, last_offset, records = await fut
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

    async def _open(self, request: fast.ProduceRequest) -> tuple[Topic, int]:
        if request.WhichOneof("kind") != "open":
            raise invalid("the first request of a Produce stream must be Open (topic, producer name)")
        req = request.open
        if not req.producer_name:
            raise invalid("Open.producer_name is empty: name the producer")
        delivery = DeliveryMode.RELIABLE if req.reliable else DeliveryMode.NON_RELIABLE
        topic = await self._topics.topic_for_producer(parse_topic(req.topic), delivery)
        if topic.schema_gate is not None:
            raise ApiError("FAILED_PRECONDITION", f"topic {topic.full} validates payloads against a schema: "
                                                  "publish to it through the Danube API")
        return topic, await self._topics.add_producer(topic, req.producer_name, 0)

    async def _read(self, requests: AsyncIterator[fast.ProduceRequest], topic: Topic, producer_id: int,
                    pending: asyncio.Queue[tuple[int, asyncio.Future[tuple[int, int, int]]] | None]) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for request in requests:
                if request.WhichOneof("kind") != "batch":
                    raise invalid("after Open, every request of a Produce stream must be a Batch")
                batch = request.batch
                fut: asyncio.Future[tuple[int, int, int]]
                try:
                    records = _check(batch.data, topic, producer_id)
                except DanubeError as e:
                    fut = loop.create_future()
                    fut.set_exception(e)
                else:
                    fut = asyncio.ensure_future(_publish(topic, batch.data, records))
                await pending.put((batch.seq, fut))
        finally:
            await pending.put(None)


async def _publish(topic: Topic, data: bytes, records: int) -> tuple[int, int, int]:
    first, last = await topic.publish_batch(data, records)
    return first, last, records


def _check(data: bytes, topic: Topic, producer_id: int) -> int:
    """The batch's record count, or raise: structure (CRC too when no WAL checks it), the producer id in
    every header, max_message_size per record."""
    if not data:
        raise invalid("Batch.data is empty")
    try:
        headers = frames.scan_batches(data, verify=topic.wal is None)
    except FrameCorrupt as e:
        raise invalid(f"malformed record batch: {e}") from e
    limit = topic.policy.max_message_size
    records = 0
    for h in headers:
        if h.producer_id != producer_id:
            raise invalid(f"batch at byte {h.position} names producer {h.producer_id}, but this stream "
                          f"is producer {producer_id}")
        records += h.record_count
        if limit and h.length > limit:
            for r in frames.iter_records(memoryview(data)[h.position:h.end], verify=False):
                if len(r.payload) > limit:
                    raise invalid(f"a record of {len(r.payload)} bytes exceeds the max_message_size policy "
                                  f"of {topic.full} ({limit} bytes)")
    return records

"""danube_fast.v1.FastReader: a Reliable topic's record batches by offset range, read-only
(proto/FastApi.proto).

For a Spark data source and for tools that must look without touching: no subscription, no cursor, no
metadata write. A read goes through the topic's `log` (storage/tiered.py: object tier -> WAL -> the
committed tail), the same `read`/`cached` path the batch dispatcher uses (dispatch/batches.py), so it sees
exactly what a consumer would: everything committed, whether uploaded yet or not, and nothing more.

Bounds: the end of a Read is fixed when the call starts (at most the committed offset then), so a Read never
waits for records. The handler is an async generator: gRPC pulls the next response only once the previous
one was sent, so one stream holds at most one response (max_bytes, capped at MAX_READ_BYTES, or one batch
larger than that) and the read it is built from. Disk reads run in the WAL's executor and object reads in
the object store's, as for consumers; joining what else is committed only takes what the WAL's cache
holds. Between two responses the handler checks that the topic is still this broker's and the broker is
not stopping; if not, the stream ends with UNAVAILABLE, as a fast consumer's does, and the client resumes
after the last offset it got. The native transport's READ (services/native.py) serves the same reads with
the helpers below.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

import grpc

from danube_fast.broker.context import BrokerContext
from danube_fast.broker.services.status import Context, unary
from danube_fast.broker.topic import ReliableTopic
from danube_fast.broker.topic_registry import TopicRegistry
from danube_fast.codec.fast_wire import encode_read_response, records_data, serialize_request
from danube_fast.errors import ApiError, DanubeError, OffsetOutOfRange, invalid
from danube_fast.names import parse_topic
from danube_fast.proto import FastApi_pb2 as fast
from danube_fast.proto import FastApi_pb2_grpc as fast_grpc
from danube_fast.storage import file_span
from danube_fast.storage.file_span import FileSpan
from danube_fast.storage.objects.format import Buffer, clip_batches
from danube_fast.storage.tiered import READ_BYTES, ReadableLog

# Bytes per response when ReadRequest.max_bytes is 0: the dispatchers' read size, well under a plain gRPC
# client's 4 MiB receive limit (a 4 MiB default would overflow it by the message's own few bytes).
DEFAULT_READ_BYTES = READ_BYTES
MAX_READ_BYTES = 16 * 1024 * 1024  # a client asking more gets this: one stream holds one response at a time


class FastReaderService(fast_grpc.FastReaderServicer):
    # Read responses go out as bytes written by fast_wire.py (the batches copied once, not twice).
    response_serializers = {"Read": serialize_request}

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self._topics = ctx.topics
        self._subscriptions = ctx.subscriptions
        self._reads = ctx.reads

    @unary
    async def Offsets(self, request: fast.OffsetsRequest, context: Context) -> fast.OffsetsResponse:
        log = self._readable(request.topic)[1]
        return fast.OffsetsResponse(start_offset=log.start_offset, next_offset=log.committed_offset)

    async def Read(self, request: fast.ReadRequest, context: Context) -> AsyncIterator[bytes]:
        try:
            topic, log = self._readable(request.topic)
            low, end = read_range(request, log)
        except DanubeError as e:
            await context.abort(grpc.StatusCode[e.grpc_code], str(e))
            return
        room = read_room(request.max_bytes)
        while low < end:
            if self._subscriptions.stopping or self._topics.find(topic.full) is not topic:
                # As for a fast consumer: not the end of the read, the client looks the topic up again.
                why = "the broker is stopping" if self._subscriptions.stopping else \
                    "the topic left this broker"
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    f"{why}: look {topic.full} up again and read on from offset {low}")
            held = await self._reads.reserve(room)  # released once gRPC took the response
            try:
                got = await next_chunks(log, low, end, room)
                if got is None:
                    return
                chunks, first, next_offset = got
                held.grow(sum(len(c) for c in chunks))
                yield encode_read_response(records_data(cast("list[Buffer]", chunks)), first, next_offset - 1)
            finally:
                held.release()
            low = next_offset

    def _readable(self, name: str) -> tuple[ReliableTopic, ReadableLog]:
        return readable(self._topics, name)


def readable(topics: TopicRegistry, name: str) -> tuple[ReliableTopic, ReadableLog]:
    """The topic and what it is read through; INVALID_ARGUMENT for a bad name or an unknown topic,
    UNAVAILABLE when another broker serves it, FAILED_PRECONDITION when it is NonReliable."""
    topic = topics.topic_for_consumer(parse_topic(name)).require_stored("FastReader reads Reliable topics")
    return topic, topic.log


def read_room(max_bytes: int) -> int:
    """Bytes per response for a client asking `max_bytes` (0: the default)."""
    return min(max_bytes or DEFAULT_READ_BYTES, MAX_READ_BYTES)


def read_range(request: fast.ReadRequest, log: ReadableLog) -> tuple[int, int]:
    """[low, end) to send: `end` is to_offset (0: the committed offset), never past the committed offset."""
    committed = log.committed_offset
    low = request.from_offset
    if request.to_offset and request.to_offset < low:
        raise invalid(f"ReadRequest.to_offset {request.to_offset} is below from_offset {low}: "
                      "the range is [from_offset, to_offset), to_offset 0 meaning the committed end")
    end = min(request.to_offset or committed, committed)
    start = log.start_offset
    if low < start and low < end:
        raise _out_of_range(low, start)
    return low, end


def _out_of_range(offset: int, start: int) -> ApiError:
    return ApiError("OUT_OF_RANGE", f"offset {offset} is no longer stored: the first readable offset is "
                                    f"{start} (retention deleted what came before)")


async def next_chunks(log: ReadableLog, low: int, end: int, room: int, spans: bool = False
                      ) -> tuple[list[Buffer | FileSpan], int, int] | None:
    """The whole batches holding offsets from `low` (or the next offset a tier holds) below `end`, within
    `room` bytes but at least one batch: (chunks of them, first offset of the first batch, offset after the
    last record). None when nothing of [low, end) is left to send. `spans`: batches read from a segment file
    may come as a FileSpan (the native transport sends them with sendfile: storage/file_span.py)."""
    try:
        got = await (log.read_span(low, room) if spans else log.read(low, room))
        if got is not None and isinstance(got[0], FileSpan):
            if got[1] <= end:
                return [got[0]], file_span.first_batch(got[0])[0], got[1]
            got[0].close()  # the range ends inside it: clipped in memory
            got = await log.read(low, room)
    except OffsetOutOfRange as e:  # retention deleted it since the call started (no object tier below)
        raise _out_of_range(low, log.start_offset) from e
    if got is None:
        return None
    chunk, next_offset = clip_batches(cast("Buffer", got[0]), low, end, room, whole=True)
    if not chunk:
        return None  # what the read found starts at or past `end` (the range's rest was a hole)
    chunks: list[Buffer | FileSpan] = [chunk]
    size = len(chunk)
    # A read at the tail answers one group commit: join what more the cache holds (no disk read here), as
    # the batch dispatcher does, so that one response carries up to `room`.
    while size < room and next_offset < end:
        more = log.cached(next_offset, room - size)
        if more is None:
            break
        chunk, after = clip_batches(more[0], next_offset, end, room - size, whole=False)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        next_offset = after
    return chunks, file_span.first_batch(chunks[0])[0], next_offset

"""The fast client's rule for stream failures (danube_fast/client/status.py): grpc's own words for a broken
transport are retried; a status the server chose, INTERNAL and UNKNOWN included, is reported at once.

The table pins the rule. The servers are real grpc.aio servers on free loopback ports, standing in for a
broker that refuses deliberately (its storage failed, its handler raised): the client must report such a
refusal with the server's status after exactly one attempt. Losing the connection itself is the subject of
tests/compat/test_fast_crash.py (a broker subprocess SIGKILLed).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from danube_fast.client import FastConsumer, FastProducer, ProduceRejected
from danube_fast.client.status import retriable, write_or_broken
from danube_fast.proto import FastApi_pb2 as fast
from danube_fast.proto import FastApi_pb2_grpc as fast_grpc

Code = grpc.StatusCode


@pytest.mark.parametrize(("code", "details", "expected"), [
    # A transport failure, as grpc 1.85 words it (measured: tests/compat/test_fast_crash.py's kills).
    (Code.UNAVAILABLE, "Stream removed (Socket closed)", True),
    (Code.INTERNAL, "Internal error from Core", True),
    (Code.INTERNAL, "Received RST_STREAM with error code 2", True),
    (Code.UNKNOWN, "Stream removed", True),
    (Code.INTERNAL, "Received unexpected EOS on DATA frame from server", True),
    # The broker's answers: UNAVAILABLE and RESOURCE_EXHAUSTED pass; the rest is its decision.
    (Code.UNAVAILABLE, "the broker is stopping: look /default/t up again and resubscribe", True),
    (Code.RESOURCE_EXHAUSTED, "topic /default/t has reached max_producers_per_topic (1)", True),
    (Code.INTERNAL, "the WAL of /default/t cannot be opened: [Errno 28] No space left on device", False),
    (Code.INTERNAL, "", False),
    (Code.UNKNOWN, "Unexpected <class 'RuntimeError'>: a bug", False),
    (Code.INVALID_ARGUMENT, "Internal error from Core", False),  # only INTERNAL and UNKNOWN are read
    (Code.FAILED_PRECONDITION, "Producer requested dispatch strategy does not match topic strategy", False),
    (Code.CANCELLED, "Locally cancelled by application!", False),
])
def test_the_rule(code: grpc.StatusCode, details: str, expected: bool) -> None:
    error = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)
    assert retriable(error) is expected


Handler = Callable[[AsyncIterator[Any], grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]


class Broker(fast_grpc.FastProducerServicer, fast_grpc.FastConsumerServicer):
    """Both fast services, each stream handled by `handler`; `streams` counts the streams opened."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.streams = 0

    async def Produce(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        self.streams += 1
        async for response in self.handler(request_iterator, context):
            yield response

    async def Consume(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        self.streams += 1
        async for response in self.handler(request_iterator, context):
            yield response


async def serve(broker: Broker) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    fast_grpc.add_FastProducerServicer_to_server(broker, server)  # type: ignore[no-untyped-call]
    fast_grpc.add_FastConsumerServicer_to_server(broker, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def storage_failed(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    await anext(aiter(requests))
    await context.abort(Code.INTERNAL, "the WAL of /default/t cannot be opened: [Errno 5] I/O error")
    yield  # a generator, as the broker's handlers are


async def handler_raised(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    await anext(aiter(requests))
    raise RuntimeError("a bug")
    yield


async def fails_the_first_batch(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    """Opens the producer, then ends the stream with INTERNAL on its first batch (nothing else in flight)."""
    stream = aiter(requests)
    await anext(stream)
    yield fast.ProduceResponse(opened=fast.Opened(producer_id=7, reliable=True))
    await anext(stream)
    await context.abort(Code.INTERNAL, "the WAL failed an fsync")


@pytest.mark.parametrize(("handler", "code"), [(storage_failed, "INTERNAL"), (handler_raised, "UNKNOWN")])
def test_a_refused_open_or_subscribe_is_reported_at_once(run: Callable[..., Any], handler: Handler,
                                                         code: str) -> None:
    async def scenario() -> None:
        broker = Broker(handler)
        server, target = await serve(broker)
        try:
            with pytest.raises(ProduceRejected) as producer:
                await FastProducer.connect(target, "/default/t", "p")
            with pytest.raises(ProduceRejected) as consumer:
                await FastConsumer.connect(target, "/default/t", "s", "c")
        finally:
            await server.stop(0)
        for refused in (producer.value, consumer.value):
            assert (refused.grpc_code, refused.retriable) == (code, False), refused
        assert broker.streams == 2, "a refusal was retried"

    run(scenario(), timeout=20)


def test_an_internal_status_on_an_open_stream_fails_the_producer_at_once(run: Callable[..., Any]) -> None:
    async def scenario() -> None:
        broker = Broker(fails_the_first_batch)
        server, target = await serve(broker)
        try:
            producer = await FastProducer.connect(target, "/default/t", "p")
            batch = await producer.send_batch([b"x"])
            with pytest.raises(ProduceRejected) as refused:
                await asyncio.wait_for(batch, 5)
            assert (refused.value.grpc_code, refused.value.retriable) == ("INTERNAL", False), refused.value
            assert "fsync" in str(refused.value)
            assert broker.streams == 1, "the producer reconnected after a status the server chose"
            await producer.close()
        finally:
            await server.stop(0)

    run(scenario(), timeout=20)



async def opens_then_stops_reading(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    """Opens the producer, then reads nothing more: flow control soon holds the client's writes."""
    await anext(aiter(requests))
    yield fast.ProduceResponse(opened=fast.Opened(producer_id=7, reliable=True))
    await asyncio.sleep(60)


async def write_until_held(call: Any, write: Callable[..., Any]) -> tuple[asyncio.Task[Any], int]:
    """Start writing 1 MiB batches on `call` with `write` until one is held by flow control (not done in
    0.3 s); that write's task and how many went before it."""
    batch = fast.ProduceRequest(batch=fast.Batch(seq=1, data=bytes(1 << 20)))
    for written in range(200):
        task = asyncio.create_task(write(call, batch))
        done, _ = await asyncio.wait([task], timeout=0.3)
        if not done:
            return task, written
        task.result()
    raise AssertionError("200 MiB written and flow control never held a write")


def test_a_write_on_a_stream_this_client_cancelled_is_a_broken_stream(run: Callable[..., Any]) -> None:
    """A producer's reader cancels its stream when the topic moves, while another task may be waiting in a
    write on it: grpc.aio raises CancelledError in that write (the cluster bench's moves under traffic ended
    in it). write_or_broken reports a broken stream instead; a cancellation of the writing task itself still
    goes through."""

    async def raw_write(call: Any, request: Any) -> bool:
        await call.write(request)
        return True

    async def scenario() -> None:
        server, target = await serve(Broker(opens_then_stops_reading))
        channel = grpc.aio.insecure_channel(target)
        opening = fast.ProduceRequest(open=fast.Open(topic="/default/t", producer_name="p"))
        try:
            stub: Any = fast_grpc.FastProducerStub(channel)  # type: ignore[no-untyped-call]
            outcomes = []
            for write in (raw_write, write_or_broken):
                call = stub.Produce()
                assert await write_or_broken(call, opening)
                await call.read()
                held, _ = await write_until_held(call, write)
                call.cancel()  # as the reader does when it switches to a new stream
                outcomes.append((await asyncio.gather(held, return_exceptions=True))[0])
            assert isinstance(outcomes[0], asyncio.CancelledError), outcomes  # what grpc does
            assert outcomes[1] is False, outcomes

            call = stub.Produce()
            assert await write_or_broken(call, opening)
            await call.read()
            held, _ = await write_until_held(call, write_or_broken)
            held.cancel()  # the writing task itself is cancelled: that goes through
            with pytest.raises(asyncio.CancelledError):
                await held
            call.cancel()
        finally:
            await channel.close()
            await server.stop(0)

    run(scenario(), timeout=60)

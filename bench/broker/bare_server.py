"""The baseline of `python -m bench broker`: a bare grpc.aio server with the broker's method shapes and
nothing behind them. Run as `python -m bench.broker.bare_server --port PORT`; prints one `bare server ready`
line on stdout when it serves and stops cleanly on SIGTERM.

- `danube.ProducerService/SendMessage` answers `MessageResponse(request_id=...)` at once: what a unary RPC
  costs on its own, the floor for a publish.
- `danube.ConsumerService/ReceiveMessages` streams `consumer_id` prebuilt StreamMessages (256 B payloads, the
  fields the broker fills in on a delivery) and ends: the floor for delivering messages on a stream.
- `danube_fast.v1.FastProducer/Produce` acknowledges every batch at once, and `FastConsumer/Consume` streams
  prebuilt batches: the floors of the fast API.

Same server options and event loop (uvloop) as the broker's client API server (danube_fast.broker.server).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc
import uvloop

from danube_fast import frames as fast_frames
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc
from danube_fast.proto import FastApi_pb2 as fast
from danube_fast.proto import FastApi_pb2_grpc as fast_grpc

READY = "bare server ready"
PAYLOAD_BYTES = 256
POOL = 1024  # distinct prebuilt messages the stream cycles through
MAX_RECEIVE = 64 * 1024 * 1024  # the broker's client API server's inbound limit with default settings
TOPIC = "/default/bare"
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


def stream_pool(broker_addr: str) -> list[pb.StreamMessage]:
    """Messages as the broker delivers them: msg_id with offset, payload, publish time, producer name."""
    payload = bytes(range(256)) * (PAYLOAD_BYTES // 256) + bytes(PAYLOAD_BYTES % 256)
    return [pb.StreamMessage(request_id=i + 1, payload=payload, publish_time=1_700_000_000_000 + i,
                             producer_name="bare-producer",
                             msg_id=pb.MsgID(producer_id=1, topic_name=TOPIC, broker_addr=broker_addr,
                                             topic_offset=i))
            for i in range(POOL)]


class BareProducer(pb_grpc.ProducerServiceServicer):
    async def SendMessage(self, request: pb.StreamMessage, context: Context) -> pb.MessageResponse:
        return pb.MessageResponse(request_id=request.request_id)


class BareConsumer(pb_grpc.ConsumerServiceServicer):
    def __init__(self, pool: list[pb.StreamMessage]) -> None:
        self._pool = pool

    async def ReceiveMessages(self, request: pb.ReceiveRequest, context: Context
                              ) -> AsyncIterator[pb.StreamMessage]:
        pool = self._pool
        for i in range(request.consumer_id):  # the message count rides in consumer_id
            yield pool[i % POOL]


class BareFast(fast_grpc.FastProducerServicer):
    """The fast API's Produce with nothing behind it: every batch is acknowledged at once."""

    async def Produce(self, request_iterator: AsyncIterator[fast.ProduceRequest], context: Any
                      ) -> AsyncIterator[fast.ProduceResponse]:
        async for request in request_iterator:
            if request.WhichOneof("kind") == "open":
                yield fast.ProduceResponse(opened=fast.Opened(producer_id=1, reliable=request.open.reliable))
            else:
                yield fast.ProduceResponse(ack=fast.Ack(seq=request.batch.seq))


class BareFastConsumer(fast_grpc.FastConsumerServicer):
    """The fast API's Consume with nothing behind it: after Subscribe, streams `window_bytes` (used as a
    count here) prebuilt Records of 1,000 256-byte records each, ignoring acks."""

    def __init__(self) -> None:
        one = fast_frames.encode_payloads([b"r" * PAYLOAD_BYTES] * 1000, producer_id=1, producer_name="bare")
        self._records = fast.ConsumeResponse(records=fast.Records(data=one, first_offset=0, last_offset=999))

    async def Consume(self, request_iterator: AsyncIterator[fast.ConsumeRequest], context: Any
                      ) -> AsyncIterator[fast.ConsumeResponse]:
        first = await anext(aiter(request_iterator))
        yield fast.ConsumeResponse(subscribed=fast.Subscribed(consumer_id=1))
        for _ in range(first.subscribe.window_bytes):
            yield self._records


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", MAX_RECEIVE),
        ("grpc.so_reuseport", 0),
    ])
    pb_grpc.add_ProducerServiceServicer_to_server(BareProducer(), server)  # type: ignore[no-untyped-call]
    pb_grpc.add_ConsumerServiceServicer_to_server(  # type: ignore[no-untyped-call]
        BareConsumer(stream_pool(f"http://127.0.0.1:{port}")), server)
    fast_grpc.add_FastProducerServicer_to_server(BareFast(), server)  # type: ignore[no-untyped-call]
    fast_grpc.add_FastConsumerServicer_to_server(BareFastConsumer(), server)  # type: ignore[no-untyped-call]
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    if bound == 0:
        raise SystemExit(f"bare server: cannot listen on 127.0.0.1:{port}")
    await server.start()
    print(f"{READY} on 127.0.0.1:{bound}", flush=True)
    await stopping.wait()
    await server.stop(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.broker.bare_server")
    parser.add_argument("--port", type=int, required=True)
    uvloop.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()

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

from danube_fast.codec import frames as fast_frames
from danube_fast.codec.fast_wire import encode_records_response, serialize_request
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


def consume_topic(record_bytes: int = PAYLOAD_BYTES, batch_records: int = 1000) -> str:
    """The topic a bare Consume subscribes to for batches of `batch_records` records of `record_bytes`."""
    return f"{TOPIC}-{record_bytes}x{batch_records}"


class BareFastConsumer:
    """The fast API's Consume with nothing behind it: after Subscribe, streams `window_bytes` (used as a
    count here) prebuilt Records of the shape the topic names (`consume_topic`; any other topic: 1,000
    256-byte records), ignoring acks. The responses are encoded once and sent as bytes, as the broker
    sends them (fast_wire.encode_records_response)."""

    async def Consume(self, request_iterator: AsyncIterator[fast.ConsumeRequest], context: Any
                      ) -> AsyncIterator[fast.ConsumeResponse | bytes]:
        first = await anext(aiter(request_iterator))
        size, _, count = first.subscribe.topic.removeprefix(f"{TOPIC}-").partition("x")
        shape = (int(size), int(count)) if size.isdigit() and count.isdigit() else (PAYLOAD_BYTES, 1000)
        one = fast_frames.encode_payloads([b"r" * shape[0]] * shape[1], producer_id=1, producer_name="bare")
        records = encode_records_response(one, 0, shape[1] - 1)
        yield fast.ConsumeResponse(subscribed=fast.Subscribed(consumer_id=1))
        for _ in range(first.subscribe.window_bytes):
            yield records

    def handler(self) -> grpc.GenericRpcHandler:
        consume = grpc.stream_stream_rpc_method_handler(
            self.Consume, request_deserializer=fast.ConsumeRequest.FromString,
            response_serializer=serialize_request)
        return grpc.method_handlers_generic_handler("danube_fast.v1.FastConsumer", {"Consume": consume})


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
    server.add_generic_rpc_handlers((BareFastConsumer().handler(),))
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

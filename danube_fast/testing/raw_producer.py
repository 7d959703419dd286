"""A Produce stream of the fast API driven by hand, for tests that must decide exactly which batch is sent
(again) and when: no batching, no resend, no reconnect of its own (FastProducer does all three).

`RawProducer.open(target, topic, name)` follows the topic to the broker that serves it (as the clients do)
and opens the stream, looking up again while the broker answers UNAVAILABLE (a topic being placed after a
move, for up to OPEN_RETRY_S: on a busy machine that takes a while); `send(seq, data)` writes one Batch
request and returns the broker's answer (an Ack or a Rejected). `batch(payloads, sequence)` encodes a batch
stamped with this stream's producer id, sequenced in `session` when a sequence is given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc

from danube_fast.client.lookup import CHANNEL_OPTIONS, follow
from danube_fast.client.producer import produce_method
from danube_fast.codec import frames
from danube_fast.codec.fast_wire import encode_batch_request
from danube_fast.proto import FastApi_pb2 as fast

OPEN_RETRY_S = 30.0


class RawProducer:
    def __init__(self, channel: grpc.aio.Channel, call: Any, name: str, producer_id: int, session: int
                 ) -> None:
        self.channel = channel
        self.name = name
        self.producer_id = producer_id
        self.session = session
        self._call = call

    @classmethod
    async def open(cls, target: str, topic: str, name: str, *, session: int = 0x5EED) -> RawProducer:
        deadline = asyncio.get_running_loop().time() + OPEN_RETRY_S
        while True:
            try:
                return await cls._open(target, topic, name, session)
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or asyncio.get_running_loop().time() > deadline:
                    raise
            await asyncio.sleep(0.2)

    @classmethod
    async def _open(cls, target: str, topic: str, name: str, session: int) -> RawProducer:
        channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        try:
            channel, target = await follow(channel, target, topic, None)
            call = produce_method(channel)()
            request = fast.ProduceRequest(open=fast.Open(topic=topic, producer_name=name, reliable=True))
            await call.write(request)
            opened = await call.read()
        except BaseException:
            await channel.close()
            raise
        if opened is grpc.aio.EOF or opened.WhichOneof("kind") != "opened":
            await channel.close()
            raise AssertionError(f"the broker did not open the stream: {opened}")
        return cls(channel, call, name, opened.opened.producer_id, session)

    def batch(self, payloads: Sequence[bytes], sequence: int = 0) -> bytes:
        data: bytes = frames.encode_payloads(list(payloads), producer_id=self.producer_id,
                                             producer_name=self.name, session=self.session if sequence else 0,
                                             sequence=sequence)
        return data

    async def send(self, seq: int, data: bytes) -> fast.ProduceResponse:
        await self._call.write(encode_batch_request(seq, data))
        response: fast.ProduceResponse = await self._call.read()
        return response

    async def offsets(self, seq: int, data: bytes) -> tuple[int, int]:
        """send(), which must be acknowledged: the batch's (first, last) offsets."""
        response = await self.send(seq, data)
        if response.WhichOneof("kind") != "ack":
            raise AssertionError(f"batch {seq} was not acknowledged: {response}")
        return response.ack.first_offset, response.ack.last_offset

    async def close(self) -> None:
        await self.channel.close()

"""FastConsumer: a Reliable subscription's records as whole batches on one Consume stream.

`batches()` yields `Delivery(data, first_offset, last_offset)`: record batches straight from the broker's
WAL (docs/FORMAT.md); decode them with `danube_fast.frames` (`decode_records`, or `decode_arrow` for a
pyarrow RecordBatch), skipping offsets below `start_offset` (a batch is delivered whole). `records()` does
that for you, one Record at a time. Acknowledge with `ack_cumulative(offset)` (everything up to it) or
`ack(offsets)`; the broker sends more while the unacknowledged bytes stay under `window_bytes`.
Unacknowledged records come again after a reconnect (at least once).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from danube_fast import frames
from danube_fast.client.producer import CHANNEL_OPTIONS, first_answer
from danube_fast.proto import FastApi_pb2 as fast
from danube_fast.proto import FastApi_pb2_grpc as fast_grpc


@dataclass(frozen=True)
class Delivery:
    data: bytes
    first_offset: int
    last_offset: int


class FastConsumer:
    def __init__(self, channel: grpc.aio.Channel, call: Any, start_offset: int, consumer_id: int) -> None:
        self._channel = channel
        self._call = call
        self.start_offset = start_offset
        self.consumer_id = consumer_id
        self._write_lock = asyncio.Lock()

    @classmethod
    async def connect(cls, target: str, topic: str, subscription: str, name: str, *,
                      window_bytes: int = 8 << 20) -> FastConsumer:
        channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        try:
            stub: Any = fast_grpc.FastConsumerStub(channel)  # type: ignore[no-untyped-call]
            call = stub.Consume()
            await call.write(fast.ConsumeRequest(subscribe=fast.Subscribe(
                topic=topic, subscription=subscription, consumer_name=name, window_bytes=window_bytes)))
            response = await first_answer(call, "subscribed", "subscribe the consumer")
        except BaseException:
            await channel.close()
            raise
        return cls(channel, call, response.subscribed.start_offset, response.subscribed.consumer_id)

    async def batches(self) -> AsyncIterator[Delivery]:
        """Deliveries until the broker ends the stream (it stops, or the subscription was taken over)."""
        while True:
            response = await self._call.read()
            if response is grpc.aio.EOF:
                return
            r = response.records
            yield Delivery(r.data, r.first_offset, r.last_offset)

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
        async with self._write_lock:
            await self._call.write(fast.ConsumeRequest(ack=ack))

    async def close(self, timeout: float = 5.0) -> None:
        """Stop, and return once the broker ended the stream: it has then applied every ack sent, saved the
        cursor and released the subscription (another consumer may take it at once). Deliveries still on
        their way are dropped; they come again to the next consumer."""
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

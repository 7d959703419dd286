"""The raw-socket ceiling of `python -m bench fast`: a bare uvloop server speaking the native transport's
frames (docs/TRANSPORT.md) with nothing behind them. Run as `python -m bench.broker.bare_native --port PORT`;
prints one `bare native server ready` line on stdout when it serves and stops cleanly on SIGTERM.

- HELLO gets a WELCOME as the broker's (64 MiB unacknowledged per connection), PRODUCE_OPEN a producer id,
  and each PRODUCE an ACK at once (offsets counted per connection): what the same NativeProducer reaches
  when nothing is checked, appended or synced.
- SUBSCRIBE gets SUBSCRIBED, then one prebuilt RECORDS frame again and again, written whenever the transport
  takes more: the floor of a native consumer's reads. The frame holds a batch of the shape the topic names
  as the bare gRPC server's do (`bare_server.consume_topic`: `...-{record_bytes}x{records}`), else of
  RECORDS_PER_FRAME records of RECORD_BYTES. Acknowledgements are read and ignored.

Same receive path (transport/receiver.py) and event loop (uvloop) as the broker's listener
(broker/services/native.py), so the figures against it are what the broker itself costs.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import signal
from typing import cast

import uvloop

from danube_fast.codec import frames as codec
from danube_fast.transport import frames
from danube_fast.transport.frames import Frame, FrameType
from danube_fast.transport.receiver import FrameReceiver

READY = "bare native server ready"
MAX_INFLIGHT_BYTES = 64 * 1024 * 1024  # as the broker's listener tells in WELCOME
RECORDS_PER_FRAME = 1000
RECORD_BYTES = 256


class BareConnection(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        self._receiver = FrameReceiver(self._frame)
        self._transport: asyncio.Transport | None = None
        self._next = 0  # the next offset a PRODUCE gets
        self._writable = asyncio.Event()
        self._writable.set()
        self._streams: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        for task in self._streams:
            task.cancel()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._receiver.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._receiver.buffer_updated(nbytes)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _frame(self, frame: Frame) -> None:
        assert self._transport is not None
        write = self._transport.write
        if frame.type == FrameType.HELLO:
            hello = frames.Hello.decode(frame.body)
            version, max_frame = hello.agree(frames.DEFAULT_MAX_FRAME)
            self._receiver.max_frame = max_frame
            write(frames.frame(FrameType.WELCOME, frames.Welcome(version, max_frame, 1, 30_000,
                                                                 MAX_INFLIGHT_BYTES).encode()))
        elif frame.type == FrameType.PRODUCE_OPEN:
            write(frames.frame(FrameType.PRODUCE_OPENED, frames.BodyWriter().u64(1).done(), frame.request_id))
        elif frame.type == FrameType.PRODUCE:
            records, _ = frames.decode_produce(frame.body)
            first, self._next = self._next, self._next + records
            ack = frames.offsets_body(first, self._next - 1)
            write(frames.header(FrameType.ACK, len(ack), frame.request_id) + ack)
        elif frame.type == FrameType.SUBSCRIBE:
            topic = frames.Subscribe.decode(frame.body).topic
            task = asyncio.get_running_loop().create_task(self._stream(frame.request_id, topic))
            self._streams.add(task)
        elif frame.type == FrameType.PING:
            write(frames.frame(FrameType.PONG, frame.body.tobytes(), frame.request_id))
        elif frame.type == FrameType.GOODBYE:
            self._transport.close()

    async def _stream(self, request_id: int, topic: str) -> None:
        assert self._transport is not None
        self._transport.write(frames.frame(FrameType.SUBSCRIBED, frames.offsets_body(1, 0), request_id))
        record_bytes, count = shape(topic)
        records = batch(record_bytes, count)
        head = frames.header(FrameType.RECORDS, 16 + len(records), request_id)
        first = 0
        while not self._transport.is_closing():
            await self._writable.wait()
            self._transport.writelines([head, frames.offsets_body(first, first + count - 1), records])
            first += count


def shape(topic: str) -> tuple[int, int]:
    """(record bytes, records per frame) that a subscription's topic names."""
    size, _, count = topic.rpartition("-")[2].partition("x")
    if size.isdigit() and count.isdigit() and int(count) > 0:
        return int(size), int(count)
    return RECORD_BYTES, RECORDS_PER_FRAME


@functools.cache
def batch(record_bytes: int, count: int) -> bytes:
    return codec.encode_payloads([b"r" * record_bytes] * count, publish_time=1, producer_id=1,
                                 producer_name="bare")


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(BareConnection, "127.0.0.1", port, reuse_address=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(f"{READY} on 127.0.0.1:{port}", flush=True)
    await stop.wait()
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.broker.bare_native")
    parser.add_argument("--port", type=int, required=True)
    uvloop.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()

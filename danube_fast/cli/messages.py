"""`danube-fast produce` and `danube-fast consume`: messages from a shell, like `nats pub`/`nats sub` and
`kafka-console-producer`/`kafka-console-consumer`, on the broker's client port (`--addr`, default
127.0.0.1:6650; TLS and token options as `admin`).

    produce TOPIC [MESSAGE ...] [--file PATH|-] [--count N] [--rate R] [--key K] [--attr K=V ...]
            [--non-reliable] [--batch N]
    consume TOPIC --subscription S [--type exclusive|shared|failover|key_shared] [--count N] [--no-ack]
    consume TOPIC [--from earliest|latest|OFFSET] [--to-end] [--count N]

produce sends MESSAGE arguments, else the lines of `--file` (`-`: stdin), else stdin's lines, one record per
line (its newline dropped), in batches through the fast API (client/producer.py): Reliable topics
acknowledge a batch once it is durable. With `--count`, the messages are sent again and again until N
records went; a progress bar (tqdm) shows on a terminal. The summary (records, bytes, offsets, rate) goes to
stdout when every batch is acknowledged.

consume prints each record's payload on its own line (`--format json`: a JSON object per line with offset,
publish time, key, attributes, and the payload as text or, when it is not UTF-8, base64).
- With `--subscription`, it subscribes through the Danube API, as the official client does (the type,
  default exclusive), reads from the subscription's cursor and acknowledges each message after printing it
  (`--no-ack`: never, so the subscription gives them again).
- Without one, it reads the topic by offset (client/reader.py): nothing is written on the broker.
  `--from` picks the first offset (default latest: only what comes next) and it follows the topic until
  `--count` or Ctrl-C; `--to-end` stops at the last record committed when it started.
The count goes to stderr at the end; Ctrl-C stops with exit code 130, as every command.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import IO, Any, TypeAlias

import grpc

from danube_fast.cli import feedback
from danube_fast.cli.admin import Leaf, Subparsers, credentials
from danube_fast.cli.args import count, positive_float, positive_int
from danube_fast.client.credentials import open_channel
from danube_fast.client.headers import INITIAL_POSITION
from danube_fast.client.lookup import CHANNEL_OPTIONS, follow
from danube_fast.client.producer import FastProducer
from danube_fast.client.reader import TopicReader
from danube_fast.codec import frames
from danube_fast.errors import DanubeError
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc

DEFAULT_ADDR = "127.0.0.1:6650"
DEFAULT_BATCH = 1000
POLL_SECONDS = 0.2  # a reader that caught up asks for the topic's end this often
TYPES = {"exclusive": pb.ConsumerRequest.Exclusive, "shared": pb.ConsumerRequest.Shared,
         "failover": pb.ConsumerRequest.Failover, "key_shared": pb.ConsumerRequest.KeyShared}

Summary: TypeAlias = dict[str, object]


class MessagesFailed(DanubeError):
    """A produce or consume that cannot go on: bad input, or what the broker answered."""


# -- produce ----------------------------------------------------------------------------------------------

def _attributes(pairs: Sequence[str]) -> dict[str, str] | None:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise MessagesFailed(f"--attr {pair!r}: expected NAME=VALUE")
        out[name] = value
    return out or None


def _line(raw: bytes) -> bytes:
    return raw[:-2] if raw.endswith(b"\r\n") else raw[:-1] if raw.endswith(b"\n") else raw


def _stream(args: argparse.Namespace) -> IO[bytes]:
    if args.file in (None, "-"):
        return sys.stdin.buffer
    try:
        return open(args.file, "rb")  # closed by the reading thread
    except OSError as e:
        raise MessagesFailed(f"cannot read --file: {e}") from e


async def _lines(stream: IO[bytes], batch: int) -> AsyncIterator[list[bytes]]:
    """The stream's lines, as they come: a thread reads them (stdin may be a person typing), the loop takes
    whatever is there, up to `batch` at a time."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    def read() -> None:
        try:
            for raw in stream:
                loop.call_soon_threadsafe(queue.put_nowait, _line(raw))
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)
            if stream is not sys.stdin.buffer:
                stream.close()

    threading.Thread(target=read, name="produce-input", daemon=True).start()
    ended = False
    while not ended:
        chunk: list[bytes] = []
        item = await queue.get()
        while item is not None:
            chunk.append(item)
            if len(chunk) >= batch or queue.empty():
                break
            item = queue.get_nowait()
        ended = item is None
        if chunk:
            yield chunk


async def _repeated(messages: list[bytes], total: int, batch: int) -> AsyncIterator[list[bytes]]:
    if not messages:
        raise MessagesFailed("nothing to send: no MESSAGE and no input line")
    sent = 0
    while sent < total:
        n = min(batch, total - sent)
        yield [messages[(sent + i) % len(messages)] for i in range(n)]
        sent += n


async def _source(args: argparse.Namespace) -> AsyncIterator[list[bytes]]:
    # At a --rate, batches of 10 ms worth: the pacing below holds the rate per batch.
    batch = min(args.batch, max(1, int(args.rate / 100))) if args.rate else args.batch
    if args.messages:
        messages = [m.encode() for m in args.messages]
        async for chunk in _repeated(messages, args.count or len(messages), batch):
            yield chunk
        return
    lines = _lines(_stream(args), batch)
    if not args.count:
        async for chunk in lines:
            yield chunk
        return
    read = [line async for chunk in lines for line in chunk]  # repeated: read whole first
    async for chunk in _repeated(read, args.count, batch):
        yield chunk


async def _produce(args: argparse.Namespace) -> Summary:
    attributes = _attributes(args.attr)
    name = args.name or f"danube-fast-cli-{os.getpid()}"
    producer = await FastProducer.connect(args.addr, args.topic, name, reliable=args.reliable,
                                          credentials=credentials(args))
    records = size = 0
    acks: list[asyncio.Future[tuple[int, int]]] = []
    started = time.perf_counter()
    shown = feedback.bar(args.count or (len(args.messages) if args.messages else None), "rec")
    try:
        async for chunk in _source(args):
            if args.rate:  # hold the rate: this chunk is due when the ones before it have had their time
                await asyncio.sleep(max(0.0, started + records / args.rate - time.perf_counter()))
            now_ms = int(time.time() * 1000)
            batch = [frames.Record(p, publish_time=now_ms, routing_key=args.key, attributes=attributes)
                     for p in chunk]
            acks.append(await producer.send_records(batch))
            records += len(chunk)
            size += sum(len(p) for p in chunk)
            shown.update(len(chunk))
        offsets = await asyncio.gather(*acks)
    finally:
        shown.close()
        await producer.close()
    seconds = time.perf_counter() - started
    return {"topic": args.topic, "records": records, "bytes": size,
            "first_offset": offsets[0][0] if offsets else None,
            "last_offset": offsets[-1][1] if offsets else None,
            "seconds": round(seconds, 3), "records_per_s": round(records / seconds) if seconds else 0}


# -- consume ----------------------------------------------------------------------------------------------

def _printer(fmt: str) -> Callable[[int, int, bytes, str | None, dict[str, str] | None], None]:
    out = sys.stdout.buffer

    def text(offset: int, publish_time: int, payload: bytes, key: str | None,
             attributes: dict[str, str] | None) -> None:
        out.write(payload + b"\n")

    def as_json(offset: int, publish_time: int, payload: bytes, key: str | None,
                attributes: dict[str, str] | None) -> None:
        row: dict[str, object] = {"offset": offset, "publish_time": publish_time, "key": key,
                                  "attributes": attributes or {}}
        try:
            row["payload"] = payload.decode("utf-8")
        except UnicodeDecodeError:
            row["payload_base64"] = base64.b64encode(payload).decode("ascii")
        out.write(json.dumps(row).encode() + b"\n")

    return text if fmt == "text" else as_json


async def _subscribed(args: argparse.Namespace, show: Callable[..., None]) -> int:
    """Through the Danube API: subscribe, print, acknowledge; the number of messages printed."""
    channel = open_channel(args.addr, CHANNEL_OPTIONS, credentials(args))
    try:
        channel, _ = await follow(channel, args.addr, args.topic, credentials(args))
        stub: Any = pb_grpc.ConsumerServiceStub(channel)  # type: ignore[no-untyped-call]
        name = args.name or f"danube-fast-cli-{os.getpid()}"
        try:
            subscribed = await stub.Subscribe(pb.ConsumerRequest(
                request_id=1, topic_name=args.topic, consumer_name=name, subscription=args.subscription,
                subscription_type=TYPES[args.type]), metadata=[(INITIAL_POSITION, args.start)])
        except grpc.aio.AioRpcError as e:
            raise MessagesFailed(f"subscribing answered {e.code().name}: {e.details()}") from e
        printed = 0
        stream = stub.ReceiveMessages(pb.ReceiveRequest(request_id=2, consumer_id=subscribed.consumer_id))
        try:
            async for msg in stream:
                show(msg.msg_id.topic_offset, msg.publish_time, msg.payload,
                     msg.routing_key if msg.HasField("routing_key") else None, dict(msg.attributes))
                sys.stdout.flush()
                printed += 1
                if args.ack:
                    await stub.Ack(pb.AckRequest(request_id=2 + printed, msg_id=msg.msg_id,
                                                 subscription_name=args.subscription))
                if printed == args.count:
                    break
        except grpc.aio.AioRpcError as e:
            raise MessagesFailed(f"the stream ended with {e.code().name}: {e.details()}") from e
        finally:
            stream.cancel()
        return printed
    finally:
        await channel.close()


async def _read(args: argparse.Namespace, show: Callable[..., None]) -> int:
    """By offset, nothing written: from --from, following the topic (or to its end with --to-end)."""
    printed = 0
    async with TopicReader(args.addr, credentials=credentials(args)) as reader:
        first, end = await reader.offsets(args.topic)
        position = first if args.start == "earliest" else end if args.start == "latest" else int(args.start)
        stop_at = end if args.to_end else None
        while stop_at is None or position < stop_at:
            end = (await reader.offsets(args.topic))[1] if stop_at is None else stop_at
            if end <= position:
                await asyncio.sleep(POLL_SECONDS)
                continue
            async for data, _, _ in reader.read(args.topic, position, end):
                for record in frames.iter_records(data, verify=False):
                    if record.offset < position or record.offset >= end:
                        continue
                    show(record.offset, record.publish_time, record.payload, record.routing_key,
                         record.attributes)
                    printed += 1
                    position = record.offset + 1
                    if printed == args.count:
                        sys.stdout.flush()
                        return printed
                sys.stdout.flush()
    return printed


async def _consume(args: argparse.Namespace) -> Summary:
    if args.start not in ("earliest", "latest") and not args.start.isdigit():
        raise MessagesFailed(f"--from {args.start!r}: expected earliest, latest or an offset")
    if args.subscription and args.to_end:
        raise MessagesFailed("--to-end reads by offset: a subscription reads from its cursor")
    show = _printer(args.format)
    printed = 0
    try:
        if args.subscription:
            printed = await _subscribed(args, show)
        else:
            printed = await _read(args, show)
    finally:
        sys.stdout.flush()
    return {"topic": args.topic, "records": printed}


# -- parsers ----------------------------------------------------------------------------------------------

def _client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--addr", default=DEFAULT_ADDR, metavar="HOST:PORT",
                        help=f"a broker's client port (default: {DEFAULT_ADDR}); it finds the topic's broker")
    parser.add_argument("--name", help="the producer's or consumer's name (default: danube-fast-cli-PID)")
    parser.add_argument("--tls-ca", metavar="PEM", help="TLS: the CA that signed the broker's certificate")
    parser.add_argument("--tls-cert", metavar="PEM", help="mTLS: this client's certificate")
    parser.add_argument("--tls-key", metavar="PEM", help="mTLS: this client's key")
    parser.add_argument("--token", metavar="JWT", help="a bearer token (default: $DANUBE_TOKEN); implies TLS")


def add_parsers(commands: Subparsers, leaf: Leaf) -> None:
    """`produce` and `consume`; `leaf` is main.py's."""
    p = leaf(commands, "produce", "produce", _produce, "publish messages to a topic",
             "Publish MESSAGE arguments, or the lines of --file or stdin (one record each), to TOPIC "
             "through the fast API; print a summary when every batch is acknowledged.")
    p.add_argument("topic", metavar="TOPIC", help="/namespace/topic (created if missing)")
    p.add_argument("messages", nargs="*", metavar="MESSAGE", help="payloads (default: input lines)")
    p.set_defaults(trailing="messages")  # MESSAGE words after an option count too (main.py)
    p.add_argument("--file", metavar="PATH", help="read one record per line from PATH (-: stdin)")
    p.add_argument("--count", type=count, default=0, metavar="N",
                   help="send N records, repeating the messages or input lines (default: each once)")
    p.add_argument("--rate", type=positive_float, metavar="R", help="at most R records per second")
    p.add_argument("--key", help="the routing key of every record")
    p.add_argument("--attr", action="append", default=[], metavar="NAME=VALUE",
                   help="an attribute of every record (repeatable)")
    p.add_argument("--reliable", action=argparse.BooleanOptionalAction, default=True,
                   help="a Reliable topic (acknowledged once durable) or not (default: reliable)")
    p.add_argument("--batch", type=positive_int, default=DEFAULT_BATCH, metavar="N",
                   help=f"records per batch at most (default: {DEFAULT_BATCH})")
    _client_options(p)

    c = leaf(commands, "consume", "consume", _consume, "print a topic's messages",
             "Print TOPIC's messages, one per line: through a subscription (--subscription, acknowledged "
             "after printing) or read by offset without writing anything (--from).")
    c.set_defaults(summary_on_stderr=True)
    c.add_argument("topic", metavar="TOPIC", help="/namespace/topic")
    c.add_argument("--subscription", metavar="NAME", help="consume through this subscription")
    c.add_argument("--type", choices=tuple(TYPES), default="exclusive",
                   help="the subscription's type (default: exclusive)")
    c.add_argument("--ack", action=argparse.BooleanOptionalAction, default=True,
                   help="acknowledge each message after printing it (default: yes)")
    c.add_argument("--from", dest="start", default="latest", metavar="earliest|latest|OFFSET",
                   help="where to start reading; with --subscription, where a new subscription starts (an "
                        "existing one goes on from its cursor) (default: latest)")
    c.add_argument("--to-end", action="store_true",
                   help="without --subscription: stop at the last record committed at the start")
    c.add_argument("--count", type=count, default=0, metavar="N", help="stop after N messages")
    c.add_argument("--format", choices=("text", "json"), default="text",
                   help="text: the payload; json: one object per line with offset, key, attributes")
    _client_options(c)

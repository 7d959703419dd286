"""Catch-up from segment files with sendfile() over the native transport (docs/TRANSPORT.md, "Catch-up with
sendfile"): a consumer reading what the tail cache does not hold gets exactly the records stored, the
broker's counters say they went by sendfile, and a socket that stays full sends the rest through the
transport in order."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from danube_fast.broker.services.native_sendfile import FileSender
from danube_fast.client.native import NativeConnection, NativeConsumer, NativeProducer
from danube_fast.client.reader import TopicReader
from danube_fast.codec import frames as codec
from danube_fast.storage.file_span import FileSpan
from danube_fast.testing.broker import Broker, BrokerFactory
from danube_fast.transport import frames
from danube_fast.transport.frames import FrameType

READ_DONE = FrameType.READ_DONE
NO_CACHE = "[wal]\ncache_bytes = 0\n"  # every read of the topic goes to its segment files


def counters(broker: Broker) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith("danube_native_sendfile")}


def spanned(broker: Broker) -> tuple[float, float]:
    """(bytes read as spans: by sendfile, or through the transport after the socket stayed full; bytes by
    sendfile). A busy machine's client may leave its socket full past native_sendfile.WAIT_S."""
    got = counters(broker)
    sent = got.get("danube_native_sendfile_bytes_total", 0.0)
    return sent + got.get("danube_native_sendfile_copied_bytes_total", 0.0), sent


def records(data: object) -> list[tuple[int, bytes]]:
    """(offset, payload) of every record of whole batches, each batch's CRC checked."""
    return [(r.offset, bytes(r.payload)) for r in codec.iter_records(memoryview(data), verify=True)]  # type: ignore[arg-type]


def payloads(low: int, count: int, size: int) -> list[bytes]:
    return [(b"%d:" % i).ljust(size, bytes([i % 251])) for i in range(low, low + count)]


async def produce(broker: Broker, topic: str) -> list[bytes]:
    """40 batches of 16 records of 8 KiB (128 KiB: sent from the file) with a batch of 10 small records
    (read into memory) after every fifth, then one small record; every payload it sent, in order."""
    conn = await NativeConnection.connect(broker.fast_target)
    producer = await NativeProducer.open(conn, topic, "p")
    sent: list[bytes] = []
    for b in range(40):
        batch = payloads(len(sent), 16, 8192)
        await producer.send_batch(batch)
        sent += batch
        if b % 5 == 4:
            small = payloads(len(sent), 10, 10)
            await producer.send_batch(small)
            sent += small
    await producer.flush()
    # The tail cache keeps at least its newest group, and a busy machine's group commits can take in most
    # of the batches above: a last record, a group of its own, leaves only itself in memory.
    last = payloads(len(sent), 1, 10)
    await (await producer.send_batch(last))
    conn.close()
    return sent + last


async def consume(broker: Broker, topic: str, count: int) -> list[tuple[int, bytes]]:
    conn = await NativeConnection.connect(broker.fast_target)
    consumer = await NativeConsumer.subscribe(conn, topic, "s", "c", earliest=True)
    got: list[tuple[int, bytes]] = []
    while len(got) < count:
        data, _, last = await asyncio.wait_for(anext(consumer), 30)
        got += [(r.offset, bytes(r.payload)) for r in codec.iter_records(memoryview(data), verify=True)]
        consumer.ack(up_to=last)
    conn.close()
    return got


def test_a_consumer_catching_up_from_segment_files_gets_them_by_sendfile(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(NO_CACHE, native=True)
    sent = asyncio.run(produce(broker, "/default/from-files"))
    got = asyncio.run(consume(broker, "/default/from-files", len(sent)))
    assert got == list(enumerate(sent))  # every record once, in order, with its bytes (CRCs checked)
    # Most went as spans: a delivery that starts at a small batch is read into memory (with the large ones
    # after it); one that starts at a large batch is a span, small ones after it included.
    as_spans, by_sendfile = spanned(broker)
    assert as_spans >= 40 * 16 * 8192 / 2 and by_sendfile > 0


def test_a_reader_of_segment_files_gets_them_by_sendfile_and_a_range_ending_inside_a_batch_clipped(
        broker_factory: BrokerFactory) -> None:
    """TopicReader's READ (the Spark source's offset reads) over the native transport: the same records as
    stored, the large batches by sendfile; a range whose end falls inside a span's batches is read into
    memory and clipped there, so nothing past the range is sent."""
    broker = broker_factory.start(NO_CACHE, native=True)
    sent = asyncio.run(produce(broker, "/default/read-files"))

    async def read(low: int, high: int) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        async with TopicReader(broker.target) as reader:
            async for data, _, last in reader.read("/default/read-files", low, high):
                records = codec.iter_records(memoryview(data), verify=True)
                out += [(r.offset, bytes(r.payload)) for r in records if low <= r.offset < high]
                assert last < high + 16  # whole batches, none after the one holding the range's last offset
        return out

    assert asyncio.run(read(0, len(sent))) == list(enumerate(sent))
    as_spans, by_sendfile = spanned(broker)
    assert as_spans >= 40 * 16 * 8192 / 2 and by_sendfile > 0
    assert asyncio.run(read(100, 300)) == [(i, sent[i]) for i in range(100, 300)]


def test_two_subscriptions_and_a_read_on_one_connection_catch_up_from_files_at_once(
        broker_factory: BrokerFactory) -> None:
    """Spanned frames of several requests on one connection go one at a time, each whole: a frame's span
    must never have another frame's bytes in the middle of it."""
    broker = broker_factory.start(NO_CACHE, native=True)
    sent = asyncio.run(produce(broker, "/default/shared-conn"))

    async def run() -> list[list[tuple[int, bytes]]]:
        conn = await NativeConnection.connect(broker.fast_target)

        async def subscriber(name: str) -> list[tuple[int, bytes]]:
            consumer = await NativeConsumer.subscribe(conn, "/default/shared-conn", name, "c", earliest=True)
            got: list[tuple[int, bytes]] = []
            while len(got) < len(sent):
                data, _, last = await asyncio.wait_for(anext(consumer), 30)
                got += records(data)
                consumer.ack(up_to=last)
            return got

        async def reader() -> list[tuple[int, bytes]]:  # READ, as TopicReader sends it
            body = frames.Read("/default/shared-conn", 0, len(sent), 0).encode()
            request_id, _ = conn.open_stream(FrameType.READ, [body], len(body))
            got: list[tuple[int, bytes]] = []
            while (frame := await asyncio.wait_for(conn.next_frame(request_id), 30)).type != READ_DONE:
                assert frame.type == FrameType.RECORDS, frame
                got += records(frames.decode_offsets(frame.body, "RECORDS", "first", "last", more=True)[2])
            return got

        try:
            return list(await asyncio.gather(subscriber("s1"), subscriber("s2"), reader()))
        finally:
            conn.close()

    for got in asyncio.run(run()):
        assert got == list(enumerate(sent))  # (iter_records checks each batch's CRC: no torn frame)


def wal_start(broker: Broker, topic: str) -> int:
    """The base offset of the oldest segment left in the topic's WAL (0 while there is none)."""
    ns, short = topic.strip("/").split("/")
    segments = (broker.data_dir / "wal" / ns / short).glob("*.log")
    return min((int(p.name.removesuffix(".log")) for p in segments), default=0)


def test_catch_up_from_the_folder_stores_objects_goes_by_sendfile_too(broker_factory: BrokerFactory) -> None:
    """Segments uploaded to the folder object store (standalone's default) and deleted from the WAL: a
    consumer and a reader of them get the objects' batches from their files by sendfile, as from the WAL's,
    and exactly the records stored."""
    topic = "/default/from-objects"
    broker = broker_factory.start(NO_CACHE + "segment_bytes = 262144\nretain_bytes = 0\n"
                                  "[cluster]\nupload_interval_ms = 100\n", native=True)
    sent = asyncio.run(produce(broker, topic))
    deadline = time.monotonic() + 30
    while wal_start(broker, topic) < len(sent) * 9 // 10:  # nine tenths only in the objects
        assert time.monotonic() < deadline, f"the WAL still starts at {wal_start(broker, topic)}"
        time.sleep(0.1)
    assert list((broker.data_dir / "objects" / "default" / "from-objects").glob("data-0-*.dnb1"))
    # More than the WAL holds now can only have come from the objects' files.
    assert asyncio.run(consume(broker, topic, len(sent))) == list(enumerate(sent))
    as_spans, by_sendfile = spanned(broker)
    assert as_spans >= 40 * 16 * 8192 / 2 and by_sendfile > 0

    async def read() -> list[tuple[int, bytes]]:
        async with TopicReader(broker.target) as reader:
            out: list[tuple[int, bytes]] = []
            async for data, _, _ in reader.read(topic, 0, len(sent)):
                out += records(data)
            return out

    assert asyncio.run(read()) == list(enumerate(sent))
    assert spanned(broker)[0] >= as_spans + 40 * 16 * 8192 / 2


def test_without_sendfile_the_same_records_come_and_nothing_is_counted(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(NO_CACHE + "[broker]\nfast_sendfile = false\n", native=True)
    sent = asyncio.run(produce(broker, "/default/copied"))
    assert asyncio.run(consume(broker, "/default/copied", len(sent))) == list(enumerate(sent))
    assert counters(broker) == {}


def test_a_socket_that_stays_full_gets_the_rest_of_a_span_through_the_transport(tmp_path: Path) -> None:
    """The sender does not wait in its pool for a reader that reads nothing: after WAIT_S the rest of the
    span is written through the transport, behind what sendfile sent, so the stream stays whole."""
    body = os.urandom(8 << 20)  # more than both socket buffers hold
    path = tmp_path / "segment"
    path.write_bytes(b"head" + body)

    async def run() -> tuple[bytes, FileSender]:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
        sender = FileSender()
        fd = os.open(path, os.O_RDONLY)
        span = FileSpan(fd, 4, len(body), b"")
        transport.write(b"frame-header")
        # Nobody reads yet: the socket fills, and after WAIT_S the rest goes into the transport's buffer,
        # which ends the send without a reader.
        await asyncio.wait_for(sender.send(transport, span, timeout=10), 30)
        assert 0 < sender.sent_bytes < len(body) and sender.copied_bytes == len(body) - sender.sent_bytes
        received = bytearray()
        while len(received) < len(body) + 12:
            chunk = await asyncio.wait_for(loop.sock_recv(theirs, 1 << 20), 10)
            assert chunk, "the sender's side closed"
            received += chunk
        span.close()
        transport.close()
        theirs.close()
        sender.close()
        return bytes(received), sender

    received, sender = asyncio.run(run())
    assert received == b"frame-header" + body
    assert sender.sent_bytes > 0 and sender.copied_bytes > 0
    assert sender.sent_bytes + sender.copied_bytes == len(body)


def test_a_span_on_a_closed_connection_raises_and_closes_its_descriptor_copy() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
        r, w = os.pipe()
        os.write(w, b"x" * 100)
        span = FileSpan(r, 0, 100, b"")
        theirs.close()
        transport.close()
        sender = FileSender()
        with pytest.raises(ConnectionError):
            await sender.send(transport, span, timeout=1)
        span.close()
        os.close(w)
        sender.close()

    asyncio.run(run())

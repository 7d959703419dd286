"""The native transport's produce path (docs/TRANSPORT.md) on a real broker: records produced over frames
are the records read back over gRPC, acks come in order with the offsets stored, and bad input gets a clear
ERROR frame, closes only its own connection and stores nothing."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest

from danube_fast.client import FastProducer
from danube_fast.client.native import NativeConnection, NativeConsumer, NativeProducer
from danube_fast.client.producer import ProduceRejected
from danube_fast.client.reader import TopicReader
from danube_fast.codec import frames as codec
from danube_fast.testing.broker import Broker, BrokerFactory
from danube_fast.transport import frames
from danube_fast.transport.frames import FrameType


@pytest.fixture
def broker(broker_factory: BrokerFactory) -> Broker:
    return broker_factory.start(native=True)


def target(broker: Broker) -> str:
    return broker.fast_target


def port(broker: Broker) -> int:
    assert broker.fast_port is not None
    return broker.fast_port


async def stored(broker: Broker, topic: str) -> list[tuple[int, bytes]]:
    out = []
    async with TopicReader(broker.target) as reader:
        async for data, _, _ in reader.read(topic, 0, 0):
            out += [(r.offset, bytes(r.payload)) for r in codec.iter_records(memoryview(data), verify=True)]
    return out


def test_records_produced_over_frames_are_stored_in_order_and_read_back_over_grpc(broker: Broker) -> None:
    async def run() -> list[tuple[int, int]]:
        conn = await NativeConnection.connect(target(broker))
        producer = await NativeProducer.open(conn, "/default/native", "p1")
        acks = []
        for low in range(0, 5000, 500):
            acks.append(await producer.send_batch([b"rec-%d" % i for i in range(low, low + 500)]))
        big = await producer.send_batch([bytes([i % 251]) * 300_000 for i in range(4)])  # bodies past 64 KiB
        await producer.flush()
        # a gRPC producer on the same topic goes on after them
        grpc_producer = await FastProducer.connect(broker.target, "/default/native", "p2")
        await (await grpc_producer.send_batch([b"after"]))
        await grpc_producer.close()
        conn.close()
        return [await a for a in acks] + [await big]

    acks = asyncio.run(run())
    assert acks[:10] == [(low, low + 499) for low in range(0, 5000, 500)]
    assert acks[10] == (5000, 5003)
    got = asyncio.run(stored(broker, "/default/native"))
    assert got[:5000] == [(i, b"rec-%d" % i) for i in range(5000)]
    assert got[5000:5004] == [(5000 + i, bytes([i % 251]) * 300_000) for i in range(4)]
    assert got[5004:] == [(5004, b"after")]


def test_refusals_name_what_was_wrong_and_keep_the_connection(broker: Broker) -> None:
    async def run() -> None:
        conn = await NativeConnection.connect(target(broker))
        with pytest.raises(ProduceRejected, match="INVALID_ARGUMENT"):
            await NativeProducer.open(conn, "no-namespace-here", "p")
        producer = await NativeProducer.open(conn, "/default/refused", "p")
        # a batch claiming another producer's id
        other = codec.encode_payloads([b"x"], publish_time=1, producer_id=producer.producer_id + 1000,
                                      producer_name="p")
        with pytest.raises(ProduceRejected, match="was not opened on this connection"):
            await (await producer.send_data(other, 1))
        # a record count that is not the batches'
        good = codec.encode_payloads([b"a", b"b"], publish_time=1, producer_id=producer.producer_id,
                                     producer_name="p")
        with pytest.raises(ProduceRejected, match="PRODUCE says 5 records, its batches hold 2"):
            await (await producer.send_data(good, 5))
        # a corrupt batch (its CRC no longer matches)
        bad = bytearray(good)
        bad[-1] ^= 0xFF
        with pytest.raises(ProduceRejected, match="INVALID_ARGUMENT"):
            await (await producer.send_data(bytes(bad), 2))
        # and the same connection still serves
        assert await (await producer.send_batch([b"fine"])) == (0, 0)
        conn.close()

    asyncio.run(run())
    assert asyncio.run(stored(broker, "/default/refused")) == [(0, b"fine")]


def raw(broker: Broker, data: bytes, wait: float = 5.0) -> bytes:
    """Send `data` on a fresh connection and read until the broker closes it (or `wait` passes)."""
    with socket.create_connection(("127.0.0.1", port(broker)), timeout=wait) as s:
        s.sendall(data)
        got = b""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                return got
            got += chunk
        raise AssertionError(f"the broker kept the connection open; it sent {got!r}")


def error_of(reply: bytes) -> frames.Error:
    size, kind, _, request_id = frames.parse_header(reply, frames.DEFAULT_MAX_FRAME)
    assert kind == FrameType.ERROR and request_id == 0
    return frames.Error.decode(reply[frames.HEADER_BYTES:frames.HEADER_BYTES + size])


def hello() -> bytes:
    return frames.frame(FrameType.HELLO, frames.Hello(1, 1, frames.DEFAULT_MAX_FRAME, "", "test").encode())


@pytest.mark.parametrize("what, data, message", [
    ("garbage", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "frame length"),
    ("a 4 GiB length", struct.pack("<IBBHQ", 0xFFFFFFFF, 0x12, 0, 0, 1), "frame length 4294967295"),
    ("an unknown type", frames.header(0x7F, 0, 1), "unknown frame type 0x7f"),  # type: ignore[arg-type]
    ("PRODUCE before HELLO", frames.header(FrameType.PRODUCE, 0, 1), "the first frame must be HELLO"),
    ("a future version", frames.frame(FrameType.HELLO, frames.Hello(7, 9, frames.DEFAULT_MAX_FRAME, "",
                                                                    "t").encode()), "this broker speaks 1"),
    ("a HELLO that is cut short", frames.header(FrameType.HELLO, 2, 0) + b"DN", "HELLO"),
])
def test_bad_bytes_get_an_error_frame_and_the_connection_closed(broker: Broker, what: str, data: bytes,
                                                                message: str) -> None:
    assert message in error_of(raw(broker, data)).message, what


def test_a_frame_that_is_no_request_is_refused_by_request_and_the_connection_stays(broker: Broker) -> None:
    """An answer's type sent to the broker (LOCATED) is refused for its request id (UNIMPLEMENTED), as a
    LOOKUP of an unknown topic is (NOT_FOUND); the connection goes on (the PING after them is answered)."""
    with socket.create_connection(("127.0.0.1", port(broker)), timeout=10) as s:
        s.sendall(hello() + frames.frame(FrameType.LOOKUP, frames.string_body("/default/x"), 7) +
                  frames.frame(FrameType.LOCATED, frames.string_body("10.0.0.1:1"), 8) +
                  frames.frame(FrameType.PING, frames.ping_body(99), 9))
        decoder = frames.FrameDecoder()
        got: list[frames.Frame] = []
        while len(got) < 4:
            got += decoder.feed(s.recv(65536))
    by_id = {f.request_id: f for f in got}
    assert got[0].type == FrameType.WELCOME and set(by_id) == {0, 7, 8, 9}
    assert frames.Error.decode(by_id[7].body).code == "NOT_FOUND"
    assert frames.Error.decode(by_id[8].body).code == "UNIMPLEMENTED"
    assert by_id[9].type == FrameType.PONG and frames.decode_ping(by_id[9].body, "PONG") == 99


def test_a_handshake_that_never_finishes_is_closed_and_others_are_served(broker: Broker) -> None:
    async def run() -> None:
        idle = [socket.create_connection(("127.0.0.1", port(broker))) for _ in range(50)]
        conn = await NativeConnection.connect(target(broker))
        producer = await NativeProducer.open(conn, "/default/busy", "p")
        assert await (await producer.send_batch([b"served"])) == (0, 0)
        conn.close()
        for s in idle:
            s.settimeout(10)
            assert s.recv(65536)[4] == FrameType.ERROR  # after HANDSHAKE_S: ERROR, then the close
            s.close()

    asyncio.run(run())


def test_a_native_consumer_reads_within_its_window_acks_and_resumes_after_its_acks(broker: Broker) -> None:
    async def run() -> None:
        conn = await NativeConnection.connect(target(broker))
        producer = await NativeProducer.open(conn, "/default/consumed", "p")
        for low in range(0, 3000, 1000):
            await producer.send_batch([b"c-%d" % i for i in range(low, low + 1000)])
        await producer.flush()
        batch_bytes = len(codec.encode_payloads([b"c-%d" % i for i in range(1000)], publish_time=1,
                                                producer_id=producer.producer_id, producer_name="p"))
        consumer = await NativeConsumer.subscribe(conn, "/default/consumed", "s", "c1", earliest=True,
                                                  window_bytes=batch_bytes)
        assert consumer.start_offset == 0
        got: list[tuple[int, bytes]] = []
        data, first, last = await anext(consumer)
        got += [(r.offset, bytes(r.payload)) for r in codec.iter_records(data, verify=True)]
        assert (first, last) == (0, 999)
        with pytest.raises(asyncio.TimeoutError):  # the window is full until an ack frees it
            await asyncio.wait_for(anext(consumer), 0.5)
        consumer.ack(up_to=999)
        while len(got) < 2000:
            data, first, last = await asyncio.wait_for(anext(consumer), 10)
            got += [(r.offset, bytes(r.payload)) for r in codec.iter_records(data, verify=True)]
            consumer.ack(up_to=last)
        assert got == [(i, b"c-%d" % i) for i in range(2000)]
        await asyncio.sleep(0.2)  # the acks reach the broker before the connection goes
        conn.close()
        # another connection resumes the subscription after what was acknowledged
        again = await NativeConnection.connect(target(broker))
        resumed = await NativeConsumer.subscribe(again, "/default/consumed", "s", "c2")
        data, first, last = await asyncio.wait_for(anext(resumed), 10)
        assert first == 2000 and resumed.start_offset == 2000
        again.close()

    asyncio.run(run())


def test_an_ack_for_no_subscription_is_refused_and_a_missing_topic_named(broker: Broker) -> None:
    async def run() -> None:
        conn = await NativeConnection.connect(target(broker))
        with pytest.raises(ProduceRejected, match="topic /default/never-made does not exist"):
            await NativeConsumer.subscribe(conn, "/default/never-made", "s", "c")
        conn.close()

    asyncio.run(run())
    with socket.create_connection(("127.0.0.1", port(broker)), timeout=10) as s:
        s.sendall(hello() + frames.frame(FrameType.ACKNOWLEDGE, frames.Acknowledge(5, [], [], 0).encode(), 9,
                                         frames.UP_TO))
        decoder = frames.FrameDecoder()
        got: list[frames.Frame] = []
        while len(got) < 2:
            got += decoder.feed(s.recv(65536))
    assert got[1].type == FrameType.ERROR and got[1].request_id == 9
    assert "names no subscription" in frames.Error.decode(got[1].body).message


def test_two_subscribes_with_one_request_id_make_one_subscription(broker: Broker) -> None:
    """The second SUBSCRIBE of a request id still being subscribed is refused, not a second subscription
    whose acks would land on the first's."""
    async def make_topic() -> None:
        conn = await NativeConnection.connect(target(broker))
        producer = await NativeProducer.open(conn, "/default/one-id", "p")
        await (await producer.send_batch([b"x"]))
        conn.close()

    asyncio.run(make_topic())

    def subscribe(subscription: str) -> bytes:
        return frames.frame(FrameType.SUBSCRIBE, frames.Subscribe("/default/one-id", subscription, "c", 0,
                                                                  True).encode(), 7)

    with socket.create_connection(("127.0.0.1", port(broker)), timeout=10) as s:
        s.sendall(hello() + subscribe("first") + subscribe("second"))
        decoder = frames.FrameDecoder()
        got: list[frames.Frame] = []
        while sum(f.type in (FrameType.SUBSCRIBED, FrameType.ERROR) for f in got) < 2:
            got += decoder.feed(s.recv(65536))
    answers = [f for f in got if f.type in (FrameType.SUBSCRIBED, FrameType.ERROR)]
    assert [f.request_id for f in answers] == [7, 7]
    assert sorted(f.type.name for f in answers) == ["ERROR", "SUBSCRIBED"]
    refusal = frames.Error.decode(next(f for f in answers if f.type == FrameType.ERROR).body)
    assert refusal.code == "ALREADY_EXISTS" and "already names a subscription" in refusal.message


LIMITS = "[broker]\nfast_keepalive_ms = 300\nfast_max_connections = 3\n"


def read_to_end(sock: socket.socket, within: float) -> list[frames.Frame]:
    """The frames the broker sends until it closes the connection (which must be within `within` s)."""
    sock.settimeout(within)
    decoder = frames.FrameDecoder()
    got: list[frames.Frame] = []
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 20)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += decoder.feed(chunk)
    raise AssertionError(f"still open after {within} s; got {[f.type.name for f in got]}")


def test_a_silent_connection_is_closed_and_a_pinging_client_is_kept(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(LIMITS, native=True)
    with socket.create_connection(("127.0.0.1", port(broker)), timeout=10) as s:
        s.sendall(hello())
        started = time.monotonic()
        got = read_to_end(s, 10)
    # A PING after each period without a word from the client, then the close after the third.
    assert [f.type for f in got] == [FrameType.WELCOME, FrameType.PING, FrameType.PING, FrameType.ERROR]
    assert "nothing received for 0.9 s" in frames.Error.decode(got[-1].body).message
    assert 0.8 < time.monotonic() - started < 5
    assert frames.Welcome.decode(got[0].body).keepalive_ms == 300

    async def idle_client() -> None:
        conn = await NativeConnection.connect(broker.fast_target)
        await asyncio.sleep(2)  # over six keepalive periods: its PINGs keep it
        producer = await NativeProducer.open(conn, "/default/kept", "p")
        assert await (await producer.send_batch([b"still here"])) == (0, 0)
        conn.close()

    asyncio.run(idle_client())


def test_a_client_that_only_answers_the_brokers_pings_is_kept(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(LIMITS, native=True)
    with socket.create_connection(("127.0.0.1", port(broker)), timeout=10) as s:
        s.sendall(hello())
        decoder = frames.FrameDecoder()
        pings = 0
        deadline = time.monotonic() + 2  # over six keepalive periods
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            assert chunk, "the broker closed a connection that answered its PINGs"
            for f in decoder.feed(chunk):
                if f.type == FrameType.PING:
                    pings += 1
                    s.sendall(frames.frame(FrameType.PONG, f.body))
        assert pings >= 2  # a PING after each period it heard nothing in (our PONG is heard in the next)
        s.settimeout(10)
        s.sendall(frames.frame(FrameType.PING, frames.ping_body(7), 3))  # still served
        (pong,) = decoder.feed(s.recv(65536))
        assert pong.type == FrameType.PONG and frames.decode_ping(pong.body) == 7


def test_the_client_gives_up_on_a_broker_it_hears_nothing_from() -> None:
    """A broker that answered the handshake and then went silent without a FIN or RST (a frozen process, a
    cut network): the client's requests fail with UNAVAILABLE after three keepalive periods of silence,
    instead of waiting for ever."""
    async def scenario() -> None:
        ended = asyncio.get_running_loop().create_future()

        async def frozen(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.read(65536)  # the HELLO
                writer.write(frames.frame(FrameType.WELCOME, frames.Welcome(
                    1, frames.DEFAULT_MAX_FRAME, 7, 300, 64 << 20).encode()))
                while await reader.read(65536):  # hears the client's PINGs, says nothing
                    pass
            finally:
                writer.close()
                ended.set_result(None)

        server = await asyncio.start_server(frozen, "127.0.0.1", 0)
        host, port_ = server.sockets[0].getsockname()[:2]
        try:
            conn = await NativeConnection.connect(f"{host}:{port_}")
            started = time.monotonic()
            body = frames.string_body("/default/t")
            pending = conn.send(FrameType.OFFSETS, [body], len(body))
            with pytest.raises(ProduceRejected) as failed:
                await asyncio.wait_for(pending, 10)
            took = time.monotonic() - started
            assert failed.value.grpc_code == "UNAVAILABLE" and failed.value.retriable, failed.value
            assert "nothing heard from the broker for 0.9 s" in str(failed.value)
            assert 0.6 < took < 5, took  # three periods of 0.3 s, give or take one
            conn.close()
            await asyncio.wait_for(ended, 10)  # the client's end closed the connection
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


def test_connections_over_the_cap_are_refused_until_one_closes(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(LIMITS, native=True)
    held = [socket.create_connection(("127.0.0.1", port(broker)), timeout=10) for _ in range(3)]
    for s in held:
        s.sendall(hello())
        s.settimeout(10)
        assert s.recv(65536)[4] == FrameType.WELCOME
    with socket.create_connection(("127.0.0.1", port(broker)), timeout=10) as extra:
        got = read_to_end(extra, 10)
    assert [f.type for f in got] == [FrameType.ERROR]
    error = frames.Error.decode(got[0].body)
    assert error.code == "RESOURCE_EXHAUSTED" and "fast_max_connections" in error.message
    held.pop().close()
    time.sleep(0.2)
    with socket.create_connection(("127.0.0.1", port(broker)), timeout=10) as again:
        again.sendall(hello())
        again.settimeout(10)
        assert again.recv(65536)[4] == FrameType.WELCOME
    for s in held:
        s.close()


def test_a_consumer_that_stops_reading_is_cut_off_and_others_are_served(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(LIMITS.replace("fast_max_connections = 3", "fast_max_connections = 10"),
                                  native=True)

    async def fill() -> None:
        conn = await NativeConnection.connect(broker.fast_target)
        producer = await NativeProducer.open(conn, "/default/unread", "p")
        for _ in range(40):  # 40 MB: far more than the socket buffers hold
            await producer.send_batch([b"z" * 100_000] * 10)
        await producer.flush()
        conn.close()

    asyncio.run(fill())
    with socket.create_connection(("127.0.0.1", port(broker)), timeout=10) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        body = frames.Subscribe("/default/unread", "s", "c", 64 << 20, True).encode()
        s.sendall(hello() + frames.frame(FrameType.SUBSCRIBE, body, 1))
        time.sleep(3)  # read nothing for three keepalive periods and more; keep pinging so silence is not why
        s.sendall(frames.frame(FrameType.PING, frames.ping_body(1)))
        read_to_end(s, 30)  # closed: what it left unread is dropped, not held
    assert "the client read nothing for 0.9 s" in broker.log_tail()

    async def served() -> None:
        conn = await NativeConnection.connect(broker.fast_target)
        consumer = await NativeConsumer.subscribe(conn, "/default/unread", "s", "c2")
        _, first, _ = await asyncio.wait_for(anext(consumer), 10)
        assert first == 0  # the cut-off consumer acknowledged nothing: its records come again
        conn.close()

    asyncio.run(served())


def test_the_fast_producer_takes_the_native_transport_where_the_broker_serves_it(
        broker: Broker, broker_factory: BrokerFactory) -> None:
    async def run() -> None:
        auto = await FastProducer.connect(broker.target, "/default/chosen", "auto")
        grpc_only = await FastProducer.connect(broker.target, "/default/chosen", "grpc", transport="grpc")
        assert auto.over_native and not grpc_only.over_native
        assert await (await auto.send_batch([b"a1", b"a2"])) == (0, 1)
        assert await (await grpc_only.send_batch([b"g1"])) == (2, 2)
        await auto.close()
        await grpc_only.close()
        plain = broker_factory.start()
        fallback = await FastProducer.connect(plain.target, "/default/chosen", "auto")
        assert not fallback.over_native
        await fallback.close()
        with pytest.raises(ProduceRejected, match="serves no native transport"):
            await FastProducer.connect(plain.target, "/default/chosen", "n", transport="native",
                                       reconnect_tries=0)

    asyncio.run(run())
    assert asyncio.run(stored(broker, "/default/chosen")) == [(0, b"a1"), (1, b"a2"), (2, b"g1")]


def test_the_native_fast_producer_survives_a_broker_kill_with_each_record_stored_once(broker: Broker) -> None:
    async def run() -> None:
        producer = await FastProducer.connect(broker.target, "/default/killed", "p", linger_ms=0)
        assert producer.over_native
        futures = []
        for i in range(60):
            futures.append(await producer.send_batch([b"k-%d-%d" % (i, j) for j in range(100)]))
            if i == 30:
                await futures[10]
                broker.kill()
                broker.start()
        await producer.flush()
        assert producer.over_native
        offsets = [await f for f in futures]
        assert offsets == sorted(offsets)
        await producer.close()

    asyncio.run(run())
    got = asyncio.run(stored(broker, "/default/killed"))
    assert [o for o, _ in got] == list(range(len(got)))
    assert sorted(v for _, v in got) == sorted(b"k-%d-%d" % (i, j) for i in range(60) for j in range(100))


def test_the_fast_consumer_takes_the_native_transport_resumes_after_its_acks_and_follows_a_restart(
        broker: Broker) -> None:
    from danube_fast.client import FastConsumer

    async def run() -> None:
        producer = await FastProducer.connect(broker.target, "/default/followed", "p")
        consumer = await FastConsumer.connect(broker.target, "/default/followed", "s", "c",
                                              initial_position="earliest")
        assert consumer.over_native
        for low in range(0, 3000, 1000):
            await producer.send_batch([b"f-%d" % i for i in range(low, low + 1000)])
        await producer.flush()
        seen: list[int] = []
        async for d in consumer.batches():
            seen += [r.offset for r in codec.iter_records(memoryview(d.data), verify=True)]
            await consumer.ack_cumulative(d.last_offset)
            if len(seen) >= 2000:
                break
        await consumer.close()  # the broker saved the cursor before the connection ended
        assert seen == list(range(len(seen)))
        again = await FastConsumer.connect(broker.target, "/default/followed", "s", "c2")
        assert again.over_native and again.start_offset == len(seen)
        broker.kill()
        broker.start()
        await producer.send_batch([b"after"])
        await producer.flush()
        after: list[int] = []
        async for d in again.batches():
            after += [r.offset for r in codec.iter_records(memoryview(d.data), verify=True)
                      if r.offset >= again.start_offset]
            await again.ack_cumulative(d.last_offset)
            if 3000 in after:
                break
        assert again.reconnects >= 1 and again.over_native
        assert set(range(len(seen), 3001)) <= set(after)  # at least once across the restart
        await again.close()
        await producer.close()

    asyncio.run(run())

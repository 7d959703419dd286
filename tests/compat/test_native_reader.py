"""TopicReader over the native transport (OFFSETS, READ: docs/TRANSPORT.md) against the broker subprocess:
the same records, ranges, refusals and restarts as over gRPC (test_fast_reader.py), a read left early
CANCELled without disturbing the connection, and nothing written while reading."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from compat_support import run_async, scrape
from test_fast_reader import (
    check_items,
    in_range,
    produce_batches,
    produce_mixed,
    read_all,
    refusal,
    subscriptions,
)

from danube_fast.client import FastProducer
from danube_fast.client.native import STREAM_HIGH, NativeConnection
from danube_fast.client.reader import Records, TopicReader
from danube_fast.client.status import ProduceRejected
from danube_fast.codec import frames
from danube_fast.testing.broker import BrokerFactory
from danube_fast.transport import frames as wire
from danube_fast.transport.frames import FrameType
from danube_fast.transport.receiver import STAGE_BYTES


def test_reads_every_committed_record_over_native(broker_factory: BrokerFactory, topic: str) -> None:
    broker = broker_factory.start(native=True)

    async def scenario() -> None:
        expected = await produce_mixed(broker, topic)
        n = len(expected)
        async with TopicReader(broker.target, transport="native") as reader:
            assert await reader.offsets(topic) == (0, n)
            items = await read_all(reader, topic, 0, n, max_bytes=1000)
            check_items(items, 1000)
            assert len(items) > 3, "max_bytes did not split the read"
            table = frames.decode_arrow(b"".join(bytes(data) for data, _, _ in items))
            assert table.column("offset").to_pylist() == list(range(n))
            assert table.column("value").to_pylist() == expected
            sub = await read_all(reader, topic, 57, 203)
            assert [r.payload for r in in_range(sub, 57, 203)] == expected[57:203]
            tail = await read_all(reader, topic, 250, 0)
            assert [r.payload for r in in_range(tail, 250, n)] == expected[250:]
            assert await read_all(reader, topic, n + 5, n + 10) == []
            for _ in range(3):  # a read left early is cancelled; the connection goes on serving
                partial = reader.read(topic, 0, n, max_bytes=100)
                await anext(partial)
                await partial.aclose()
            again = await read_all(reader, topic, 0, n)
            assert [r.payload for r in in_range(again, 0, n)] == expected
            assert reader.native_reads >= 8 and reader.retried == 0
        assert await subscriptions(broker, topic) == [], "reading created a subscription"

    run_async(scenario())


def test_refusals_over_native(broker_factory: BrokerFactory, topic: str) -> None:
    broker = broker_factory.start(native=True)

    async def scenario() -> None:
        producer = await FastProducer.connect(broker.target, topic, "nr", reliable=False)
        await producer.close()
        async with TopicReader(broker.target, transport="native") as reader:
            live = await refusal(reader.offsets(topic), "OFFSETS of a NonReliable topic")
            assert live.grpc_code == "FAILED_PRECONDITION" and "NonReliable" in str(live), live
            live = await refusal(read_all(reader, topic, 0, 10), "READ of a NonReliable topic")
            assert live.grpc_code == "FAILED_PRECONDITION", live
            for bad in ("/default/no space", "no-namespace"):
                invalid = await refusal(read_all(reader, bad, 0, 10), f"READ of {bad!r}")
                assert invalid.grpc_code == "INVALID_ARGUMENT", invalid
        await produce_batches(broker, topic + "-r", 1)
        conn = await NativeConnection.connect(broker.fast_target)
        try:  # a range backwards, which TopicReader never asks, straight on the wire
            body = wire.Read(topic + "-r", 5, 2, 0).encode()
            _, queue = conn.open_stream(FrameType.READ, [body], len(body))
            answer = await asyncio.wait_for(queue.get(), 10)
            assert not isinstance(answer, Exception) and answer.type == FrameType.ERROR, answer
            error = wire.Error.decode(answer.body)
            assert error.code == "INVALID_ARGUMENT" and "below from_offset" in error.message, error
        finally:
            await conn.aclose()
        plain = broker_factory.start()
        async with TopicReader(plain.target, transport="native") as reader:
            none = await refusal(reader.offsets(topic), "a broker without the native transport")
            assert none.grpc_code == "FAILED_PRECONDITION" and "native" in str(none), none

    run_async(scenario())


def test_a_read_over_native_spans_a_broker_restart(broker_factory: BrokerFactory, topic: str) -> None:
    broker = broker_factory.start(native=True)

    async def scenario() -> None:
        # 24 MB: more than loopback TCP's buffers hold (with 500 KiB the broker had sent it all, into the
        # kernel's buffers, before the restart)
        expected = await produce_batches(broker, topic, 480, pad=1000)
        n = len(expected)
        async with TopicReader(broker.target, transport="native") as reader:
            items: list[Records] = []
            stream = reader.read(topic, 0, n, max_bytes=64 * 1024)
            items.append(await anext(stream))
            await asyncio.to_thread(broker.restart)
            items += [item async for item in stream]
            assert reader.retried > 0, "the read did not span the restart"
            check_items(items, 64 * 1024)
            assert [r.payload for r in in_range(items, 0, n)] == expected

    run_async(scenario())


@pytest.mark.parametrize("transport", ["auto", "grpc"])
def test_auto_reads_natively_where_served_and_grpc_never_does(broker_factory: BrokerFactory, topic: str,
                                                               transport: str) -> None:
    broker = broker_factory.start(native=True)

    async def scenario() -> None:
        expected = await produce_batches(broker, topic, 3)
        async with TopicReader(broker.target, transport=transport) as reader:
            items = await read_all(reader, topic, 0, 0)
            assert [r.payload for r in in_range(items, 0, len(expected))] == expected
            assert (reader.native_reads > 0) == (transport == "auto")

    run_async(scenario())


def test_a_slow_reader_holds_a_few_frames_not_the_whole_read(broker_factory: BrokerFactory,
                                                              topic: str) -> None:
    """The connection stops reading while a stream has STREAM_HIGH frames waiting (TCP holds the broker)."""
    broker = broker_factory.start(native=True)

    async def scenario() -> None:
        expected = await produce_batches(broker, topic, 100, pad=100)  # ~250 frames of 2,000 bytes
        n = len(expected)
        async with TopicReader(broker.target, transport="native") as reader:
            stream = reader.read(topic, 0, n, max_bytes=2000)
            items = [await anext(stream)]
            await asyncio.sleep(0.5)  # the broker could have sent it all by now
            (conn,) = reader._natives.values()
            waiting = max(q.qsize() for q in conn._streams.values())
            # the frames of the read that crossed STREAM_HIGH are parsed too: at most a staging buffer's worth
            assert waiting <= STREAM_HIGH + STAGE_BYTES // 2000 + 1 < 50, waiting  # of some 250
            items += [item async for item in stream]
            assert [r.payload for r in in_range(items, 0, n)] == expected

    run_async(scenario())


@pytest.mark.parametrize("transport", ["grpc", "native"])
def test_concurrent_reads_hold_their_responses_within_the_dispatch_budget(broker_factory: BrokerFactory,
                                                                          topic: str, transport: str) -> None:
    """Six slow readers on a broker whose dispatch budget is 1 MiB: the responses they hold count against it
    (the held-bytes gauge shows them), never more than the budget plus one response, and every reader gets
    every record. Native reads hold a response only until the kernel takes it, so theirs are 50 MB each:
    more than loopback TCP buffers."""
    budget, room = 1 << 20, 256 << 10
    pad = 10_000 if transport == "native" else 1000
    broker = broker_factory.start(f"[dispatch]\nbroker_bytes = {budget}\n", native=True)

    async def scenario() -> None:
        expected = await produce_batches(broker, topic, 100, pad=pad)
        n, digest = len(expected), hashlib.sha256(b"".join(expected)).hexdigest()
        del expected
        held: list[float] = []

        async def sample() -> None:
            while True:
                figures = await asyncio.to_thread(scrape, broker)
                held.append(figures["danube_dispatch_held_bytes"])
                await asyncio.sleep(0.02)

        async def slow_reader() -> tuple[int, str]:
            seen, h = 0, hashlib.sha256()
            async with TopicReader(broker.target, transport=transport) as reader:
                async for item in reader.read(topic, 0, n, max_bytes=room):
                    for r in in_range([item], 0, n):
                        seen += 1
                        h.update(r.payload)
                    await asyncio.sleep(0.01)
            return seen, h.hexdigest()

        sampler = asyncio.create_task(sample())
        try:
            results = await asyncio.gather(*(slow_reader() for _ in range(6)))
        finally:
            sampler.cancel()
        assert results == [(n, digest)] * 6
        one_batch = 50 * (pad + 100)
        assert max(held) > 0, "the reads' responses were never counted against the budget"
        assert max(held) <= budget + room + one_batch, (max(held), budget)

    run_async(scenario(), timeout=100)


def test_lookup_names_this_listener_for_its_topics_and_refuses_what_it_cannot_place(
        broker_factory: BrokerFactory, topic: str) -> None:
    """LOOKUP (docs/TRANSPORT.md) by the Danube API's lookup rules: a topic served here is LOCATED at this
    broker's native listener; an unknown topic is NOT_FOUND and a malformed name INVALID_ARGUMENT, each
    ending only that request."""
    broker = broker_factory.start(native=True)

    async def scenario() -> None:
        await produce_batches(broker, topic, 2)
        conn = await NativeConnection.connect(broker.fast_target)
        try:
            assert await conn.lookup(topic) == broker.fast_target
            with pytest.raises(ProduceRejected) as unknown:
                await conn.lookup("/default/no_such_topic")
            assert unknown.value.grpc_code == "NOT_FOUND" and "no_such_topic" in str(unknown.value)
            with pytest.raises(ProduceRejected) as bad:
                await conn.lookup("not a topic")
            assert bad.value.grpc_code == "INVALID_ARGUMENT"
            assert await conn.lookup(topic) == broker.fast_target  # the connection goes on serving
        finally:
            await conn.aclose()

    run_async(scenario())

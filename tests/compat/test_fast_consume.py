"""The fast API's Consume stream against the broker subprocess: whole batches from the WAL in order, a byte
window held until acks, cumulative and individual acks moving the same cursor as the Danube API, and a
subscription passing between the two APIs."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from compat_support import RawApi, Session, offsets, payloads, run_async
from danube import SubType

from danube_fast.client import Delivery, FastConsumer, FastProducer, ProduceRejected
from danube_fast.codec import frames
from danube_fast.proto import SubscriptionAdmin_pb2 as sub_pb
from danube_fast.proto import SubscriptionAdmin_pb2_grpc as sub_grpc
from danube_fast.testing.broker import Broker, BrokerFactory


async def fill(broker: Broker, topic: str, batches: int, per_batch: int = 100) -> FastProducer:
    producer = await FastProducer.connect(broker.target, topic, "filler", reliable=True)
    for b in range(batches):
        await producer.send_batch([b"m-%06d" % (b * per_batch + i) for i in range(per_batch)])
    await producer.flush()
    return producer


async def take(consumer: FastConsumer, timeout: float = 5.0) -> Delivery:
    stream = consumer.batches()
    return await asyncio.wait_for(anext(stream), timeout)


def records_of(deliveries: list[Delivery], start: int) -> list[frames.Record]:
    out = []
    for d in deliveries:
        out.extend(r for r in frames.decode_records(d.data) if r.offset >= start)
    return out


def test_catch_up_in_order_then_resume_after_the_acknowledged(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        producer = await FastProducer.connect(broker.target, topic, "p", reliable=True)
        consumer = await FastConsumer.connect(broker.target, topic, "sub", "c")
        assert consumer.start_offset == 0
        for b in range(10):
            await producer.send_batch([b"m-%06d" % (b * 100 + i) for i in range(100)])
        await producer.flush()
        got: list[Delivery] = []
        stream = consumer.batches()
        while sum(d.last_offset - d.first_offset + 1 for d in got) < 1000:
            got.append(await asyncio.wait_for(anext(stream), 5))
        records = records_of(got, 0)
        assert [r.offset for r in records] == list(range(1000))
        assert [r.payload for r in records] == [b"m-%06d" % i for i in range(1000)]
        await consumer.ack_cumulative(599)
        await consumer.close()  # returns once the broker applied the ack and released the subscription

        again = await FastConsumer.connect(broker.target, topic, "sub", "c")
        assert again.start_offset == 600  # the floor, persisted when the stream ended
        rest = records_of([await take(again)], again.start_offset)
        assert rest[0].offset == 600 and rest[0].payload == b"m-000600"
        await again.close()
        await producer.close()

    run_async(scenario())


def test_the_window_holds_deliveries_until_acks(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        producer = await FastProducer.connect(broker.target, topic, "p", reliable=True)
        small = await FastConsumer.connect(broker.target, topic, "windowed", "c", window_bytes=1)
        for b in range(3):
            await producer.send_batch([b"w-%d-%d" % (b, i) for i in range(10)])
        await producer.flush()
        stream = small.batches()
        first = await asyncio.wait_for(anext(stream), 5)
        with pytest.raises(TimeoutError):  # one delivery fills a 1-byte window
            await asyncio.wait_for(asyncio.shield(nxt := asyncio.ensure_future(anext(stream))), 0.4)
        await small.ack_cumulative(first.last_offset)
        second = await asyncio.wait_for(nxt, 5)
        assert second.first_offset == first.last_offset + 1
        # individual acks: the floor moves only over contiguous offsets
        await small.ack([second.last_offset])
        await small.close()
        again = await FastConsumer.connect(broker.target, topic, "windowed", "c")
        assert again.start_offset == first.last_offset + 1
        await again.close()
        await producer.close()

    run_async(scenario())


def test_a_subscription_passes_between_the_fast_and_the_danube_api(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        producer = await fill(broker, topic, 0)
        async with Session(broker.url) as s, RawApi(broker.target) as raw:
            fast_c = await FastConsumer.connect(broker.target, topic, "shared-cursor", "fc")
            await producer.send_batch([b"a-%d" % i for i in range(5)])
            await producer.flush()
            d = await take(fast_c)
            await fast_c.ack_cumulative(d.last_offset)  # offsets 0..4
            err = None
            try:
                await raw.subscribe(topic, "danube-c", "shared-cursor")
            except grpc.aio.AioRpcError as e:
                err = e
            assert err is not None and err.code() == grpc.StatusCode.PERMISSION_DENIED
            await fast_c.close()

            await producer.send_batch([b"b-%d" % i for i in range(3)])
            await producer.flush()
            danube_c = await s.consumer(topic, "danube-c", "shared-cursor", SubType.EXCLUSIVE)
            got = await danube_c.get_n(3)
            assert offsets(got) == [5, 6, 7] and payloads(got) == [b"b-0", b"b-1", b"b-2"]
            for m in got:
                await danube_c.ack(m)
            with pytest.raises(ProduceRejected) as held:
                await FastConsumer.connect(broker.target, topic, "shared-cursor", "fc")
            assert held.value.grpc_code == "PERMISSION_DENIED"
        await producer.close()

    run_async(scenario())


def test_bad_subscriptions_are_refused(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        with pytest.raises(ProduceRejected) as missing:
            await FastConsumer.connect(broker.target, topic, "s", "c")
        assert missing.value.grpc_code == "INVALID_ARGUMENT"
        producer = await FastProducer.connect(broker.target, topic, "nr", reliable=False)
        with pytest.raises(ProduceRejected) as live:
            await FastConsumer.connect(broker.target, topic, "s", "c")
        assert live.value.grpc_code == "FAILED_PRECONDITION"
        await producer.close()

    run_async(scenario())


def test_nack_delivers_again_from_the_nacked_offset(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        producer = await FastProducer.connect(broker.target, topic, "p", reliable=True)
        consumer = await FastConsumer.connect(broker.target, topic, "sub", "c")
        for b in range(3):
            await producer.send_batch([b"m-%06d" % (b * 100 + i) for i in range(100)])
        await producer.flush()
        stream = consumer.batches()
        got: list[Delivery] = []
        while sum(d.last_offset - d.first_offset + 1 for d in got) < 300:
            got.append(await asyncio.wait_for(anext(stream), 5))
        await consumer.ack_cumulative(99)
        await consumer.ack([250])  # acknowledged one by one: stays acknowledged
        await consumer.nack([150, 120], delay_ms=300)
        loop = asyncio.get_running_loop()
        asked = loop.time()
        again = await asyncio.wait_for(anext(stream), 5)
        assert loop.time() - asked >= 0.25, "the nack's delay was not kept"
        assert again.first_offset == 100, "delivery goes back to the batch holding the lowest nacked offset"
        redelivered = records_of([again], 120)
        assert redelivered[0].offset == 120 and redelivered[0].payload == b"m-000120"
        await consumer.ack_cumulative(299)
        await consumer.close()
        resumed = await FastConsumer.connect(broker.target, topic, "sub", "c")
        assert resumed.start_offset == 300
        await resumed.close()
        await producer.close()

    run_async(scenario())


async def acknowledged_up_to(broker: Broker, topic: str, sub: str, position: int) -> None:
    """Wait until the subscription's cursor (SubscriptionAdmin Describe) is at `position`."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
        stub: Any = sub_grpc.SubscriptionAdminStub(channel)  # type: ignore[no-untyped-call]
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            got = await stub.Describe(sub_pb.DescribeRequest(topic=topic, subscription=sub), timeout=10)
            if got.partitions[0].position >= position:
                return
            assert asyncio.get_running_loop().time() < deadline, f"{topic} {sub}: cursor at {got}"
            await asyncio.sleep(0.05)


def test_consumer_and_producer_carry_on_across_a_broker_restart(broker_factory: BrokerFactory, topic: str
                                                                ) -> None:
    """SIGTERM ends the Consume stream with UNAVAILABLE (not OK), so the consumer subscribes again once the
    broker is back and goes on from the saved cursor: everything acknowledged before stays acknowledged,
    everything after arrives."""
    broker = broker_factory.start()

    async def scenario() -> None:
        producer = await FastProducer.connect(broker.target, topic, "p", reliable=True)
        consumer = await FastConsumer.connect(broker.target, topic, "sub", "c")  # new: from the latest
        for b in range(3):
            await producer.send_batch([b"m-%06d" % (b * 100 + i) for i in range(100)])
        stream = consumer.records()
        first = [await asyncio.wait_for(anext(stream), 5) for _ in range(150)]
        await consumer.ack_cumulative(first[-1].offset)
        # An ack is a message on the stream, not a call: the broker has it once the cursor moved (a busy
        # machine's restart could otherwise come first, and the records after 0 would rightly come again).
        await acknowledged_up_to(broker, topic, "sub", 150)
        await asyncio.to_thread(broker.restart)
        await producer.send_batch([b"after-%d" % i for i in range(10)])
        await producer.flush()
        rest: list[frames.Record] = []
        while not rest or rest[-1].offset < 309:
            rest.append(await asyncio.wait_for(anext(stream), 30))
        assert consumer.reconnects == 1
        assert consumer.start_offset == 150, "the new stream did not start after the acknowledged records"
        # At least once: what the old stream had delivered and was not acknowledged may come twice.
        seen = {r.offset: r.payload for r in first + rest}
        assert sorted(seen) == list(range(310))
        assert [seen[o] for o in range(300, 310)] == [b"after-%d" % i for i in range(10)]
        offsets_read = [r.offset for r in rest]
        restarts = [i for i in range(1, len(rest)) if offsets_read[i] != offsets_read[i - 1] + 1]
        assert len(restarts) <= 1 and all(offsets_read[i] == 150 for i in restarts), offsets_read
        await consumer.close()
        await producer.close()

    run_async(scenario())

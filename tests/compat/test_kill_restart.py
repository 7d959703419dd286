"""Durability through the official client: what a reliable topic acknowledged survives SIGKILL, and a SIGTERM
is a clean stop (exit 0) after which topics, their dispatch strategy, subscriptions and offsets are back.

Subscriptions are created before producing: a new subscription starts at the latest offset (C.9), and its
start position is persisted before Subscribe returns (docs/WIRE.md C.7), so it still starts at 0 after a
crash.

After a broker stop, nothing may keep dialling it from this process (the official client's receive loop
reconnects without backoff): gRPC shares connections per target, and one left in reconnect backoff would make
the first calls after the restart fail fast with UNAVAILABLE.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from compat_support import (
    RawApi,
    Session,
    bounded,
    describe,
    offsets,
    payloads,
    rpc_error,
    run_async,
    send_all,
    status_line,
)
from danube import SubType

from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.testing.broker import BrokerFactory

COUNT = 10_000
CONCURRENCY = 64
ACK_WINDOW = 256  # acks in flight while reading back


def payload(i: int) -> bytes:
    return b"kill-%05d" % i


@pytest.mark.slow
def test_acknowledged_messages_survive_sigkill(broker_factory: BrokerFactory, topic: str) -> None:
    """10,000 reliable messages, sent 64 at a time and each acknowledged by the broker, then SIGKILL and a
    restart: the subscription reads every one back, once, in offset order 0..9999, with the payloads sent.
    Each batch of 64 completes before the next starts, so batch k must occupy offsets 64k..64k+63."""
    broker = broker_factory.start()

    async def produce() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            subscriber = await s.consumer(topic, "reader", "durable", SubType.EXCLUSIVE, settle=0)
            await subscriber.close()
            for start in range(0, COUNT, CONCURRENCY):
                batch = range(start, min(start + CONCURRENCY, COUNT))
                await bounded(asyncio.gather(*(producer.send(payload(i), None) for i in batch)),
                              f"sends {start}..{batch[-1]}", 20)

    async def read_back() -> list[tuple[int, bytes]]:
        async with Session(broker.url) as s:
            reader = await s.consumer(topic, "reader", "durable", SubType.EXCLUSIVE, settle=0)
            got: list[tuple[int, bytes]] = []
            acks: set[asyncio.Future[None]] = set()
            while len(got) < COUNT:
                try:
                    m = await reader.get(timeout=10)
                except AssertionError:
                    raise AssertionError(f"read back {len(got)} of {COUNT}; last {got[-3:]}") from None
                got.append((m.msg_id.topic_offset, bytes(m.payload)))
                acks.add(asyncio.ensure_future(reader.ack(m)))
                if len(acks) >= ACK_WINDOW:
                    done, acks = await asyncio.wait(acks, return_when=asyncio.FIRST_COMPLETED)
                    for d in done:
                        d.result()
            if acks:
                for d in (await asyncio.wait(acks))[0]:
                    d.result()
            await reader.expect_silence(0.5)
            return got

    run_async(produce(), timeout=100)
    broker.kill()
    broker.restart()
    got = run_async(read_back(), timeout=100)

    assert [o for o, _ in got] == list(range(COUNT)), "offsets are not 0..9999 in order"
    assert sorted(p for _, p in got) == [payload(i) for i in range(COUNT)], "payloads lost or duplicated"
    misplaced = [(o, p) for o, p in got if o // CONCURRENCY != int(p[5:]) // CONCURRENCY]
    assert not misplaced, f"messages outside their batch's offsets: {misplaced[:5]}"


def test_sigterm_exits_zero_and_restart_recovers_topics_and_subscriptions(
        broker_factory: BrokerFactory, topic: str) -> None:
    """SIGTERM with a consumer stream open: exit code 0. After the restart, both topics are found again, the
    reliable one keeps its strategy, its subscription resumes where it was (a new one would start at the end)
    and new messages get the next offsets (none reused)."""
    broker = broker_factory.start()
    reliable_topic, plain_topic = topic + "_r", topic + "_n"
    sent = [b"term-%d" % i for i in range(5)]

    async def before() -> None:
        async with Session(broker.url) as s, RawApi(broker.target) as api:
            producer = await s.producer(reliable_topic, "p", reliable=True)
            await s.producer(plain_topic, "p")
            keep = await s.consumer(reliable_topic, "c", "keep", SubType.EXCLUSIVE, settle=0)
            await keep.close()
            await send_all(producer, sent)
            # A raw stream stays open through the SIGTERM (the client's loop would redial the stopped broker).
            live = await api.subscribe(reliable_topic, "live", "other")
            stream = api.consumer.ReceiveMessages(
                pb.ReceiveRequest(request_id=1, consumer_id=live.consumer_id))
            await send_all(producer, [b"seen-live"])
            first = await bounded(stream.read(), "the live stream")
            assert bytes(first.payload) == b"seen-live", describe(first)
            await asyncio.to_thread(broker.terminate)  # asserts exit code 0
            try:
                end = await bounded(stream.read(), "the live stream after SIGTERM")
                assert end is grpc.aio.EOF, f"a message after SIGTERM: {describe(end)}"
            except grpc.aio.AioRpcError:
                pass  # the broker is gone: however it ended the stream, it did end

    async def after() -> None:
        async with RawApi(broker.target) as api:
            for name in (reliable_topic, plain_topic):
                request = pb.TopicLookupRequest(request_id=1, topic=name)
                found = await bounded(api.discovery.TopicLookup(request), f"lookup {name}")
                assert found.response_type == pb.TopicLookupResponse.Connect, found
                assert found.broker_url == broker.url, found
                listed = await bounded(api.discovery.TopicPartitions(
                    pb.TopicLookupRequest(request_id=2, topic=name)), f"partitions {name}")
                assert list(listed.partitions) == [name]
            e = await rpc_error(api.create_producer(reliable_topic, "non-reliable"), "NonReliable producer")
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, (
                f"the topic's Reliable strategy was not recovered: {status_line(e)}")

        async with Session(broker.url) as s:
            keep = await s.consumer(reliable_topic, "c", "keep", SubType.EXCLUSIVE)
            got = await keep.get_n(6)
            assert payloads(got) == [*sent, b"seen-live"] and offsets(got) == list(range(6)), [
                describe(m) for m in got]
            for m in got:
                await keep.ack(m)
            producer = await s.producer(reliable_topic, "p", reliable=True)
            await send_all(producer, [b"after-restart"])
            m = await keep.get()
            assert bytes(m.payload) == b"after-restart" and m.msg_id.topic_offset == 6, describe(m)
            await keep.ack(m)

    run_async(before())
    assert not broker.running
    broker.restart()
    run_async(after())

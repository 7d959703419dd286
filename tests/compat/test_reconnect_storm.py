"""Reconnect storms and a connection flood against the broker subprocess.

A storm: 200 consumers of one Shared subscription of a Reliable topic, on 10 connections, all cut at once by a
broker restart; each subscribes again as soon as the broker answers, none waits for another (the official
client reconnects without backoff too). The broker must take them all back within STORM_SECONDS, keep
answering a probe meanwhile, and deliver every message acknowledged before and after the restart.

A flood: CONNECTIONS connections opened at once, each making one call; the broker answers them all, and the
clients already connected keep being served meanwhile.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from compat_support import RawApi, bounded, run_async

from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.testing.broker import BrokerFactory

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

TOPIC = "/default/storm"
CONSUMERS = 200
CHANNELS = 10
BEFORE, AFTER = 300, 300  # messages produced before the restart and after it
STORM_SECONDS = 30.0  # for all 200 to be subscribed and streaming again
PROBE_LIMIT = 5.0  # seconds a health check may take while the storm is on
CONNECTIONS = 300


class StormConsumer:
    """One consumer of the Shared subscription: subscribes (again) until the broker takes it, streams and
    acks; records the message payloads it read and how many times it subscribed."""

    def __init__(self, api: RawApi, index: int, received: list[bytes]) -> None:
        self.api, self.name, self.received = api, f"c{index}", received
        self.subscriptions = 0
        self.streaming = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                answer = await self.api.subscribe(TOPIC, self.name, "s", pb.ConsumerRequest.Shared)
            except (grpc.aio.AioRpcError, AssertionError):
                await asyncio.sleep(0.05)  # the broker is not back yet: at once again, as clients do
                continue
            self.subscriptions += 1
            stream = self.api.consumer.ReceiveMessages(pb.ReceiveRequest(
                request_id=self.api.next_id(), consumer_id=answer.consumer_id))
            self.streaming.set()
            try:
                async for msg in stream:
                    self.received.append(msg.payload)
                    await self.api.consumer.Ack(pb.AckRequest(
                        request_id=msg.request_id, msg_id=msg.msg_id, subscription_name="s"), timeout=5)
            except grpc.aio.AioRpcError:
                pass
            self.streaming.clear()
            stream.cancel()


async def produce(api: RawApi, first: int, count: int) -> list[bytes]:
    producer = await api.create_producer(TOPIC, f"p{first}", reliable=True)
    sent = []
    for i in range(first, first + count):
        data = b"m%05d" % i
        await bounded(api.producer.SendMessage(pb.StreamMessage(
            request_id=api.next_id(), payload=data, producer_name=f"p{first}",
            msg_id=pb.MsgID(producer_id=producer.producer_id, topic_name=TOPIC))), f"send {i}")
        sent.append(data)
    return sent


def test_two_hundred_consumers_reconnect_at_once_after_a_restart(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start()

    async def body() -> None:
        received: list[bytes] = []
        stop = asyncio.Event()
        async with RawApi(broker.target) as api:
            await api.create_producer(TOPIC, "creator", reliable=True)  # the topic, Reliable
        apis = [await RawApi(broker.target).__aenter__() for _ in range(CHANNELS)]
        consumers = [StormConsumer(apis[i % CHANNELS], i, received) for i in range(CONSUMERS)]
        tasks = [asyncio.create_task(c.run(stop)) for c in consumers]
        try:
            await bounded(asyncio.gather(*(c.streaming.wait() for c in consumers)), "200 consumers", 60)
            async with RawApi(broker.target) as api:
                sent = await produce(api, 0, BEFORE)
            await asyncio.to_thread(broker.restart)  # SIGTERM, exit 0, start on the same port
            restarted = time.monotonic()
            async with RawApi(broker.target) as probe:
                slowest = 0.0
                while not all(c.subscriptions >= 2 and c.streaming.is_set() for c in consumers):
                    assert time.monotonic() - restarted < STORM_SECONDS, (
                        f"{sum(c.subscriptions >= 2 for c in consumers)} of {CONSUMERS} consumers back after "
                        f"{STORM_SECONDS} s")
                    started = time.monotonic()
                    await probe.health_check(pb.HealthCheckRequest.Producer, 1)  # any answer will do
                    slowest = max(slowest, time.monotonic() - started)
                    await asyncio.sleep(0.1)
                back = time.monotonic() - restarted
                assert slowest < PROBE_LIMIT, f"a health check took {slowest:.1f} s during the storm"
                sent += await produce(probe, BEFORE, AFTER)
            deadline = time.monotonic() + 30
            while set(sent) - set(received) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            missing = sorted(set(sent) - set(received))
            assert not missing, f"{len(missing)} acknowledged messages never delivered, first {missing[:5]}"
            print(f"all {CONSUMERS} consumers back {back:.1f} s after the restart; slowest probe "
                  f"{slowest:.2f} s")
        finally:
            stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for api in apis:
                await api.__aexit__(None, None, None)
        assert "Traceback" not in broker.log_text(), broker.log_tail()

    run_async(body(), timeout=200)


def test_a_flood_of_connections_is_answered_and_does_not_starve_a_producer(broker_factory: BrokerFactory
                                                                          ) -> None:
    broker = broker_factory.start()

    async def body() -> None:
        async with RawApi(broker.target) as api:
            producer = await api.create_producer(TOPIC, "steady", reliable=True)
            sent = 0

            async def steady() -> float:
                """Sends one message at a time through the flood; the slowest send."""
                nonlocal sent
                slowest = 0.0
                while not flood_done.is_set():
                    started = time.monotonic()
                    await bounded(api.producer.SendMessage(pb.StreamMessage(
                        request_id=api.next_id(), payload=b"steady", producer_name="steady",
                        msg_id=pb.MsgID(producer_id=producer.producer_id, topic_name=TOPIC))),
                        "steady send", 10)
                    slowest = max(slowest, time.monotonic() - started)
                    sent += 1
                return slowest

            async def one_connection(i: int) -> str:
                async with RawApi(broker.target) as c:
                    answer = await bounded(c.discovery.TopicLookup(pb.TopicLookupRequest(
                        request_id=i, topic=TOPIC)), f"lookup on connection {i}", 30)
                    return str(answer.response_type)

            flood_done = asyncio.Event()
            steady_task = asyncio.create_task(steady())
            try:
                answers = await asyncio.gather(*(one_connection(i) for i in range(CONNECTIONS)))
            finally:
                flood_done.set()
            slowest = await steady_task
            assert len(answers) == CONNECTIONS
            assert sent > 0 and slowest < PROBE_LIMIT, f"{sent} steady sends, the slowest {slowest:.1f} s"
        assert "Traceback" not in broker.log_text(), broker.log_tail()

    run_async(body(), timeout=120)

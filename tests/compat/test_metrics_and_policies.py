"""The Prometheus endpoint as a scraper sees it, the namespace policy limits on the wire, and Reliable
redelivery after an ack timeout, with the official client and raw stubs."""

from __future__ import annotations

import asyncio
import re
import time

import grpc
from compat_support import RawApi, Session, offsets, rpc_error, run_async, scrape, status_line
from danube import SubType

from danube_fast.client import FastConsumer, FastProducer
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.testing.broker import Broker, BrokerFactory

BROKER_CONFIG = """
[dispatch]
ack_timeout_ms = 700
"""


def test_metrics_show_rates_bytes_backlog_and_lag(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            consumer = await s.consumer(topic, "c", "lagging", SubType.EXCLUSIVE)
            for i in range(5):
                await producer.send(b"%04d" % i, None)
            got = await consumer.get_n(5)
            for m in got[:3]:
                await consumer.ack(m)  # applied before the RPC answers
            m = await asyncio.to_thread(scrape, broker)
            labels = f'topic="{topic}"'
            sub = f'{labels},subscription="lagging"'
            assert m[f"danube_topic_messages_in_total{{{labels}}}"] == 5
            assert m[f"danube_topic_bytes_in_total{{{labels}}}"] == 20
            assert m[f"danube_topic_committed_offset{{{labels}}}"] == 5
            assert m[f"danube_subscription_messages_out_total{{{sub}}}"] == 5
            assert m[f"danube_subscription_lag{{{sub}}}"] == 2  # offsets 3 and 4 not acknowledged
            assert m[f"danube_subscription_unacked{{{sub}}}"] == 2
            assert m[f"danube_subscription_consumers{{{sub}}}"] == 1
            for extra in got[3:]:
                await consumer.ack(extra)

    run_async(scenario())


def test_delivered_messages_and_bytes_count_both_apis(broker: Broker, topic: str) -> None:
    """One subscription served first to the official client, then to a fast-API stream: its messages and
    bytes out add up over both. The bytes are as stored, so they match what a fast-API subscription that
    read every batch counted."""

    async def scenario() -> None:
        sub = f'topic="{topic}",subscription="both"'
        every = f'topic="{topic}",subscription="every"'
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            consumer = await s.consumer(topic, "c", "both", SubType.EXCLUSIVE)
            for i in range(5):
                await producer.send(b"%04d" % i, None)
            for m in await consumer.get_n(5):
                await consumer.ack(m)  # applied before the RPC answers
            await consumer.close()
        m = await asyncio.to_thread(scrape, broker)
        assert m[f"danube_subscription_messages_out_total{{{sub}}}"] == 5
        danube_bytes = m[f"danube_subscription_bytes_out_total{{{sub}}}"]
        assert danube_bytes > 5 * 4  # payloads and their batches' headers

        producer_fast = await FastProducer.connect(broker.target, topic, "fp", reliable=True)
        await (await producer_fast.send_batch([b"f-%d" % i for i in range(3)]))
        fast = await FastConsumer.connect(broker.target, topic, "both", "fc")
        assert fast.start_offset == 5
        delivery = await asyncio.wait_for(anext(fast.batches()), 10)
        assert (delivery.first_offset, delivery.last_offset) == (5, 7)
        await fast.ack_cumulative(delivery.last_offset)
        reader = await FastConsumer.connect(broker.target, topic, "every", "fc", initial_position="earliest")
        read = 0
        async for got in reader.batches():
            read += got.last_offset - got.first_offset + 1
            await reader.ack_cumulative(got.last_offset)
            if got.last_offset == 7:
                break
        m = await asyncio.to_thread(scrape, broker)
        assert m[f"danube_subscription_messages_out_total{{{sub}}}"] == 5 + 3
        assert m[f"danube_subscription_bytes_out_total{{{sub}}}"] == danube_bytes + len(delivery.data)
        assert m[f"danube_subscription_messages_out_total{{{every}}}"] == read == 8
        assert m[f"danube_subscription_bytes_out_total{{{every}}}"] == \
            m[f"danube_subscription_bytes_out_total{{{sub}}}"]
        for c in (fast, reader):
            await c.close()
        await producer_fast.close()

    run_async(scenario())


def test_metrics_carry_latency_histograms_and_the_process(broker: Broker, topic: str) -> None:
    """Publishes through the official client show in the publish-to-ack and fsync histograms; the library's
    process and GC collectors are there; a scraper asking for OpenMetrics gets it."""
    async def scenario() -> None:
        before = await asyncio.to_thread(scrape, broker)
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            consumer = await s.consumer(topic, "c", "timed", SubType.EXCLUSIVE)
            for i in range(4):
                await producer.send(b"%04d" % i, None)
            for m in await consumer.get_n(4):
                await consumer.ack(m)
        m = await asyncio.to_thread(scrape, broker)
        published = 'danube_publish_ack_seconds_count{api="danube"}'
        assert m[published] - before.get(published, 0) == 4
        assert m['danube_publish_ack_seconds_bucket{api="danube",le="+Inf"}'] == m[published]
        assert m[published.replace("_count", "_sum")] > 0
        assert m["danube_wal_fsync_seconds_count"] > before.get("danube_wal_fsync_seconds_count", 0)
        assert "danube_tier_upload_seconds_count" in m
        delivered = 'danube_delivery_age_seconds_count{api="danube"}'
        assert m[delivered] > before.get(delivered, 0)
        assert m[delivered.replace("_count", "_sum")] < 60 * m[delivered]  # ages, not timestamps
        assert m["process_resident_memory_bytes"] > 10e6 and m["process_open_fds"] > 5
        assert any(name.startswith("python_gc_collections_total") for name in m)
        # The fast API: its publishes and deliveries under api="fast".
        producer = await FastProducer.connect(broker.target, topic + "-fast", "fp")
        consumer = await FastConsumer.connect(broker.target, topic + "-fast", "s", "fc")
        try:
            await (await producer.send_batch([b"a", b"b"]))
            async for delivery in consumer.batches():
                await consumer.ack_cumulative(delivery.last_offset)
                break
        finally:
            await consumer.close()
            await producer.close()
        f = await asyncio.to_thread(scrape, broker)
        assert f['danube_publish_ack_seconds_count{api="fast"}'] >= 1
        assert f['danube_delivery_age_seconds_count{api="fast"}'] >= 1
        assert f['danube_delivery_age_seconds_sum{api="fast"}'] < 60
        om = await asyncio.to_thread(scrape, broker, "application/openmetrics-text; version=1.0.0")
        assert om[f'danube_topic_messages_in_total{{topic="{topic}"}}'] == 4

    run_async(scenario())


def test_unacknowledged_message_comes_back_after_the_ack_timeout(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            consumer = await s.consumer(topic, "c", "slow", SubType.EXCLUSIVE)
            await producer.send(b"forgotten", None)
            first = await consumer.get()
            t0 = time.monotonic()
            again = await consumer.get(timeout=5)
            waited = time.monotonic() - t0
            assert offsets([first, again]) == [0, 0] and bytes(again.payload) == b"forgotten"
            assert 0.5 <= waited <= 3.0, f"redelivered after {waited:.2f} s, ack timeout is 0.7 s"
            await consumer.ack(again)
            await consumer.expect_silence(1.2)  # acked: no further redelivery

    run_async(scenario())


LIMITS = """
[policy]
max_producers_per_topic = 1
max_subscriptions_per_topic = 1
max_consumers_per_subscription = 1
max_consumers_per_topic = 2
"""


def test_policy_limits_answer_with_the_contract_statuses(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(LIMITS)
    topic = "/default/limited"

    async def scenario() -> None:
        async with RawApi(broker.target) as raw:
            await raw.create_producer(topic, "first")
            again = await raw.create_producer(topic, "first")  # the same name is the same producer
            assert again.producer_id
            more = await rpc_error(raw.create_producer(topic, "second"), "a second producer")
            assert more.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, status_line(more)
            assert "max_producers_per_topic" in more.details()

            shared = pb.ConsumerRequest.Shared
            await raw.subscribe(topic, "c1", "only", shared)
            full = await rpc_error(raw.subscribe(topic, "c2", "only", shared), "a 2nd consumer")
            assert full.code() == grpc.StatusCode.PERMISSION_DENIED, status_line(full)
            assert "max_consumers_per_subscription" in full.details()
            other = await rpc_error(raw.subscribe(topic, "c3", "another", shared), "a 2nd subscription")
            assert other.code() == grpc.StatusCode.PERMISSION_DENIED, status_line(other)
            assert re.search(r"max_subscriptions_per_topic", other.details())

    run_async(scenario())

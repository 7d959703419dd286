"""The official client (danube-client 0.5.0) against our broker: the behavioural smoke test of
the wire contract's verification recipe (less admin unload/delete; docs/WIRE.md), plus the four subscription
types, nack backoff, dead-lettering and reliable resume across consumer and broker restarts.

Topics are created by producers first: a consumer cannot subscribe to a topic that does not exist (D.6), and a
new reliable subscription starts at the latest offset (C.9), so consumers subscribe before anything is sent.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from compat_support import ConsumerHandle, Session, collect, describe, offsets, payloads, run_async, send_all
from danube import SubType

from danube_fast.testing.broker import Broker, BrokerFactory

DISPATCH = pytest.mark.parametrize("reliable", [False, True], ids=["non_reliable", "reliable"])


async def ack_all(handle: ConsumerHandle, messages: list[Any]) -> None:
    for m in messages:
        await handle.ack(m)


@DISPATCH
def test_send_receive_ack_preserves_the_message(broker: Broker, topic: str, reliable: bool) -> None:
    """Producer on a new topic in /default, consumer on it, send / receive / ack (B.5, B.9, C.6, D.3-D.5)."""

    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p1", reliable=reliable)
            assert await s.partitions(topic) == [topic]
            consumer = await s.consumer(topic, "c1", "sub", SubType.EXCLUSIVE)
            before = int(time.time() * 1000)
            ids = [
                await producer.send(b"plain", None),
                await producer.send(b"with attributes", {"k": "v", "unicode": "\u00e9\u00df"}),
                await producer.send_with_key(b"keyed", {"a": "1"}, "key-1"),
            ]
            after = int(time.time() * 1000)
            got = await consumer.get_n(3)
            for m in got:
                await consumer.ack(m)
            await consumer.expect_silence(0.3)

        assert payloads(got) == [b"plain", b"with attributes", b"keyed"]
        # send() returns the MessageResponse's request_id: the server must echo the request's (D.3). The
        # client numbers CreateProducer and sends from one counter, so they are consecutive; and the broker
        # passes the producer's request_id through to consumers unchanged (C.6).
        assert ids == [ids[0], ids[0] + 1, ids[0] + 2], f"send() returned {ids}"
        assert [m.request_id for m in got] == ids
        assert [dict(m.attributes) for m in got] == [{}, {"k": "v", "unicode": "\u00e9\u00df"}, {"a": "1"}]
        producer_ids = {m.msg_id.producer_id for m in got}
        assert len(producer_ids) == 1 and 0 not in producer_ids, producer_ids
        for m in got:
            assert m.msg_id.topic_name == topic, describe(m)  # else Consumer.ack drops the ack silently (D.4)
            assert m.msg_id.broker_addr == broker.url, m.msg_id.broker_addr  # as the producer sent it
            assert m.producer_name == "p1"
            assert before <= m.publish_time <= after, (before, m.publish_time, after)  # the client's clock
            assert not m.HasField("schema_id") and not m.HasField("schema_version"), describe(m)  # D.5
        assert [m.HasField("routing_key") for m in got] == [False, False, True]
        assert got[2].routing_key == "key-1"
        # Reliable topics stamp WAL offsets from 0; non-reliable ones pass the client's 0 through (C.6).
        assert offsets(got) == ([0, 1, 2] if reliable else [0, 0, 0])

    run_async(scenario())


def test_partitioned_producer_and_consumer_on_the_base_name(broker: Broker, topic: str) -> None:
    """N = 3 partitions: TopicPartitions returns exactly the -part-N names (not a prefix match, C.3), the
    consumer subscribes to all three, the round-robin sends arrive on their partitions, acks are accepted."""
    parts = [f"{topic}-part-{i}" for i in range(3)]
    sibling = f"{topic}_v2"

    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "pp", partitions=3)
            await s.producer(sibling, "sibling")  # shares the prefix: v0.7.3 would list it as a partition
            listed = await s.partitions(topic)
            assert sorted(listed) == parts and len(listed) == 3, listed
            assert await s.partitions(sibling) == [sibling]
            consumer = await s.consumer(topic, "c", "sub", SubType.EXCLUSIVE)
            ids = await send_all(producer, [b"m%d" % i for i in range(9)])
            got = await consumer.get_n(9)
            for m in got:
                await consumer.ack(m)
            await consumer.expect_silence(0.3)

        # Each partition's TopicProducer has its own request_id counter, so ids repeat across partitions;
        # each message must still carry the id that its send() returned.
        assert {bytes(m.payload): m.request_id for m in got} == {b"m%d" % i: ids[i] for i in range(9)}
        # The client routes send() round-robin starting at partition 0 (B.6).
        by_payload = {bytes(m.payload): m.msg_id.topic_name for m in got}
        assert by_payload == {b"m%d" % i: parts[i % 3] for i in range(9)}
        for part in parts:  # per-partition order is publish order
            assert [p for p in payloads(got) if by_payload[p] == part] == [
                b"m%d" % i for i in range(9) if parts[i % 3] == part]

    run_async(scenario())


@DISPATCH
def test_key_shared_key_filters(broker: Broker, topic: str, reliable: bool) -> None:
    """send_with_key with KeyShared consumers that filter keys by glob (`*`, `?`): each gets exactly the keys
    it accepts, in order, with routing_key passed through; keys no consumer accepts go nowhere (C.10, D.9)."""
    keys = ["a-1", "b-1", "a-22", "b-2", "b-10", "a-1", "b-1", "c-1"]
    sent = [(f"{i}:{k}".encode(), k) for i, k in enumerate(keys)]

    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=reliable)
            a = await s.consumer(topic, "ca", "ks", SubType.KEY_SHARED, key_filters=["a-*"])
            b = await s.consumer(topic, "cb", "ks", SubType.KEY_SHARED, key_filters=["b-?"])
            for payload, key in sent:
                await producer.send_with_key(payload, None, key)
            got_a = await a.get_n(3)
            got_b = await b.get_n(3)
            await ack_all(a, got_a)
            await ack_all(b, got_b)
            await a.expect_silence(0.5)
            await b.expect_silence(0.1)

        assert payloads(got_a) == [p for p, k in sent if k.startswith("a-")]
        assert payloads(got_b) == [p for p, k in sent if k in ("b-1", "b-2")]  # b-10 does not match b-?
        for m in got_a + got_b:
            assert m.HasField("routing_key") and m.routing_key == bytes(m.payload).decode().split(":")[1]

    run_async(scenario())


@DISPATCH
def test_key_shared_affinity(broker: Broker, topic: str, reliable: bool) -> None:
    """Three KeyShared consumers without filters: every key sticks to one consumer, per-key order is kept,
    nothing is lost or duplicated, and the keys are spread over more than one consumer."""
    keys = [f"key-{k}" for k in range(12)]
    rounds = 10

    async def scenario() -> dict[str, list[Any]]:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=reliable)
            handles = [await s.consumer(topic, f"c{i}", "ks", SubType.KEY_SHARED) for i in range(3)]
            for r in range(rounds):
                for key in keys:
                    await producer.send_with_key(f"{key}:{r}".encode(), None, key)
            got = await collect(handles, len(keys) * rounds, ack=reliable)
            for h in handles:
                await h.expect_silence(0.3)
            return got

    got = run_async(scenario())
    owner: dict[str, set[str]] = {}
    for name, messages in got.items():
        for m in messages:
            owner.setdefault(m.routing_key, set()).add(name)
    assert all(len(names) == 1 for names in owner.values()), f"keys delivered to several consumers: {owner}"
    assert sorted(owner) == sorted(keys)
    for name, messages in got.items():
        for key in keys:
            seq = [int(bytes(m.payload).decode().split(":")[1]) for m in messages if m.routing_key == key]
            assert seq in ([], list(range(rounds))), f"{name}, {key}: {seq}"
    assert len([n for n, ms in got.items() if ms]) >= 2, {n: len(ms) for n, ms in got.items()}


@DISPATCH
def test_two_exclusive_subscriptions_each_get_everything(broker: Broker, topic: str, reliable: bool) -> None:
    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=reliable)
            one = await s.consumer(topic, "c1", "sub-one", SubType.EXCLUSIVE)
            two = await s.consumer(topic, "c2", "sub-two", SubType.EXCLUSIVE)
            sent = [b"fan-%d" % i for i in range(20)]
            await send_all(producer, sent)
            for handle in (one, two):
                got = await handle.get_n(20)
                assert payloads(got) == sent, handle.name
                if reliable:
                    assert offsets(got) == list(range(20))
                await ack_all(handle, got)
            await one.expect_silence(0.3)
            await two.expect_silence(0.1)

    run_async(scenario())


@DISPATCH
def test_shared_subscription_round_robin(broker: Broker, topic: str, reliable: bool) -> None:
    """Two consumers on one Shared subscription: each gets some, together exactly everything."""
    sent = [b"rr-%d" % i for i in range(20)]

    async def scenario() -> dict[str, list[Any]]:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=reliable)
            handles = [await s.consumer(topic, f"c{i}", "shared", SubType.SHARED) for i in range(2)]
            await send_all(producer, sent)
            got = await collect(handles, len(sent), ack=reliable)
            for h in handles:
                await h.expect_silence(0.3)
            return got

    got = run_async(scenario())
    counts = {name: len(ms) for name, ms in got.items()}
    assert all(counts.values()), f"a consumer got nothing: {counts}"
    received = [p for ms in got.values() for p in payloads(ms)]
    assert sorted(received) == sorted(sent), counts  # no loss, no duplicate
    for messages in got.values():  # each consumer sees its share in publish order
        assert payloads(messages) == sorted(payloads(messages), key=sent.index)


@DISPATCH
def test_failover_promotes_the_standby(broker: Broker, topic: str, reliable: bool) -> None:
    """Failover: the first consumer gets everything while it lives; once it closes, the standby takes over
    (v0.7.3 never promotes, a defect not to copy: D.16). On a reliable topic the standby also gets what the
    first consumer left unacknowledged."""

    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=reliable)
            first = await s.consumer(topic, "first", "fo", SubType.FAILOVER)
            standby = await s.consumer(topic, "standby", "fo", SubType.FAILOVER)
            await send_all(producer, [b"fo-%d" % i for i in range(5)])
            got = await first.get_n(5)
            assert payloads(got) == [b"fo-%d" % i for i in range(5)]
            await ack_all(first, got[:3])
            await standby.expect_silence(0.3)
            await first.close()
            await asyncio.sleep(0.5)
            await send_all(producer, [b"fo-%d" % i for i in range(5, 10)])
            expected = list(range(3, 10)) if reliable else list(range(5, 10))
            taken_over = await standby.get_n(len(expected))
            assert payloads(taken_over) == [b"fo-%d" % i for i in expected]
            if reliable:
                assert offsets(taken_over) == expected
            await ack_all(standby, taken_over)
            await standby.expect_silence(0.3)

    run_async(scenario())


def test_exclusive_subscription_is_free_again_after_its_consumer_closes(broker: Broker, topic: str) -> None:
    """A closed Exclusive consumer no longer holds the subscription: a consumer under another name can take
    it and gets the unacknowledged rest (D.16: v0.7.3 keeps counting the inactive consumer)."""

    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            first = await s.consumer(topic, "first", "excl", SubType.EXCLUSIVE)
            await send_all(producer, [b"x-%d" % i for i in range(3)])
            got = await first.get_n(3)
            await ack_all(first, got[:2])
            await first.close()
            await asyncio.sleep(0.3)
            second = await s.consumer(topic, "second", "excl", SubType.EXCLUSIVE)
            await send_all(producer, [b"x-3"])
            rest = await second.get_n(2)
            assert payloads(rest) == [b"x-2", b"x-3"] and offsets(rest) == [2, 3]
            await ack_all(second, rest)

    run_async(scenario())


def test_nack_with_delay_redelivers_the_same_message(broker: Broker, topic: str) -> None:
    """Nack with delay_ms: the same message (same topic_offset) comes back after about the delay; a nack
    without delay backs off exponentially from nack_base_delay_ms (1000 ms by default; 2nd nack: 2000 ms);
    other messages keep flowing meanwhile (a window, not one-at-a-time)."""

    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            consumer = await s.consumer(topic, "c", "sub", SubType.EXCLUSIVE)
            await send_all(producer, [b"n0"])
            first = await consumer.get()
            assert bytes(first.payload) == b"n0" and first.msg_id.topic_offset == 0, describe(first)

            t0 = time.monotonic()
            await consumer.nack(first, delay_ms=1500)  # max(1000 * 2^0, 1500) = 1500 ms
            await send_all(producer, [b"n1"])
            other = await consumer.get(timeout=1.0)
            assert bytes(other.payload) == b"n1" and other.msg_id.topic_offset == 1, describe(other)
            await consumer.ack(other)
            again = await consumer.get(timeout=6.0)
            waited = time.monotonic() - t0
            assert 1.3 <= waited <= 4.0, f"redelivered after {waited:.2f} s, expected about 1.5 s"
            assert again.msg_id.topic_offset == 0 and bytes(again.payload) == b"n0", describe(again)
            assert again.msg_id.topic_name == topic and again.request_id == first.request_id

            t1 = time.monotonic()
            await consumer.nack(again)  # the 2nd nack, no delay asked: 1000 * 2^1 = 2000 ms
            third = await consumer.get(timeout=7.0)
            waited = time.monotonic() - t1
            assert 1.7 <= waited <= 5.0, f"2nd redelivery after {waited:.2f} s, expected about 2 s"
            assert third.msg_id.topic_offset == 0, describe(third)
            await consumer.ack(third)
            await consumer.expect_silence(0.5)

    run_async(scenario())


def test_reliable_redelivery_after_consumer_reconnect(broker: Broker, topic: str) -> None:
    """Offsets are contiguous from 0; after a reconnect (same consumer name) the unacknowledged messages come
    back and the acknowledged ones do not."""

    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            consumer = await s.consumer(topic, "c", "sub", SubType.EXCLUSIVE)
            sent = [b"r-%d" % i for i in range(10)]
            await send_all(producer, sent)
            got = await consumer.get_n(10)
            assert offsets(got) == list(range(10)) and payloads(got) == sent
            await ack_all(consumer, got[:5])
            await consumer.close()

            again = await s.consumer(topic, "c", "sub", SubType.EXCLUSIVE)
            back = await again.get_n(5)
            assert offsets(back) == list(range(5, 10)) and payloads(back) == sent[5:]
            await again.expect_silence(0.5)
            await ack_all(again, back)

    run_async(scenario())


DLQ_CONFIG = """
[dispatch]
max_redeliveries = 2
nack_base_delay_ms = 50
nack_max_delay_ms = 200
"""


def test_dead_letter_after_max_redeliveries(broker_factory: BrokerFactory, topic: str) -> None:
    """max_redeliveries = 2: the message is delivered 3 times (1 + 2 redeliveries), then the next nack moves
    it to <topic>-dlq, where a consumer gets it; the subscription goes on with the next message."""
    broker = broker_factory.start(DLQ_CONFIG)
    dlq = f"{topic}-dlq"

    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            await s.producer(dlq, "dlq-maker", reliable=True)  # so that the DLQ can be subscribed to now
            dead = await s.consumer(dlq, "dlq-reader", "dlq-sub", SubType.EXCLUSIVE)
            main = await s.consumer(topic, "c", "sub", SubType.EXCLUSIVE)

            poisoned: list[Any] = []
            healthy: list[Any] = []

            async def nack_the_poison() -> None:
                while True:
                    m = await main.queue.get()
                    if bytes(m.payload) == b"poison":
                        poisoned.append(m)
                        await main.nack(m)
                    else:
                        healthy.append(m)
                        await main.ack(m)

            worker = asyncio.ensure_future(nack_the_poison())
            try:
                await producer.send(b"poison", {"origin": "test"})
                dead_letter = await dead.get(timeout=10.0)
                await asyncio.sleep(0.6)  # a 4th delivery would come within nack_max_delay_ms
                assert len(poisoned) == 3, [describe(m) for m in poisoned]
                assert offsets(poisoned) == [0, 0, 0]
                await producer.send(b"after", None)
                deadline = time.monotonic() + 5
                while not healthy and time.monotonic() < deadline and not worker.done():
                    await asyncio.sleep(0.05)
                if worker.done():
                    worker.result()
                assert payloads(healthy) == [b"after"] and offsets(healthy) == [1], [
                    describe(m) for m in healthy]
            finally:
                worker.cancel()
                await asyncio.gather(worker, return_exceptions=True)

            assert bytes(dead_letter.payload) == b"poison", describe(dead_letter)
            assert dead_letter.msg_id.topic_name == dlq, describe(dead_letter)  # so that acks reach it
            assert dead_letter.msg_id.topic_offset == 0, describe(dead_letter)
            assert dead_letter.attributes.get("origin") == "test", dict(dead_letter.attributes)
            await dead.ack(dead_letter)
            await dead.expect_silence(0.3)

    run_async(scenario())


def test_reliable_resume_after_consumer_and_broker_restart(broker_factory: BrokerFactory, topic: str) -> None:
    """A subscription resumes after its acknowledged messages: after the consumer closes (unacked ones come
    back, followed by what was sent meanwhile), and after a SIGTERM + restart of the broker (nothing at or
    below the acknowledged floor comes back)."""
    broker = broker_factory.start()
    sent = [b"resume-%d" % i for i in range(15)]

    async def before_restart() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            consumer = await s.consumer(topic, "c", "resume", SubType.EXCLUSIVE)
            await send_all(producer, sent[:10])
            got = await consumer.get_n(10)
            assert offsets(got) == list(range(10))
            await ack_all(consumer, got[:6])
            await consumer.close()

            await send_all(producer, sent[10:])
            consumer = await s.consumer(topic, "c", "resume", SubType.EXCLUSIVE)
            rest = await consumer.get_n(9)
            assert offsets(rest) == list(range(6, 15)) and payloads(rest) == sent[6:]
            await consumer.expect_silence(0.3)
            await ack_all(consumer, rest[:6])  # the floor is now offset 11
            await consumer.close()

    async def after_restart() -> None:
        async with Session(broker.url) as s:
            consumer = await s.consumer(topic, "c", "resume", SubType.EXCLUSIVE)
            rest = await consumer.get_n(3)
            assert offsets(rest) == [12, 13, 14] and payloads(rest) == sent[12:]
            await consumer.expect_silence(1.0)
            await ack_all(consumer, rest)

    run_async(before_restart())
    broker.terminate()
    broker.restart()
    run_async(after_restart())

"""Delayed delivery (docs/SUBSCRIPTIONS.md, "Delayed delivery") with the official client, unchanged: the
reserved attribute `danube-deliver-at`; Shared subscriptions get a record no earlier than its time,
Exclusive ones at once and in order; a kill -9 keeps what waits; a full index reads the rest again from the
log; bad times are refused, naming the value, with nothing stored."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest
from compat_support import Session, offsets, run_async, send_all
from danube import SubType

from danube_fast import deliver_at
from danube_fast.client import FastProducer
from danube_fast.codec import frames
from danube_fast.proto import SubscriptionAdmin_pb2 as sub_pb
from danube_fast.proto import SubscriptionAdmin_pb2_grpc as sub_grpc
from danube_fast.testing.broker import Broker, BrokerFactory

FAST_SAVE = "[dispatch]\ncursor_flush_ms = 200\ncursor_flush_acks = 1\n"


def now_ms() -> int:
    return int(time.time() * 1000)


ACKS_IN_FLIGHT = 16  # the official client acks one message per call: one at a time is too slow under load


async def receive_all(handle: Any, count: int, timeout: float, ack: bool = True) -> list[tuple[Any, int]]:
    """(message, ms when it came) for `count` messages, each acknowledged as it comes by a task of its own
    (ACKS_IN_FLIGHT at once), so that the time a message came is not held back by acks. Acks sent only once
    all came (or one at a time) would, on a busy machine, reach the broker after the ack timeout of some,
    which are then rightly delivered again."""
    room = asyncio.Semaphore(ACKS_IN_FLIGHT)
    acks: list[asyncio.Task[None]] = []

    async def acked(m: Any) -> None:
        async with room:
            await handle.ack(m)

    got: list[tuple[Any, int]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{len(got)} of {count} within {timeout} s: {offsets(m for m, _ in got)}"
            try:
                m = await asyncio.wait_for(handle.queue.get(), remaining)
            except TimeoutError:
                continue
            got.append((m, now_ms()))
            if ack:
                acks.append(asyncio.create_task(acked(m)))
    finally:
        await asyncio.gather(*acks)
    return got


def never_early(got: list[tuple[Any, int]]) -> None:
    for m, came in got:
        at = m.attributes.get(deliver_at.ATTRIBUTE)
        if at is not None:
            assert came >= int(at), f"offset {m.msg_id.topic_offset} came {int(at) - came} ms early"


def test_shared_waits_for_the_time_and_exclusive_delivers_at_once(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            shared = await s.consumer(topic, "sh", "shared", SubType.SHARED)
            exclusive = await s.consumer(topic, "ex", "exclusive", SubType.EXCLUSIVE)
            at = now_ms() + 1500
            for i in range(6):
                attributes = deliver_at.attributes(at, n=str(i)) if i % 2 else {"n": str(i)}
                await producer.send(b"r%d" % i, attributes)
            in_order = await receive_all(exclusive, 6, 5)
            assert offsets(m for m, _ in in_order) == list(range(6))
            assert all(came < at for _, came in in_order)  # Exclusive: at once
            first = await receive_all(shared, 3, 5)
            assert sorted(offsets(m for m, _ in first)) == [0, 2, 4]
            later = await receive_all(shared, 3, 10)
            assert sorted(offsets(m for m, _ in later)) == [1, 3, 5]
            never_early(later)
            assert all(came <= at + 2000 for _, came in later)  # on time (the fine bucket and the pass)
            await shared.expect_silence(0.5)

    run_async(scenario())


def test_bad_times_are_refused_naming_the_value_and_nothing_is_stored(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            reader = await s.consumer(topic, "ex", "exclusive", SubType.EXCLUSIVE)
            days = 24 * 3600 * 1000
            for value, words in ((str(now_ms() - 3_600_000), "in the past"),
                                 (str(now_ms() + 400 * days), "ahead"),
                                 ("tomorrow", "milliseconds since the Unix epoch")):
                with pytest.raises(Exception) as e:
                    await producer.send(b"bad", {deliver_at.ATTRIBUTE: value})
                text = str(e.value)
                assert "INVALID_ARGUMENT" in text or isinstance(e.value, grpc.aio.AioRpcError), text
                assert words in text and deliver_at.ATTRIBUTE in text, text
            await send_all(producer, [b"good"])
            good = await reader.get()
            assert good.msg_id.topic_offset == 0 and bytes(good.payload) == b"good"  # nothing stored before

    run_async(scenario())


def test_waiting_records_survive_a_kill_and_what_was_acked_is_not_sent_again(
        broker_factory: BrokerFactory, topic: str) -> None:
    broker = broker_factory.start(FAST_SAVE)

    async def before() -> int:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            shared = await s.consumer(topic, "sh", "shared", SubType.SHARED)
            at = now_ms() + 6000
            for i in range(40):
                await producer.send(b"r%d" % i, deliver_at.attributes(at) if i % 2 else {})
            got = await receive_all(shared, 20, 10)
            assert sorted(offsets(m for m, _ in got)) == list(range(0, 40, 2))
            await asyncio.sleep(1.0)  # the floor and the delayed state are saved (cursor_flush_ms)
            return at

    at = run_async(before())
    broker.kill()
    broker.start()

    async def after() -> None:
        async with Session(broker.url) as s:
            shared = await s.consumer(topic, "sh", "shared", SubType.SHARED)
            got = await receive_all(shared, 20, 20)
            assert sorted(offsets(m for m, _ in got)) == list(range(1, 40, 2))
            never_early(got)
            assert min(came for _, came in got) >= at
            await shared.expect_silence(1.0)

    run_async(after())


def test_a_full_index_reads_the_latest_again_from_the_log(broker_factory: BrokerFactory, topic: str) -> None:
    broker = broker_factory.start("[dispatch]\ndelayed_index_records = 20\n")

    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            shared = await s.consumer(topic, "sh", "shared", SubType.SHARED)
            start = now_ms() + 1000
            count = 120
            for i in range(count):  # the latest first: the index must leave out the ones it read first
                await producer.send(b"r%d" % i, deliver_at.attributes(start + (count - i) * 25))
            got = await receive_all(shared, count, 30)
            assert sorted(offsets(m for m, _ in got)) == list(range(count))
            never_early(got)
            await shared.expect_silence(0.5)

    run_async(scenario())


def test_the_fast_api_carries_the_time_as_the_same_attribute(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await FastProducer.connect(broker.target, topic, "fast")
            try:
                shared = await s.consumer(topic, "sh", "shared", SubType.SHARED)
                at = now_ms() + 1200
                records = [frames.Record(b"f%d" % i, attributes=deliver_at.attributes(at) if i % 2 else None)
                           for i in range(4)]
                await asyncio.wait_for(await producer.send_records(records), 10)
            finally:
                await producer.close()
            first = await receive_all(shared, 2, 5)
            assert sorted(offsets(m for m, _ in first)) == [0, 2] and all(c < at for _, c in first)
            later = await receive_all(shared, 2, 10)
            assert sorted(offsets(m for m, _ in later)) == [1, 3]
            never_early(later)

    run_async(scenario())


MILLION = 1_000_000
SOON_EVERY = 1000  # every 1000th record is due soon; the others across the next 24 h
SOON_MS = 50_000
# A long ack timeout: the test is about delayed records' times, and a busy machine's 1,000 acks of the
# official client (one call each) must not turn into redeliveries the silence check then sees.
BOUNDED = "[broker]\nmalloc_keep_bytes = 16777216\n[wal]\ncache_total_bytes = 16777216\n" + \
    FAST_SAVE + "ack_timeout_ms = 600000\n"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def describe(broker: Broker, topic: str, sub: str) -> Any:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
        stub: Any = sub_grpc.SubscriptionAdminStub(channel)  # type: ignore[no-untyped-call]
        got = await stub.Describe(sub_pb.DescribeRequest(topic=topic, subscription=sub), timeout=10)
        return got.partitions[0]


async def backlog(broker: Broker, topic: str, sub: str) -> int:
    return int((await describe(broker, topic, sub)).backlog)


async def until_indexed(broker: Broker, topic: str, timeout: float) -> None:
    """The subscription's floor has passed every record: each one is in the delay index (or delivered)."""
    deadline = time.monotonic() + timeout
    while await backlog(broker, topic, "shared") > 0:
        assert time.monotonic() < deadline, "the delayed records were not all read within the time"
        await asyncio.sleep(0.2)


def test_a_million_waiting_over_a_day_in_bounded_memory_then_a_kill(broker_factory: BrokerFactory,
                                                                     topic: str) -> None:
    """1,000,000 records due over the next 24 h: the broker holds them in a few tens of MB (16 B each in the
    index; one Python message per record would be ~0.5 GB), and after a kill -9 the ones due soon come on
    time and no other comes early."""
    broker = broker_factory.start(BOUNDED)

    async def before() -> tuple[int, float]:
        async with Session(broker.url) as s:
            producer = await FastProducer.connect(broker.target, topic, "fast")
            try:
                shared = await s.consumer(topic, "sh", "shared", SubType.SHARED)
                await asyncio.sleep(1.0)
                base = rss_mb(broker.pid)
                first_soon = now_ms() + SOON_MS
                for first in range(0, MILLION, 10_000):
                    soon = now_ms() + SOON_MS  # after the restart, even on a slow machine
                    later = first_soon + 2 * SOON_MS
                    records = [frames.Record(b"d", attributes=deliver_at.attributes(
                        soon if i % SOON_EVERY == 0 else later + (i * 86_400_000) // MILLION))
                        for i in range(first, first + 10_000)]
                    await asyncio.wait_for(await producer.send_records(records), 30)
            finally:
                await producer.close()
            await until_indexed(broker, topic, 120)
            grown = rss_mb(broker.pid) - base
            assert (await describe(broker, topic, "shared")).delayed == MILLION  # all waiting, none held back
            await shared.expect_silence(0.5)
            assert now_ms() < first_soon, "producing and indexing took longer than SOON_MS"
            return first_soon, grown

    soon, grown = run_async(before(), timeout=240)
    assert grown < 150, f"the broker grew {grown:.0f} MB holding a million delayed records"
    broker.kill()
    broker.start()

    async def after() -> None:
        async with Session(broker.url) as s:
            shared = await s.consumer(topic, "sh", "shared", SubType.SHARED)
            got = await receive_all(shared, MILLION // SOON_EVERY, 90)
            waiting = (await describe(broker, topic, "shared")).delayed  # read again after the kill
            assert waiting == MILLION - MILLION // SOON_EVERY, waiting
            assert sorted(offsets(m for m, _ in got)) == list(range(0, MILLION, SOON_EVERY))
            never_early(got)
            assert max(came for _, came in got) <= soon + 2 * SOON_MS
            await shared.expect_silence(2.0)

    run_async(after(), timeout=150)
    assert rss_mb(broker.pid) < 400

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
from danube_fast.testing.broker import Broker, BrokerFactory

FAST_SAVE = "[dispatch]\ncursor_flush_ms = 200\ncursor_flush_acks = 1\n"


def now_ms() -> int:
    return int(time.time() * 1000)


async def receive_all(handle: Any, count: int, timeout: float, ack: bool = True) -> list[tuple[Any, int]]:
    """(message, ms when it came) for `count` messages."""
    got: list[tuple[Any, int]] = []
    for m in await _gather(handle, count, timeout):
        got.append(m)
        if ack:
            await handle.ack(m[0])
    return got


async def _gather(handle: Any, count: int, timeout: float) -> list[tuple[Any, int]]:
    got: list[tuple[Any, int]] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"{len(got)} of {count} within {timeout} s: {offsets(m for m, _ in got)}"
        try:
            m = await asyncio.wait_for(handle.queue.get(), remaining)
        except TimeoutError:
            continue
        got.append((m, now_ms()))
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

"""Idle topics give back their log ([wal] idle_release_ms): a real broker, the official client kept connected
across the release, the fast reader reading from disk afterwards, the metric and the broker's descriptors."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from compat_support import Session, offsets, payloads, run_async, scrape, send_all
from danube import SubType

from danube_fast.client.reader import TopicReader
from danube_fast.codec import frames
from danube_fast.testing.broker import Broker, BrokerFactory

RELEASED = "danube_topics_idle_released"


def descriptors_under(pid: int, directory: Path) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(directory) + os.sep)
        except OSError:
            continue
    return count


async def wait_released(broker: Broker, want: float) -> None:
    deadline = time.monotonic() + 15
    while (await asyncio.to_thread(scrape, broker)).get(RELEASED) != want:
        assert time.monotonic() < deadline, f"{RELEASED} never became {want}"
        await asyncio.sleep(0.1)


def test_an_idle_topic_releases_its_log_and_its_clients_carry_on(broker_factory: BrokerFactory,
                                                                  topic: str) -> None:
    broker = broker_factory.start("[wal]\nidle_release_ms = 400\n")
    wal_dir = broker.data_dir / "wal" / "default" / topic.rsplit("/", 1)[1]
    sent = [b"idle-%d" % i for i in range(10)]

    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            consumer = await s.consumer(topic, "c", "sub", SubType.EXCLUSIVE)
            await send_all(producer, sent[:5])
            got = await consumer.get_n(5)
            for m in got:
                await consumer.ack(m)
            assert descriptors_under(broker.pid, wal_dir) >= 1
            await wait_released(broker, 1)
            assert descriptors_under(broker.pid, wal_dir) == 0
            # The same producer and consumer, still connected: the next send reopens the log.
            await send_all(producer, sent[5:])
            rest = await consumer.get_n(5)
            assert offsets(rest) == list(range(5, 10)) and payloads(rest) == sent[5:]
            for m in rest:
                await consumer.ack(m)
            assert (await asyncio.to_thread(scrape, broker))[RELEASED] == 0
            await wait_released(broker, 1)
            async with TopicReader(broker.target) as reader:  # old records, from disk this time
                items = [item async for item in reader.read(topic, 0, 10)]
            assert [r.payload for data, _, _ in items for r in frames.decode_records(data)] == sent

    run_async(scenario(), timeout=90)

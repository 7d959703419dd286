"""Stalled consumers against the broker subprocess: what the broker holds for them is bounded by bytes
([dispatch] window_bytes per consumer, broker_bytes in all), not by the message window (two
stalled consumers of a topic of 1 MiB messages took the broker to 1.5 GiB), and what it did not deliver
stays in the WAL and goes out once the consumer reads again."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from compat_support import RawApi, bounded, describe, run_async

from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.testing.broker import BrokerFactory

MIB = 1024 * 1024
MESSAGES = 200
WINDOW_BYTES = 4 * MIB
BROKER_BYTES = 8 * MIB
CONFIG = f"""
[wal]
sync = "none"
cache_bytes = {8 * MIB}

[dispatch]
window_bytes = {WINDOW_BYTES}
broker_bytes = {BROKER_BYTES}
"""
# Publishing 1 MiB messages costs the broker memory of its own: request buffers that the garbage collector and
# the allocator give back late (peak RSS +130 MiB over 200 messages, with no subscription at all). So the
# test publishes MESSAGES twice, before the consumers subscribe and while they stall, and compares the peaks:
# the difference is what the stalled consumers hold. Measured: 20-40 MiB with the byte bounds, about 400 MiB
# without them (every message queued for both).
SLACK = 64 * MIB  # gRPC's buffers (a message being sent per stream), the produce path's variation
SETTLE = 1.0  # seconds without RSS growth after which dispatch is taken to have gone as far as it will


def rss(pid: int) -> int:
    """VmRSS of process `pid`, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


@contextlib.asynccontextmanager
async def peak_rss(pid: int) -> AsyncIterator[list[int]]:
    """The highest RSS seen (sampled every 20 ms) while the block runs, in a one-item list."""
    top = [rss(pid)]

    async def sample() -> None:
        while True:
            top[0] = max(top[0], rss(pid))
            await asyncio.sleep(0.02)

    task = asyncio.ensure_future(sample())
    try:
        yield top
    finally:
        task.cancel()
        top[0] = max(top[0], rss(pid))


async def settled(pid: int, timeout: float = 10.0) -> None:
    """Wait until the broker's RSS stopped growing for SETTLE seconds."""
    deadline = time.monotonic() + timeout
    top, since = rss(pid), time.monotonic()
    while time.monotonic() - since < SETTLE:
        if time.monotonic() > deadline:
            raise AssertionError(f"the broker's RSS still grew after {timeout} s: {rss(pid) / MIB:.0f} MiB")
        await asyncio.sleep(0.1)
        now = rss(pid)
        if now > top + MIB:
            top, since = now, time.monotonic()


def test_stalled_consumers_hold_bounded_bytes_and_get_the_rest_later(broker_factory: BrokerFactory,
                                                                      topic: str) -> None:
    broker = broker_factory.start(CONFIG)
    assert broker.process is not None
    pid = broker.process.pid

    async def scenario() -> None:
        async with RawApi(broker.target) as api:
            producer = await api.create_producer(topic, "p", reliable=True)
            payload = b"x" * (MIB - 8)

            async def send(i: int) -> None:
                await bounded(api.producer.SendMessage(pb.StreamMessage(
                    request_id=i, msg_id=pb.MsgID(producer_id=producer.producer_id, topic_name=topic,
                                                  broker_addr=broker.url),
                    payload=b"%08d" % i + payload)), f"send {i}")

            async with peak_rss(pid) as alone:  # the produce path's own memory, before anybody subscribes
                for i in range(MESSAGES):
                    await send(i)
                await settled(pid)

            # Subscriptions start at the end: they get what comes next, queued for them from Subscribe on
            # whether or not their streams are open yet (a consumer starts active).
            streams = {}
            for name in ("stalled", "slow"):
                consumer = await api.subscribe(topic, name, name)
                request = pb.ReceiveRequest(request_id=1, consumer_id=consumer.consumer_id)
                streams[name] = api.consumer.ReceiveMessages(request)
            async with peak_rss(pid) as peak:
                for i in range(MESSAGES, 2 * MESSAGES):
                    await send(i)
                    if i == MESSAGES:  # "slow" reads one message, then stops reading; "stalled" never reads
                        first = await bounded(streams["slow"].read(), "the first message")
                        assert first.payload[:8] == b"%08d" % i, describe(first)
                await settled(pid)
            growth, bound = peak[0] - alone[0], BROKER_BYTES + 2 * WINDOW_BYTES + SLACK
            assert growth < bound, (f"the broker's peak RSS was {peak[0] / MIB:.0f} MiB with two stalled "
                                    f"consumers, {alone[0] / MIB:.0f} MiB for the same messages without "
                                    f"them; the configuration bounds what they hold to {bound / MIB:.0f} MiB")

            # What "slow" was not sent is still in the WAL: it gets every message once it reads and acks.
            slow = streams["slow"]
            await api.consumer.Ack(pb.AckRequest(request_id=1, msg_id=first.msg_id, subscription_name="slow"))
            for i in range(MESSAGES + 1, 2 * MESSAGES):
                m = await bounded(slow.read(), f"message {i} to the consumer that read again")
                assert m.payload[:8] == b"%08d" % i, describe(m)
                await bounded(api.consumer.Ack(pb.AckRequest(request_id=i, msg_id=m.msg_id,
                                                             subscription_name="slow")), f"ack {i}")
            for stream in streams.values():
                stream.cancel()

    run_async(scenario(), timeout=60)

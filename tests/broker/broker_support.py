"""Helpers of the broker unit tests: messages, a reliable subscription over a real WAL, reading consumers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from danube_fast.broker import messages
from danube_fast.broker.assemble import assemble
from danube_fast.broker.broker import Broker
from danube_fast.broker.config import BrokerConfig, DispatchConfig
from danube_fast.broker.consumer import Consumer
from danube_fast.broker.dispatch.budget import ByteBudget
from danube_fast.broker.dispatch.cursor import Cursor
from danube_fast.broker.dispatch.reliable import ReliableDispatcher
from danube_fast.broker.subscription import Subscription
from danube_fast.broker.topic import DispatchParts, Topic
from danube_fast.meta.resources import SubscriptionType
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.storage import SyncPolicy, Wal, WalConfig

Run = Callable[..., Any]

TOPIC = "/default/orders"
# Millisecond clocks (uvloop's loop.time() has 1 ms resolution): lower bounds on delays allow this much.
CLOCK_SLACK = 0.003


def message(i: int, key: str | None = None, producer: str = "producer-1") -> pb.StreamMessage:
    """A message whose payload names its publish sequence number `i`."""
    m = pb.StreamMessage(request_id=i, payload=b"m%d" % i, publish_time=1_700_000_000_000 + i,
                         producer_name=producer,
                         msg_id=pb.MsgID(producer_id=7, topic_name=TOPIC, broker_addr="127.0.0.1:6650"))
    if key is not None:
        m.routing_key = key
    return m


def offsets(msgs: Iterable[pb.StreamMessage]) -> list[int]:
    return [m.msg_id.topic_offset for m in msgs]


def payloads(msgs: Iterable[pb.StreamMessage]) -> list[bytes]:
    return [m.payload for m in msgs]


async def receive(consumer: Consumer, token: int, n: int, timeout: float = 2.0) -> list[pb.StreamMessage]:
    """Exactly `n` messages from the consumer's stream `token` (what else is queued stays queued)."""
    out: list[pb.StreamMessage] = []

    async def collect() -> None:
        while len(out) < n:
            got = await consumer.take(token, limit=n - len(out))
            if not got:
                raise AssertionError(f"stream {token} of consumer {consumer.name} ended after {len(out)}")
            out.extend(got)

    try:
        await asyncio.wait_for(collect(), timeout)
    except TimeoutError:
        raise AssertionError(f"consumer {consumer.name} got {offsets(out)} of {n} messages in {timeout} s"
                             ) from None
    return out


async def until(condition: Callable[[], bool], timeout: float = 2.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.001)


async def quiet(*consumers: Consumer, wait: float = 0.05) -> None:
    """Give the dispatcher time to misbehave, then check nothing more reached these consumers."""
    await asyncio.sleep(wait)
    for c in consumers:
        assert c.queued == 0, f"consumer {c.name} got {offsets(c.drain_queue())} unexpectedly"


@dataclass
class Rig:
    """A Reliable subscription on a real WAL, recording its cursor saves and dead letters."""

    wal: Wal
    sub: Subscription
    dispatcher: ReliableDispatcher
    saved: list[int] = field(default_factory=list)
    dead: list[pb.StreamMessage] = field(default_factory=list)

    def consumer(self, cid: int, name: str | None = None, filters: Iterable[str] = (),
                 window: int = 100) -> tuple[Consumer, int]:
        """A consumer added to the subscription, with its stream attached (as ReceiveMessages does)."""
        c = Consumer(cid, name or f"c{cid}", self.sub, list(filters), window)
        self.sub.add(c)
        token = c.attach()
        self.sub.stream_started(c)
        return c, token

    async def publish(self, *msgs: pb.StreamMessage) -> list[int]:
        out = []
        for m in msgs:
            first, _ = await self.wal.append(messages.encode(m))
            out.append(first)
        self.dispatcher.notify()
        return out

    def lose(self, c: Consumer, token: int) -> None:
        """The consumer's stream ends (the client went away), as ReceiveMessages' cleanup does."""
        assert c.detach(token)
        self.sub.stream_ended(c)


@contextlib.asynccontextmanager
async def reliable(tmp_path: Path, kind: SubscriptionType, config: DispatchConfig, *, start: int = 0,
                   preload: int = 0, hold_saves: asyncio.Event | None = None) -> AsyncIterator[Rig]:
    """A Reliable subscription of `kind` starting at `start`, its WAL already holding `preload` messages;
    with `hold_saves`, each cursor write (listed in `saved` as it starts) ends once that event is set."""
    wal = await Wal.open(tmp_path / "wal", WalConfig(sync=SyncPolicy("none")))
    try:
        for i in range(preload):
            await wal.append(messages.encode(message(i)))
        sub = Subscription(TOPIC, "sub", kind)
        saved: list[int] = []
        dead: list[pb.StreamMessage] = []

        async def save_cursor(offset: int, _delayed: object = None) -> None:
            saved.append(offset)
            if hold_saves is not None:
                await hold_saves.wait()

        async def dead_letter(msg: pb.StreamMessage) -> None:
            dead.append(msg)

        dispatcher = ReliableDispatcher(sub, wal, config, Cursor(start, save_cursor, config), dead_letter)
        sub.dispatcher = dispatcher
        try:
            yield Rig(wal, sub, dispatcher, saved, dead)
        finally:
            await dispatcher.close()
    finally:
        await wal.close()


def attach_subscription(topic: Topic, name: str, kind: SubscriptionType, buffer: int = 100) -> Subscription:
    """A subscription of `topic` with the dispatcher the topic gives it (live for a NonReliable one)."""

    def no_saver(topic: Topic, name: str) -> Callable[[int], Any]:
        raise AssertionError("a live subscription has no cursor")

    async def no_dead_letters(topic: Topic, msg: pb.StreamMessage) -> None:
        raise AssertionError("a live subscription has no dead letters")

    parts = DispatchParts(DispatchConfig(buffer=buffer), ByteBudget(DispatchConfig.broker_bytes), no_saver,
                          no_dead_letters)
    sub = Subscription(topic.full, name, kind)
    sub.dispatcher = topic.dispatcher_for(sub, 0, parts)
    topic.add_subscription(sub)
    return sub


@contextlib.asynccontextmanager
async def in_process_broker(data_dir: Path) -> AsyncIterator[Broker]:
    """A standalone broker in this process on ephemeral ports (no native transport, console or metrics),
    WAL without fsync; stopped after."""
    config = BrokerConfig(data_dir=str(data_dir), wal=WalConfig(sync=SyncPolicy("none")),
                          broker_addr="127.0.0.1:0", admin_addr="127.0.0.1:0", prom_exporter="",
                          fast_addr="", console_addr="")
    broker = await assemble(config)
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()

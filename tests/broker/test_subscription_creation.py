"""Subscribing to a subscription that does not exist yet: calls that arrive together (the official client
subscribes to every partition of a topic at once, and two consumers of one Failover subscription often
start together) get one subscription, one dispatcher, one stored record."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from danube_fast.broker.clients import Clients
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.dispatch.budget import ByteBudget
from danube_fast.broker.ownership import Unfenced
from danube_fast.broker.subscriptions import Subscriptions
from danube_fast.broker.topic import ReliableTopic, Topic
from danube_fast.errors import ApiError
from danube_fast.meta import keys
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.resources import Policy, SubscriptionType
from danube_fast.meta.store import MetadataUnavailable, Op, Put, TxnResult
from danube_fast.names import TopicName
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.storage import SyncPolicy, Wal, WalConfig
from tests.broker.broker_support import message

Run = Callable[..., Any]
FAILOVER = SubscriptionType.FAILOVER


class Rig:
    """A Reliable topic with five records and its Subscriptions, over a store whose writes of the
    subscription's record wait for `go` (and fail once when `fail` is set)."""

    def __init__(self, store: EmbeddedStore, wal: Wal, topic: ReliableTopic) -> None:
        self.store, self.wal, self.topic = store, wal, topic
        self.clients = Clients()
        self.go = asyncio.Event()
        self.fail = False
        self.writes = 0  # of the subscription's record
        self.held = asyncio.Event()  # a write of it is waiting for `go`
        write = store.transaction

        async def transaction(compare: Sequence[Any], success: Sequence[Op],
                              failure: Sequence[Op] = ()) -> TxnResult:
            if any(isinstance(op, Put) and op.key == keys.topic_subscription("default", "made", "s")
                   for op in success):
                self.writes += 1
                self.held.set()
                await self.go.wait()
                if self.fail:
                    self.fail = False
                    raise MetadataUnavailable("the store is away (test)")
            return await write(compare, success, failure)

        store.transaction = transaction  # type: ignore[method-assign]

        async def no_dead_letters(name: TopicName, delivery: Any) -> Topic:
            raise AssertionError("no dead letters here")

        self.subs = Subscriptions(BrokerConfig(), store, self.clients, ByteBudget(1 << 20), no_dead_letters,
                                  lambda: [topic])

    def subscribe(self, consumer: str) -> asyncio.Task[int]:
        return asyncio.create_task(self.subs.subscribe(self.topic, pb.ConsumerRequest(
            topic_name=self.topic.full, consumer_name=consumer, subscription="s",
            subscription_type=int(FAILOVER)), "earliest"))

    async def close(self) -> None:
        await self.subs.close(self.topic, save=False)
        await self.wal.close()
        await self.store.close()


async def rig(tmp_path: Path) -> Rig:
    store = await EmbeddedStore.open(tmp_path / "meta.db")
    wal = await Wal.open(tmp_path / "wal", WalConfig(sync=SyncPolicy("none")))
    topic = ReliableTopic(TopicName("default", "made"), Policy(), Unfenced(store), wal)
    for i in range(5):
        await topic.publish(message(i))
    return Rig(store, wal, topic)


def test_two_subscribes_at_once_make_one_subscription_that_both_consumers_join(tmp_path: Path,
                                                                               run: Run) -> None:
    async def main() -> None:
        r = await rig(tmp_path)
        try:
            first = r.subscribe("c0")
            await asyncio.wait_for(r.held.wait(), 5)  # the first is writing the subscription's record
            second = r.subscribe("c1")
            await asyncio.sleep(0.05)
            assert not second.done(), "the second waits for the first's write"
            r.go.set()
            ids = await asyncio.wait_for(asyncio.gather(first, second), 5)
            assert r.writes == 1
            sub = r.topic.subscriptions["s"]
            consumers = [r.clients.find_consumer(i) for i in ids]
            assert all(c is not None and c.subscription is sub for c in consumers)
            assert [c.name for c in sub.consumers] == ["c0", "c1"]
            # One dispatcher: the records go to the active consumer alone, and its acks settle them.
            c0 = consumers[0]
            assert c0 is not None
            token = c0.attach()
            got = await asyncio.wait_for(c0.take(token), 5)
            assert [m.msg_id.topic_offset for m in got] == [0, 1, 2, 3, 4]
            assert consumers[1] is not None and consumers[1].queued == 0
            for m in got:
                assert sub.dispatcher.ack(m.msg_id.topic_offset)
            assert sub.dispatcher.unacked == 0
        finally:
            await r.close()

    run(main(), timeout=30)


def test_when_the_first_write_fails_the_waiting_subscribe_makes_the_subscription(tmp_path: Path,
                                                                                run: Run) -> None:
    async def main() -> None:
        r = await rig(tmp_path)
        try:
            r.fail = True
            first = r.subscribe("c0")
            await asyncio.wait_for(r.held.wait(), 5)
            second = r.subscribe("c1")
            await asyncio.sleep(0.05)
            r.go.set()
            with pytest.raises(MetadataUnavailable):
                await asyncio.wait_for(first, 5)
            made = await asyncio.wait_for(second, 5)
            assert r.writes == 2
            sub = r.topic.subscriptions["s"]
            assert [c.id for c in sub.consumers] == [made]
        finally:
            await r.close()

    run(main(), timeout=30)


def test_an_operators_create_during_a_subscribes_write_is_refused(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        r = await rig(tmp_path)
        try:
            first = r.subscribe("c0")
            await asyncio.wait_for(r.held.wait(), 5)
            with pytest.raises(ApiError) as refused:
                await r.subs.create(r.topic, "s", FAILOVER, 0)
            assert refused.value.grpc_code == "ALREADY_EXISTS"
            r.go.set()
            await asyncio.wait_for(first, 5)
            assert r.writes == 1
        finally:
            await r.close()

    run(main(), timeout=30)

"""Subscriptions.move (an operator's seek, skip or message expiry) against what else replaces or closes a
subscription's dispatcher: each waits for the other, so a subscription deleted during a move is left with
no dispatcher running, and a move after the delete is refused."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from danube_fast.broker.clients import Clients
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.dispatch.budget import ByteBudget
from danube_fast.broker.dispatch.reliable import ReliableDispatcher
from danube_fast.broker.ownership import Unfenced
from danube_fast.broker.subscriptions import Subscriptions
from danube_fast.broker.topic import ReliableTopic, Topic
from danube_fast.errors import ApiError
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.resources import Policy, SubscriptionType
from danube_fast.meta.store import MetadataStore, Op, TxnResult
from danube_fast.names import TopicName
from danube_fast.storage import SyncPolicy, Wal, WalConfig
from tests.broker.broker_support import message

Run = Callable[..., Any]


class HeldWrites(Unfenced):
    """The topic's fenced writes (its cursors) wait until `go` is set."""

    def __init__(self, store: MetadataStore) -> None:
        super().__init__(store)
        self.go = asyncio.Event()
        self.waiting = asyncio.Event()

    async def write(self, ops: Sequence[Op]) -> TxnResult:
        self.waiting.set()
        await self.go.wait()
        return await super().write(ops)


def test_a_delete_during_a_move_waits_and_leaves_nothing_running(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        store = await EmbeddedStore.open(tmp_path / "meta.db")
        wal = await Wal.open(tmp_path / "wal", WalConfig(sync=SyncPolicy("none")))
        fence = HeldWrites(store)
        topic = ReliableTopic(TopicName("default", "moves"), Policy(), fence, wal)
        for i in range(5):
            await topic.publish(message(i))

        async def no_dead_letters(name: TopicName, delivery: Any) -> Topic:
            raise AssertionError("no dead letters here")

        subs = Subscriptions(BrokerConfig(), store, Clients(), ByteBudget(1 << 20), no_dead_letters,
                             lambda: [])
        sub = subs.attach(topic, "s", SubscriptionType.SHARED, 0)
        first = sub.dispatcher
        moving = asyncio.create_task(subs.move(topic, sub, 3))
        await asyncio.wait_for(fence.waiting.wait(), 5)  # the move holds the subscription, writing
        deleting = asyncio.create_task(subs.delete(topic, sub))
        await asyncio.sleep(0.1)
        assert not deleting.done(), "the delete waits for the move"
        fence.go.set()
        await asyncio.wait_for(asyncio.gather(moving, deleting), 5)
        replaced = sub.dispatcher
        assert replaced is not first and isinstance(replaced, ReliableDispatcher)
        assert replaced._closed and sub.closed  # the move's dispatcher was the one the delete closed
        with pytest.raises(ApiError) as refused:
            await subs.move(topic, sub, 0)
        assert refused.value.grpc_code == "NOT_FOUND"
        await wal.close()
        await store.close()

    run(main(), timeout=20)

"""A Subscribe or CreateProducer whose store write was under way while its topic was deleted: it fails
with a retriable error instead of adding a subscription (with a dispatcher nothing would close) or a
producer to the deleted topic, and leaves no key of it behind."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from broker_support import Run, in_process_broker

from danube_fast.errors import ApiError
from danube_fast.meta import keys
from danube_fast.meta.resources import DeliveryMode
from danube_fast.meta.store import Op, Put, TxnResult
from danube_fast.names import TopicName
from danube_fast.proto import DanubeApi_pb2 as pb


def test_a_subscribe_and_a_producer_finishing_after_their_topic_was_deleted_are_refused(tmp_path: Path,
                                                                                         run: Run) -> None:
    async def main() -> None:
        async with in_process_broker(tmp_path / "data") as broker:
            ctx, store = broker.ctx, broker.store
            topic = await ctx.topics.topic_for_producer(TopicName("default", "doomed"), DeliveryMode.RELIABLE)
            waiting: list[str] = []  # the held writes' keys
            both = asyncio.Event()
            go = asyncio.Event()

            async def hold(key: str) -> None:
                waiting.append(key)
                if len(waiting) == 2:
                    both.set()
                await go.wait()
            transaction, put = store.transaction, store.put

            def ours(key: str) -> bool:  # the subscription's or the producer's record
                return key in (keys.topic_subscription("default", "doomed", "s"),) or \
                    key.startswith(keys.topic_producers_prefix("default", "doomed"))

            async def held_transaction(compare: Sequence[Any], success: Sequence[Op],
                                       failure: Sequence[Op] = ()) -> TxnResult:
                held = [op.key for op in success if isinstance(op, Put) and ours(op.key)]
                if held:
                    await hold(held[0])
                return await transaction(compare, success, failure)

            async def held_put(key: str, value: bytes) -> Any:
                if ours(key):
                    await hold(key)
                return await put(key, value)

            store.transaction = held_transaction  # type: ignore[method-assign]
            store.put = held_put  # type: ignore[method-assign]
            subscribing = asyncio.create_task(ctx.subscriptions.subscribe(topic, pb.ConsumerRequest(
                topic_name=topic.full, consumer_name="c", subscription="s", subscription_type=0)))
            producing = asyncio.create_task(ctx.topics.add_producer(topic, "p", 0))
            await asyncio.wait_for(both.wait(), 5)  # both are at their writes
            await ctx.topics.delete_topic(topic)
            go.set()
            for task in (subscribing, producing):
                with pytest.raises(ApiError) as refused:
                    await asyncio.wait_for(task, 5)
                assert refused.value.grpc_code == "UNAVAILABLE" and "was deleted" in str(refused.value)
            assert topic.subscriptions == {} and topic.producers == {}
            assert await store.get_prefix(keys.topic_prefix("default", "doomed")) == []

    run(main(), timeout=20)

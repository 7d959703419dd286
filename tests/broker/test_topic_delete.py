"""A topic deleted while something else takes it apart: the delete is the only one that does.

- A DeleteTopic for a topic being unloaded (a move's seal, a lost ownership) is refused as UNAVAILABLE
  instead of closing its storage a second time under the unload.
- Two DeleteTopics at once: one deletes, the other is told the topic is being deleted (NOT_FOUND).
- `TopicRegistry.settled` waits for a delete under way, so the cluster's reconciler, which hears of the
  deleted assignment while the delete still runs, does not unload the topic under it (its test:
  tests/cluster/test_reconcile_during_delete.py)."""

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
from danube_fast.meta.store import Delete, Op, TxnResult
from danube_fast.names import TopicName


def test_a_delete_under_way_is_the_only_one_and_settled_waits_for_it(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with in_process_broker(tmp_path / "data") as broker:
            ctx, store = broker.ctx, broker.store
            name = TopicName("default", "doomed")
            topic = await ctx.topics.topic_for_producer(name, DeliveryMode.RELIABLE)
            at_write, go = asyncio.Event(), asyncio.Event()
            transaction = store.transaction

            async def held(compare: Sequence[Any], success: Sequence[Op], failure: Sequence[Op] = ()
                           ) -> TxnResult:
                if any(isinstance(op, Delete) and op.key == keys.namespace_topic("default", "doomed")
                       for op in success):
                    at_write.set()
                    await go.wait()
                return await transaction(compare, success, failure)

            store.transaction = held  # type: ignore[method-assign]
            deleting = asyncio.create_task(ctx.topics.delete_topic(topic))
            await asyncio.wait_for(at_write.wait(), 5)
            with pytest.raises(ApiError) as second:
                await ctx.topics.delete_topic(topic)
            assert second.value.grpc_code == "NOT_FOUND" and "being deleted" in str(second.value)
            settled = asyncio.create_task(ctx.topics.settled(name))
            await asyncio.sleep(0)
            assert not settled.done()  # the delete still runs
            go.set()
            await asyncio.wait_for(deleting, 5)
            await asyncio.wait_for(settled, 5)
            assert ctx.topics.find(name.full) is None
            assert not Path(broker.config.wal_root, "default", "doomed").exists()
            await asyncio.wait_for(ctx.topics.settled(name), 1)  # nothing under way: at once

    run(main(), timeout=20)


def test_a_delete_of_a_topic_being_unloaded_is_refused_and_closes_nothing(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with in_process_broker(tmp_path / "data") as broker:
            ctx = broker.ctx
            name = TopicName("default", "moving")
            topic = await ctx.topics.topic_for_producer(name, DeliveryMode.RELIABLE)
            sealing, go = asyncio.Event(), asyncio.Event()

            async def seal(t: object) -> bool:
                sealing.set()
                await go.wait()
                return False

            unloading = asyncio.create_task(ctx.topics.unload_topic(topic, seal))
            await asyncio.wait_for(sealing.wait(), 5)
            with pytest.raises(ApiError) as refused:
                await ctx.topics.delete_topic(topic)
            assert refused.value.grpc_code == "UNAVAILABLE" and "unloaded" in str(refused.value)
            assert await broker.store.get(keys.namespace_topic("default", "moving")) is not None
            go.set()
            await asyncio.wait_for(unloading, 5)
            assert topic.gone == "unloaded"

    run(main(), timeout=20)

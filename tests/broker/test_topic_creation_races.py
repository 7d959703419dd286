"""Topic creations that race one another, or their namespace's delete: the checks a creation makes in memory
hold against the store too (its transaction compares them), so
- two CreateTopics of one name at once: one creates it, the other is ALREADY_EXISTS;
- a topic and a partition of the same base name at once: one is created, the other is ALREADY_EXISTS;
- a topic created while its namespace is deleted is refused (the namespace is gone), not left behind in a
  namespace that no longer exists."""

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


class HeldCreations:
    """The store's transactions that create a topic (they put its root) wait until `go`."""

    def __init__(self, store: Any, ns: str, expected: int) -> None:
        self.arrived: list[str] = []
        self.all_here = asyncio.Event()
        self.go = asyncio.Event()
        self._expected = expected
        self._transaction = store.transaction
        listed = keys.namespace_topics_prefix(ns)  # a creation lists the topic in its namespace

        async def held(compare: Sequence[Any], success: Sequence[Op], failure: Sequence[Op] = ()
                       ) -> TxnResult:
            created = [op.key for op in success if isinstance(op, Put) and op.key.startswith(listed)]
            if created:
                self.arrived.append(created[0])
                if len(self.arrived) == self._expected:
                    self.all_here.set()
                await self.go.wait()
            return await self._transaction(compare, success, failure)

        store.transaction = held


async def outcomes(*tasks: asyncio.Task[Any]) -> list[ApiError | None]:
    got: list[ApiError | None] = []
    for task in tasks:
        try:
            await asyncio.wait_for(task, 5)
            got.append(None)
        except ApiError as e:
            got.append(e)
    return got


def test_two_creates_of_one_name_at_once_make_one_topic(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with in_process_broker(tmp_path / "data") as broker:
            topics = broker.ctx.topics
            held = HeldCreations(broker.store, "default", 1)
            name = TopicName("default", "once")
            first = asyncio.create_task(topics.create_topic(name, DeliveryMode.RELIABLE))
            await asyncio.wait_for(held.all_here.wait(), 5)
            second = asyncio.create_task(topics.create_topic(name, DeliveryMode.RELIABLE))
            for _ in range(10):  # no I/O before it waits for the first: a few turns of the loop get it there
                await asyncio.sleep(0)
            assert not second.done()
            held.go.set()
            a, b = await outcomes(first, second)
            assert a is None
            assert b is not None and b.grpc_code == "ALREADY_EXISTS" and "already exists" in str(b)
            assert topics.find(name.full) is not None

    run(main(), timeout=20)


@pytest.mark.parametrize("order", ["topic first", "partition first"])
def test_a_topic_and_a_partition_of_its_name_at_once_make_one(tmp_path: Path, run: Run, order: str) -> None:
    async def main() -> None:
        async with in_process_broker(tmp_path / "data") as broker:
            topics = broker.ctx.topics
            held = HeldCreations(broker.store, "default", 2)
            plain, part = TopicName("default", "both"), TopicName("default", "both-part-0")
            names = [plain, part] if order == "topic first" else [part, plain]
            tasks = [asyncio.create_task(topics.create_topic(n, DeliveryMode.RELIABLE)) for n in names]
            await asyncio.wait_for(held.all_here.wait(), 5)  # both passed their checks in memory
            held.go.set()
            results = await outcomes(*tasks)
            assert results[0] is None  # the first transaction to run wins
            refused = results[1]
            assert refused is not None and refused.grpc_code == "ALREADY_EXISTS"
            assert (topics.find(names[0].full), topics.find(names[1].full)) != (None, None)
            assert topics.find(names[1].full) is None
            assert await broker.store.get(keys.topic_root("default", names[1].topic)) is None

    run(main(), timeout=20)


def test_a_topic_created_while_its_namespace_is_deleted_is_refused(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with in_process_broker(tmp_path / "data") as broker:
            ctx = broker.ctx
            await ctx.namespaces.create("brief")
            held = HeldCreations(broker.store, "brief", 1)
            name = TopicName("brief", "late")
            creating = asyncio.create_task(ctx.topics.create_topic(name, DeliveryMode.RELIABLE))
            await asyncio.wait_for(held.all_here.wait(), 5)
            await ctx.namespaces.delete("brief")  # it has no topic yet: deleted
            held.go.set()
            [refused] = await outcomes(creating)
            assert refused is not None and refused.grpc_code == "UNAVAILABLE"
            assert "namespace brief" in str(refused)
            assert await broker.store.get(keys.topic_root("brief", "late")) is None
            assert ctx.topics.find(name.full) is None

    run(main(), timeout=20)

"""CreateProducer for a name the topic does not have yet, twice at once (a client retrying, or two
connections of one application): one producer, one id, one stored record (docs/WIRE.md C.5)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker_support import Run, in_process_broker

from danube_fast.meta import keys
from danube_fast.meta.resources import DeliveryMode
from danube_fast.names import TopicName


def test_two_registrations_of_one_name_at_once_make_one_producer(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with in_process_broker(tmp_path / "data") as broker:
            ctx = broker.ctx
            topic = await ctx.topics.topic_for_producer(TopicName("default", "twice"), DeliveryMode.RELIABLE)
            ids = await asyncio.gather(*(ctx.topics.add_producer(topic, "p", 0) for _ in range(3)))
            assert len(set(ids)) == 1, f"one producer for one name, not {ids}"
            assert list(topic.producers) == ["p"] and ctx.clients.has_producer(ids[0])
            stored = await broker.store.get_prefix(keys.topic_producers_prefix("default", "twice"))
            assert len(stored) == 1
            assert await ctx.topics.add_producer(topic, "p", 0) == ids[0]  # and later calls get it too

    run(main(), timeout=20)

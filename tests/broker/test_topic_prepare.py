"""A topic being loaded (cluster mode: moved here) is found only once what must hold before it serves
anyone (its schema configuration) is in place; if that fails, its WAL is closed again, so the next load can
open it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from broker_support import Run, in_process_broker

from danube_fast.broker.topic import Topic
from danube_fast.meta.resources import DeliveryMode
from danube_fast.names import TopicName


def test_a_loading_topic_is_found_only_after_it_is_prepared(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with in_process_broker(tmp_path / "data") as broker:
            topics = broker.ctx.topics
            name = TopicName("default", "prepared")
            await topics.unload_topic(await topics.topic_for_producer(name, DeliveryMode.RELIABLE), None)
            go, preparing = asyncio.Event(), asyncio.Event()
            seen: list[Topic | None] = []

            async def prepare(topic: Topic) -> None:
                seen.append(topics.find(name.full))
                preparing.set()
                await go.wait()

            loading = asyncio.create_task(topics.load_topic(name, prepare=prepare))
            await asyncio.wait_for(preparing.wait(), 5)
            assert seen == [None] and topics.find(name.full) is None  # not served while it is prepared
            go.set()
            loaded = await asyncio.wait_for(loading, 5)
            assert loaded is not None and topics.find(name.full) is loaded
            await topics.unload_topic(loaded, None)

            async def failing(topic: Topic) -> None:
                raise RuntimeError("the schema configuration could not be read")

            with pytest.raises(RuntimeError):
                await topics.load_topic(name, prepare=failing)
            assert topics.find(name.full) is None
            again = await topics.load_topic(name)  # its WAL was closed: it opens again
            assert again is not None and topics.find(name.full) is again

    run(main(), timeout=20)

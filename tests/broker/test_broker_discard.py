"""A topic whose load fails after clients attached to it (cluster mode: an ownership race while a move is
under way) is discarded like an unload: its consumers are told to look it up again, not left waiting."""

from __future__ import annotations

from pathlib import Path

from broker_support import Run, in_process_broker

from danube_fast.meta.resources import DeliveryMode
from danube_fast.names import TopicName
from danube_fast.proto import DanubeApi_pb2 as pb


def test_a_discarded_topic_ends_its_consumers_streams(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with in_process_broker(tmp_path / "data") as broker:
            ctx = broker.ctx
            name = TopicName("default", "t")
            topic = await ctx.topics.topic_for_producer(name, DeliveryMode.RELIABLE)
            consumer_id = await ctx.subscriptions.subscribe(topic, pb.ConsumerRequest(
                topic_name=topic.full, consumer_name="c", subscription="s", subscription_type=0))
            consumer = ctx.clients.find_consumer(consumer_id)
            assert consumer is not None and not consumer.removed

            await ctx.topics.mark_broken(name, RuntimeError("the WAL could not be opened"))

            assert consumer.removed  # its stream ends
            assert ctx.clients.find_consumer(consumer_id) is None
            assert ctx.clients.gone(consumer_id) is not None  # a health check answers CLOSE
            assert ctx.topics.find(topic.full) is None and ctx.topics.broken() == [topic.full]

    run(main(), timeout=20)

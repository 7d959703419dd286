"""A seek across a topic move (docs/SUBSCRIPTIONS.md, "How a move works"): the position a seek wrote is the
stored cursor, so the next owner of the topic starts the subscription there, on a real 2-broker cluster
(etcd); asked of the broker that does not own the topic, the seek is forwarded to the one that does."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
import uvloop
from danube import DanubeClientBuilder, DispatchStrategy, SubType

from danube_fast.meta.etcd import EtcdStore
from danube_fast.proto import SubscriptionAdmin_pb2 as pb
from danube_fast.proto import SubscriptionAdmin_pb2_grpc as pb_grpc
from danube_fast.testing.cluster import Cluster, owner, unload, wait_for
from danube_fast.testing.etcd import EtcdServer

pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster]

TOPIC = "/default/seek_moving"


def test_a_seek_back_by_time_holds_across_a_move(cluster: Cluster, etcd: EtcdServer) -> None:
    cluster.extra_config = "[dispatch]\ncursor_flush_ms = 200\n"
    brokers = cluster.start(2)

    async def body() -> None:
        store = await EtcdStore.connect([etcd.endpoint])
        client: Any = await DanubeClientBuilder().service_url(brokers[0].url).build()
        try:
            producer = client.new_producer().with_topic(TOPIC).with_name("p") \
                .with_dispatch_strategy(DispatchStrategy.RELIABLE).build()
            await producer.create()

            async def subscribe(name: str) -> tuple[Any, asyncio.Queue[Any]]:
                consumer = client.new_consumer().with_topic(TOPIC).with_consumer_name(name) \
                    .with_subscription("s").with_subscription_type(SubType.EXCLUSIVE).build()
                await consumer.subscribe()
                return consumer, await consumer.receive()

            async def take(consumer: Any, queue: asyncio.Queue[Any], count: int) -> list[Any]:
                got = [await asyncio.wait_for(queue.get(), 30) for _ in range(count)]
                for m in got:
                    await consumer.ack(m)
                return got

            first, queue = await subscribe("c1")
            for i in range(20):
                await producer.send(b"r-%d" % i, {})
                if i == 9:
                    await asyncio.sleep(0.05)  # offset 10 is the first published after a clear gap
            got = await take(first, queue, 20)
            assert [m.msg_id.topic_offset for m in got] == list(range(20))
            await first.close()

            source = await wait_for(lambda: owner(store, TOPIC), "an owner")
            other = next(b for b in brokers if b.broker_id != source)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{other.admin_port}") as channel:
                stub: Any = pb_grpc.SubscriptionAdminStub(channel)  # type: ignore[no-untyped-call]
                moved = await stub.Seek(pb.SeekRequest(topic=TOPIC, subscription="s",
                                                       time_ms=got[10].publish_time), timeout=30)
            assert [(p.from_offset, p.to_offset, p.moved) for p in moved.positions] == [(20, 10, True)]

            assert await unload(store, TOPIC) == source
            new = await wait_for(lambda: owner(store, TOPIC), "an owner after the move", 30.0)
            assert new != source
            second, queue = await subscribe("c2")
            again = await take(second, queue, 10)
            assert [m.msg_id.topic_offset for m in again] == list(range(10, 20))
            assert [bytes(m.payload) for m in again] == [b"r-%d" % i for i in range(10, 20)]
            await asyncio.sleep(1.0)
            assert queue.empty(), "a record before the seek's position came again after the move"
        finally:
            await store.close()

    try:
        uvloop.run(asyncio.wait_for(body(), 200))
    except BaseException:
        print(cluster.logs())
        raise

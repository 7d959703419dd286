"""Delayed delivery across a topic move (docs/SUBSCRIPTIONS.md, "Delayed delivery"): the records a Shared
subscription has read and that wait for their time go with the subscription's saved state to the next owner,
which delivers them on time and once; what was acknowledged before the move is not delivered again."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import uvloop
from danube import DanubeClientBuilder, DispatchStrategy, SubType

from danube_fast import deliver_at
from danube_fast.meta.etcd import EtcdStore
from danube_fast.testing.cluster import Cluster, owner, unload, wait_for
from danube_fast.testing.etcd import EtcdServer

pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster]

TOPIC = "/default/delayed_moving"


def test_waiting_records_move_with_the_topic_and_come_on_time_once(cluster: Cluster,
                                                                   etcd: EtcdServer) -> None:
    cluster.extra_config = "[dispatch]\ncursor_flush_ms = 200\n"
    brokers = cluster.start(2)

    async def body() -> None:
        store = await EtcdStore.connect([etcd.endpoint])
        client: Any = await DanubeClientBuilder().service_url(brokers[0].url).build()
        try:
            producer = client.new_producer().with_topic(TOPIC).with_name("p") \
                .with_dispatch_strategy(DispatchStrategy.RELIABLE).build()
            await producer.create()
            consumer = client.new_consumer().with_topic(TOPIC).with_consumer_name("c") \
                .with_subscription("s").with_subscription_type(SubType.SHARED).build()
            await consumer.subscribe()
            queue = await consumer.receive()
            await asyncio.sleep(0.3)
            at = int(time.time() * 1000) + 12_000
            for i in range(30):
                await producer.send(b"m%d" % i, deliver_at.attributes(at) if i % 3 else {})
            got: dict[int, list[int]] = {}  # offset -> when each delivery came (ms)

            async def take(count: int, timeout: float) -> None:
                deadline = time.monotonic() + timeout
                while sum(len(v) for v in got.values()) < count:
                    assert time.monotonic() < deadline, f"{sorted(got)} of {count} within {timeout} s"
                    try:
                        m = await asyncio.wait_for(queue.get(), 1.0)
                    except TimeoutError:
                        continue
                    got.setdefault(m.msg_id.topic_offset, []).append(int(time.time() * 1000))
                    await consumer.ack(m)

            await take(10, 20)
            assert sorted(got) == list(range(0, 30, 3))
            await asyncio.sleep(1.0)  # the floor and the delayed state saved (cursor_flush_ms 200)
            source = await unload(store, TOPIC)
            new = await wait_for(lambda: owner(store, TOPIC), "an owner after the move", 30.0)
            assert new != source
            await take(30, 60)
            await asyncio.sleep(2.0)
            while not queue.empty():
                m = queue.get_nowait()
                got.setdefault(m.msg_id.topic_offset, []).append(int(time.time() * 1000))
            assert sorted(got) == list(range(30))
            assert all(len(v) == 1 for v in got.values()), {o: v for o, v in got.items() if len(v) > 1}
            assert all(got[o][0] >= at for o in range(30) if o % 3), "a delayed record came early"
        finally:
            await store.close()

    try:
        uvloop.run(asyncio.wait_for(body(), 200))
    except BaseException:
        print(cluster.logs())
        raise

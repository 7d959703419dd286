"""Our own client across topic moves: a FastProducer and a FastConsumer stay on their topic while it moves
between three brokers, each following it through lookup (the consumer from the subscription's cursor)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop
from test_cluster_moves import meta, unload

from danube_fast import frames
from danube_fast.client import FastConsumer, FastProducer
from danube_fast.testing.cluster import Cluster, owner, wait_for
from danube_fast.testing.etcd import EtcdServer

pytestmark = [pytest.mark.timeout(180), pytest.mark.cluster]

MOVES = 5


def test_fast_consumer_and_producer_follow_moves_and_lose_nothing(cluster: Cluster, etcd: EtcdServer) -> None:
    brokers = cluster.start(3)
    topic = "/default/fast_moving"

    async def body() -> None:
        async with meta(etcd) as store:
            producer = await FastProducer.connect(brokers[0].target, topic, "p", linger_ms=5)
            consumer = await FastConsumer.connect(brokers[1].target, topic, "s", "c")  # not the owner, maybe
            acked: dict[int, bytes] = {}  # offset -> payload, as acknowledged to the producer
            read: dict[int, bytes] = {}  # offset -> payload, as delivered (some twice after a move)
            stop = asyncio.Event()

            async def produce() -> None:
                n = 0
                while not stop.is_set():
                    payloads = [b"r-%07d" % (n + i) for i in range(20)]
                    first, last = await (await producer.send_batch(payloads))
                    assert last - first + 1 == len(payloads)
                    acked.update(zip(range(first, last + 1), payloads, strict=True))
                    n += len(payloads)
                    await asyncio.sleep(0.01)

            async def consume() -> None:
                async for d in consumer.batches():
                    for r in frames.decode_records(d.data):
                        if r.offset >= consumer.start_offset:
                            assert read.setdefault(r.offset, r.payload) == r.payload, \
                                f"offset {r.offset} delivered with two payloads"
                    await consumer.ack_cumulative(d.last_offset)

            tasks = [asyncio.create_task(produce()), asyncio.create_task(consume())]
            owners = [await wait_for(lambda: owner(store, topic), "the first owner")]
            for move in range(MOVES):
                await asyncio.sleep(1.0)
                source = await unload(store, topic)
                assert source == owners[-1]
                new = await wait_for(lambda: owner(store, topic), f"an owner after move {move}", 20.0)
                owners.append(new)
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.wait_for(tasks[0], 30)
            await producer.flush()
            await wait_for(lambda: set(acked) <= set(read), "every acknowledged record read", 30.0)
            assert not tasks[1].done(), "the consumer's stream ended instead of following the topic"
            tasks[1].cancel()
            await asyncio.gather(tasks[1], return_exceptions=True)
            await consumer.close()
            await producer.close()
            assert len(acked) > 500, f"only {len(acked)} records were acknowledged"
            assert sorted(read) == list(range(len(read))), "offsets are not contiguous from 0"
            assert all(read[o] == p for o, p in acked.items()), "a record was read with another payload"
            assert consumer.reconnects >= MOVES, (consumer.reconnects, owners)

    try:
        uvloop.run(asyncio.wait_for(body(), 150))
    except BaseException:
        print(cluster.logs())
        raise

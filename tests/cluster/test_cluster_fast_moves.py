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


def test_a_retry_across_a_move_is_answered_from_the_first_copy(cluster: Cluster, etcd: EtcdServer) -> None:
    """Sequenced batches (broker/sequences.py) acknowledged by one owner, the topic moved, the last one sent
    again to the new owner (its ack lost in the move): answered with the first copy's offsets, stored once.
    The old owner sealed its table of sequences into the sealed state; the new owner restored it."""
    from danube_fast.client.reader import TopicReader
    from danube_fast.testing.raw_producer import RawProducer

    brokers = cluster.start(2)
    topic = "/default/idempotent_move"

    def payloads(sequence: int) -> list[bytes]:
        return [b"s%d-%d" % (sequence, i) for i in range(3)]

    async def body() -> None:
        async with meta(etcd) as store:
            creator = await FastProducer.connect(brokers[0].target, topic, "creator")  # places the topic
            await creator.close()
            p = await RawProducer.open(brokers[0].target, topic, "p")
            acks = [await p.offsets(s, p.batch(payloads(s), s)) for s in (1, 2, 3)]
            await p.close()
            source = await unload(store, topic)
            await wait_for(lambda: _moved(store, topic, source), "a new owner", 20.0)
            p = await RawProducer.open(brokers[0].target, topic, "p")
            assert await p.offsets(1, p.batch(payloads(3), 3)) == acks[2]
            fourth = await p.offsets(2, p.batch(payloads(4), 4))
            assert fourth[0] > acks[2][1]
            await p.close()
            async with TopicReader(brokers[0].target) as reader:
                stored = [r.payload async for data, _, _ in reader.read(topic, 0, 0)
                          for r in frames.decode_records(data)]
            assert stored == [x for s in (1, 2, 3, 4) for x in payloads(s)]

    try:
        uvloop.run(asyncio.wait_for(body(), 120))
    except BaseException:
        print(cluster.logs())
        raise


async def _moved(store: object, topic: str, source: int) -> bool:
    now = await owner(store, topic)  # type: ignore[arg-type]
    return now is not None and now != source

"""Our own client across topic moves: a FastProducer and a FastConsumer stay on their topic while it moves
between three brokers, each following it through lookup (the consumer from the subscription's cursor)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import uvloop
from test_cluster_moves import meta

from danube_fast.client import FastConsumer, FastProducer
from danube_fast.client.native import NativeConnection
from danube_fast.client.reader import TopicReader
from danube_fast.client.status import ProduceRejected
from danube_fast.codec import frames
from danube_fast.meta import keys
from danube_fast.testing.cluster import Cluster, owner, unload, wait_for
from danube_fast.testing.etcd import EtcdServer
from danube_fast.testing.raw_producer import RawProducer

pytestmark = [pytest.mark.timeout(180), pytest.mark.cluster]

MOVES = 5


@pytest.mark.parametrize("transport", ["grpc", "native"])
def test_fast_consumer_and_producer_follow_moves_and_lose_nothing(cluster: Cluster, etcd: EtcdServer,
                                                                   transport: str) -> None:
    """Over the gRPC fast API and over the native transport (each broker advertises its own listener; a
    client follows the topic to the next owner's)."""
    cluster.native = transport == "native"
    brokers = cluster.start(3)
    topic = "/default/fast_moving"

    async def body() -> None:
        async with meta(etcd) as store:
            producer = await FastProducer.connect(brokers[0].target, topic, "p", linger_ms=5,
                                                  transport=transport)
            # not the owner, maybe
            consumer = await FastConsumer.connect(brokers[1].target, topic, "s", "c", transport=transport)
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
            assert producer.over_native == consumer.over_native == (transport == "native")
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


def test_lookup_on_any_broker_names_the_owners_native_listener_and_follows_a_move(
        cluster: Cluster, etcd: EtcdServer) -> None:
    """LOOKUP (docs/TRANSPORT.md) asked of every broker's native listener names the owner's, as each broker
    registered it (`fast_addr`, docs/METADATA.md), and the next owner's after a move."""
    cluster.native = True
    brokers = cluster.start(3)
    topic = "/default/looked_up"
    by_id = {b.broker_id: b for b in brokers}

    async def body() -> None:
        async with meta(etcd) as store:
            producer = await FastProducer.connect(brokers[0].target, topic, "p", transport="native")
            await (await producer.send_batch([b"x"]))
            await producer.close()
            conns = [await NativeConnection.connect(b.fast_target) for b in brokers]
            try:
                for move in range(2):
                    served_by = by_id[await wait_for(lambda: owner(store, topic), "an owner")]
                    for conn in conns:
                        assert await conn.lookup(topic) == served_by.fast_target
                    kv = await store.get(keys.broker_register(served_by.broker_id))
                    assert kv is not None and json.loads(kv.value)["fast_addr"] == served_by.fast_target
                    if move == 0:
                        source = served_by.broker_id
                        await unload(store, topic)
                        await wait_for(lambda source=source: _moved(store, topic, source), "the move")
                with pytest.raises(ProduceRejected) as unknown:
                    await conns[0].lookup("/default/never_created")
                assert unknown.value.grpc_code == "NOT_FOUND"
            finally:
                for conn in conns:
                    await conn.aclose()

    uvloop.run(body())


async def _moved(store: Any, topic: str, source: int) -> bool | None:
    now = await owner(store, topic)
    return True if now is not None and now != source else None


def test_a_retry_across_a_move_is_answered_from_the_first_copy(cluster: Cluster, etcd: EtcdServer) -> None:
    """Sequenced batches (broker/sequences.py) acknowledged by one owner, the topic moved, the last one sent
    again to the new owner (its ack lost in the move): answered with the first copy's offsets, stored once.
    The old owner sealed its table of sequences into the sealed state; the new owner restored it."""
    brokers = cluster.start(2)
    topic = "/default/idempotent_move"

    async def body() -> None:
        async with meta(etcd) as store:
            acks = await _three_sequenced(brokers[0].target, topic)
            source = await unload(store, topic)
            await wait_for(lambda: _moved(store, topic, source), "a new owner", 20.0)
            p = await RawProducer.open(brokers[0].target, topic, "p")
            await _retry_third_then_fourth(p, brokers[0].target, topic, acks, acks[2][1] + 1)

    try:
        uvloop.run(asyncio.wait_for(body(), 120))
    except BaseException:
        print(cluster.logs())
        raise


def test_a_retry_after_the_owner_crashed_waits_for_its_wal_and_gets_the_first_copy(
        cluster: Cluster, etcd: EtcdServer) -> None:
    """The owner stored sequenced batches and was killed before they reached the object tier (uploads held
    back). The new owner holds its idempotent producer back until the killed broker, restarted, recovers them
    (broker/sequences.py, docs/TOPIC_MOVE.md); the retry of the last one then gets the first copy's offsets,
    and nothing is stored twice."""
    brokers = cluster.start(2, reserve_offsets=1000, upload_interval_ms=600_000, producer_gap_wait_ms=60_000)
    topic = "/default/idempotent_crash"

    async def body() -> None:
        async with meta(etcd) as store:
            acks = await _three_sequenced(brokers[0].target, topic)
            dead = await owner(store, topic)
            victim = cluster.by_id(dead)  # type: ignore[arg-type]
            survivor = next(b for b in brokers if b is not victim)
            victim.kill()
            await wait_for(lambda: _moved(store, topic, dead), "a new owner", 20.0)  # type: ignore[arg-type]
            opening = asyncio.ensure_future(RawProducer.open(survivor.target, topic, "p"))
            await asyncio.sleep(2.0)
            assert not opening.done(), "the new owner took the producer before the dead owner's WAL came back"
            victim.start()  # recovers its orphan WAL into the object tier
            p = await asyncio.wait_for(opening, 40)
            # 1000: past the dead owner's reservation
            await _retry_third_then_fourth(p, survivor.target, topic, acks, 1000)

    try:
        uvloop.run(asyncio.wait_for(body(), 150))
    except BaseException:
        print(cluster.logs())
        raise


def _payloads(sequence: int) -> list[bytes]:
    return [b"s%d-%d" % (sequence, i) for i in range(3)]


async def _three_sequenced(target: str, topic: str) -> list[tuple[int, int]]:
    """Create the topic, then store sequenced batches 1..3 of producer "p": their acknowledged offsets."""
    creator = await FastProducer.connect(target, topic, "creator")  # places the topic
    await creator.close()
    p = await RawProducer.open(target, topic, "p")
    acks = [await p.offsets(s, p.batch(_payloads(s), s)) for s in (1, 2, 3)]
    await p.close()
    return acks


async def _retry_third_then_fourth(p: RawProducer, target: str, topic: str, acks: list[tuple[int, int]],
                                   fourth_at_least: int) -> None:
    """Batch 3 sent again gets its first offsets; batch 4 is stored at `fourth_at_least` or later; the topic
    holds batches 1..4, each once."""
    assert await p.offsets(1, p.batch(_payloads(3), 3)) == acks[2]
    fourth = await p.offsets(2, p.batch(_payloads(4), 4))
    assert fourth[0] >= fourth_at_least
    await p.close()
    async with TopicReader(target) as reader:
        stored = [r.payload async for data, _, _ in reader.read(topic, 0, 0)
                  for r in frames.decode_records(data)]
    assert stored == [x for s in (1, 2, 3, 4) for x in _payloads(s)]


async def _moved(store: object, topic: str, source: int) -> bool:
    now = await owner(store, topic)  # type: ignore[arg-type]
    return now is not None and now != source

"""Topic moves on a real cluster (docs/TOPIC_MOVE.md): three broker processes, one etcd, one object store, and
the official client producing and consuming while the topic is unloaded again and again.

Every test asserts on what the client was told: each acknowledged message is read, at one offset only, and
the offsets of the topic are contiguous across owners.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import uvloop
from danube import DanubeClientBuilder, DispatchStrategy, SubType

from danube_fast.meta.etcd import EtcdStore
from danube_fast.meta.store import MetadataStore
from danube_fast.proto import DanubeAdmin_pb2 as admin_pb
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.testing.cluster import Cluster, owner, unload, wait_for
from danube_fast.testing.etcd import EtcdServer

pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster]


@contextlib.asynccontextmanager
async def meta(etcd: EtcdServer) -> AsyncIterator[MetadataStore]:
    s = await EtcdStore.connect([etcd.endpoint])
    try:
        yield s
    finally:
        await s.close()


class Traffic:
    """One official-client producer sending m0, m1, ... and one Exclusive consumer acknowledging all."""

    def __init__(self, url: str, topic: str) -> None:
        self.url, self.topic = url, topic
        self.acked: list[int] = []
        self.received: dict[int, set[int]] = {}  # message number -> offsets it was read at
        self.stop = asyncio.Event()
        self.client: Any = None
        self.consumer: Any = None

    async def start(self) -> None:
        self.client = await DanubeClientBuilder().service_url(self.url).build()
        self.producer = self.client.new_producer().with_topic(self.topic).with_name("p") \
            .with_dispatch_strategy(DispatchStrategy.RELIABLE).build()
        await self.producer.create()
        self.consumer = self.client.new_consumer().with_topic(self.topic).with_consumer_name("c") \
            .with_subscription("s").with_subscription_type(SubType.EXCLUSIVE).build()
        await self.consumer.subscribe()
        self.queue = await self.consumer.receive()

    async def produce(self) -> None:
        i = 0
        while not self.stop.is_set():
            await self.producer.send(f"m{i}".encode())
            self.acked.append(i)
            i += 1
            await asyncio.sleep(0.005)

    async def consume(self) -> None:
        while True:
            msg = await self.queue.get()
            n = int(msg.payload.decode()[1:])
            self.received.setdefault(n, set()).add(msg.msg_id.topic_offset)
            await self.consumer.ack(msg)  # an ack that reaches the old owner is dropped, not refused

    def check(self) -> None:
        missing = [i for i in self.acked if i not in self.received]
        assert not missing, f"{len(missing)} acknowledged messages never read, first {missing[:10]}"
        twice = {n: o for n, o in self.received.items() if len(o) > 1}
        assert not twice, f"messages read at two offsets: {dict(list(twice.items())[:5])}"
        offsets = sorted(next(iter(o)) for o in self.received.values())
        assert len(set(offsets)) == len(offsets), "two messages share an offset"
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), (
            f"offsets are not contiguous: {offsets[:5]}...{offsets[-5:]} ({len(offsets)} messages)")
        assert offsets[0] == 0


@pytest.mark.parametrize("objects", ["folder", pytest.param("s3", marks=pytest.mark.s3)])
def test_ten_moves_under_traffic_lose_nothing_and_keep_offsets_contiguous(
        cluster: Cluster, etcd: EtcdServer, objects: str, request: pytest.FixtureRequest) -> None:
    """Consumers resume on each new owner from their cursor, through the object tier (a shared folder, or
    S3 on moto's server) for what the old owner uploaded while sealing."""
    if objects == "s3":
        moto = request.getfixturevalue("moto_server")
        cluster.object_store = f"s3://{moto.create_bucket()}/moves"
        brokers = cluster.start(3, s3_endpoint=moto.endpoint, s3_access_key="testing",
                                s3_secret_key="testing")
    else:
        brokers = cluster.start(3)

    async def body() -> None:
        async with meta(etcd) as store:
            traffic = Traffic(brokers[0].url, "/default/moving")
            await traffic.start()
            tasks = [asyncio.create_task(traffic.produce()), asyncio.create_task(traffic.consume())]
            owners = [await wait_for(lambda: owner(store, traffic.topic), "the first owner")]
            for move in range(10):
                # moves 5 and 6 back to back; otherwise time for the official client to follow (it backs
                # off 1.5-3 s before it looks the topic up again, docs/WIRE.md B.2)
                await asyncio.sleep(0.0 if move == 5 else 2.0)
                source = await unload(store, traffic.topic)
                assert source == owners[-1]
                new = await wait_for(lambda: owner(store, traffic.topic), f"an owner after move {move}", 20.0)
                assert new != source
                owners.append(new)
            await asyncio.sleep(1.0)
            traffic.stop.set()
            await asyncio.wait_for(tasks[0], 30)
            await wait_for(lambda: all(i in traffic.received for i in traffic.acked),
                           "every acknowledged message read", 60.0)
            tasks[1].cancel()
            assert len(traffic.acked) > 100, f"only {len(traffic.acked)} messages were acknowledged"
            assert len(set(owners)) < len(owners), f"no move went back to an earlier owner: {owners}"
            traffic.check()

    try:
        uvloop.run(asyncio.wait_for(body(), 200))
    except BaseException:
        print(cluster.logs())
        raise


async def subscribe_early(broker: Any, topic: str) -> None:
    """Create the Reliable topic through the admin API and the subscription "s" on it before anything is
    produced, so that "s" reads everything (a new subscription starts at the latest offset)."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}")
    try:
        stub: Any = admin_grpc.TopicAdminStub(channel)  # type: ignore[no-untyped-call]
        await stub.CreateTopic(admin_pb.NewTopicRequest(name=topic, dispatch_strategy=1), timeout=15)
    finally:
        await channel.close()
    client = await DanubeClientBuilder().service_url(broker.url).build()
    consumer = client.new_consumer().with_topic(topic).with_consumer_name("early") \
        .with_subscription("s").with_subscription_type(SubType.EXCLUSIVE).build()
    await consumer.subscribe()
    await consumer.receive()  # a stream that ends on close, so that "early" lets go of the subscription
    await asyncio.sleep(0.2)
    await consumer.close()


async def produce_n(url: str, topic: str, first: int, n: int, name: str) -> list[int]:
    """A fresh official client (bootstrapped at `url`) sends m{first}..; returns the numbers acknowledged."""
    client = await DanubeClientBuilder().service_url(url).build()
    producer = client.new_producer().with_topic(topic).with_name(name) \
        .with_dispatch_strategy(DispatchStrategy.RELIABLE).build()
    await producer.create()
    for i in range(first, first + n):
        await producer.send(f"m{i}".encode())
    return list(range(first, first + n))


async def read_all(url: str, topic: str, expect: set[int], timeout: float) -> dict[int, set[int]]:
    client = await DanubeClientBuilder().service_url(url).build()
    consumer = client.new_consumer().with_topic(topic).with_consumer_name("reader") \
        .with_subscription("s").with_subscription_type(SubType.EXCLUSIVE).build()
    await consumer.subscribe()
    queue = await consumer.receive()
    got: dict[int, set[int]] = {}
    try:
        async with asyncio.timeout(timeout):
            while not expect <= set(got):
                msg = await queue.get()
                got.setdefault(int(msg.payload.decode()[1:]), set()).add(msg.msg_id.topic_offset)
                await consumer.ack(msg)
    finally:
        await consumer.close()
    return got


def test_kill_9_owner_reassigned_and_its_acknowledged_data_recovered_on_restart(
        cluster: Cluster, etcd: EtcdServer) -> None:
    """The guarantee: a killed owner's acknowledged records stay in its WAL; the topic goes to another broker
    within the lease TTL (3 s here) plus assignment, which continues past the dead owner's offset reservation
    (no offset reused), and readers wait at that range until the killed broker, restarted, uploads it."""
    brokers = cluster.start(3, reserve_offsets=1000, upload_interval_ms=600_000)
    topic = "/default/crash"

    async def body() -> None:
        async with meta(etcd) as store:
            subscriber = await DanubeClientBuilder().service_url(brokers[0].url).build()
            consumer = subscriber.new_consumer().with_topic(topic).with_consumer_name("early") \
                .with_subscription("s").with_subscription_type(SubType.EXCLUSIVE).build()
            with pytest.raises(Exception):  # noqa: B017 - consumers never create topics
                await consumer.subscribe()
            acked = await produce_n(brokers[0].url, topic, 0, 100, "p1")
            consumer = subscriber.new_consumer().with_topic(topic).with_consumer_name("early") \
                .with_subscription("s").with_subscription_type(SubType.EXCLUSIVE).build()
            await consumer.subscribe()  # the subscription starts at 100: everything after it is expected
            await consumer.close()
            acked = await produce_n(brokers[0].url, topic, 100, 100, "p2")
            dead = await owner(store, topic)
            victim = cluster.by_id(dead)  # type: ignore[arg-type]
            victim.kill()
            killed_at = asyncio.get_running_loop().time()
            survivor = next(b for b in brokers if b is not victim)
            new = await wait_for(lambda: _moved_from(store, topic, dead), "reassignment", 15.0)
            took = asyncio.get_running_loop().time() - killed_at
            assert took < 3 + 4, f"reassigned after {took:.1f} s; the lease TTL is 3 s"
            assert new != dead
            acked += await produce_n(survivor.url, topic, 200, 100, "p3")
            # The first records after the subscription's start are in the dead broker's WAL: a reader waits.
            with pytest.raises(TimeoutError):
                await read_all(survivor.url, topic, set(acked), 2.0)
            victim.start()  # recovers its orphan WAL into the object tier
            got = await read_all(survivor.url, topic, set(acked), 30.0)
            twice = {n: o for n, o in got.items() if len(o) > 1}
            assert not twice, f"read at two offsets: {twice}"
            offsets = {n: next(iter(o)) for n, o in got.items()}
            assert sorted(offsets.values()) == [offsets[n] for n in sorted(offsets)], "offsets out of order"
            assert offsets[100] == 100 and offsets[199] == 199
            assert offsets[200] >= 1000, "the new owner reused offsets of the dead owner's reservation"

    try:
        uvloop.run(asyncio.wait_for(body(), 200))
    except BaseException:
        print(cluster.logs())
        raise


async def _moved_from(store: MetadataStore, topic: str, dead: int | None) -> int | None:
    current = await owner(store, topic)
    return current if current is not None and current != dead else None

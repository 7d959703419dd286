"""Faults on a real cluster: etcd stopped under traffic, a broker paused past its lease (SIGSTOP), S3 down,
and crashes at the two steps of a move. Brokers are processes, etcd and moto S3 are real servers; the one
injected fault is the crash at an exact step (danube_fast/broker/crashpoints.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import grpc
import pytest
import uvloop
from test_cluster_moves import meta, produce_n, read_all, subscribe_early

from danube_fast.broker import crashpoints
from danube_fast.broker.cluster.handoff import uploaded_through
from danube_fast.meta import keys
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.testing.cluster import Cluster, owner, unload, wait_for
from danube_fast.testing.etcd import EtcdServer

pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster]


def run(cluster: Cluster, body: Any) -> None:
    try:
        uvloop.run(asyncio.wait_for(body(), 200))
    except BaseException:
        print(cluster.logs())
        raise


async def create_producer(target: str, topic: str, name: str) -> tuple[grpc.aio.Channel, Any, int]:
    channel = grpc.aio.insecure_channel(target)
    stub: Any = pb_grpc.ProducerServiceStub(channel)  # type: ignore[no-untyped-call]
    response = await stub.CreateProducer(pb.ProducerRequest(
        request_id=1, producer_name=name, topic_name=topic, dispatch_strategy=1), timeout=10)
    return channel, stub, response.producer_id


def send_request(topic: str, producer_id: int, n: int) -> pb.StreamMessage:
    return pb.StreamMessage(request_id=n, payload=f"m{n}".encode(), producer_name="raw",
                            msg_id=pb.MsgID(producer_id=producer_id, topic_name=topic))


def test_etcd_down_15s_owned_topics_keep_serving(cluster: Cluster, etcd: EtcdServer) -> None:
    brokers = cluster.start(2)
    topic = "/default/etcd-down"

    async def body() -> None:
        async with meta(etcd) as store:
            await subscribe_early(brokers[0], topic)
            acked = await produce_n(brokers[0].url, topic, 0, 20, "before")
            host = cluster.by_id(await owner(store, topic))  # type: ignore[arg-type]
        channel, stub, pid = await create_producer(host.target, topic, "during")
        etcd.stop()
        stopped = time.monotonic()
        during = 0
        try:
            n = 1000
            while time.monotonic() - stopped < 15:
                await stub.SendMessage(send_request(topic, pid, n), timeout=5)  # no retry: must succeed
                acked.append(n)
                n += 1
                during += 1
                await asyncio.sleep(0.02)
            # A topic cannot be created without the store: a retriable status that says why.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await create_producer(host.target, "/default/etcd-down-new", "x")
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
        finally:
            etcd.start()
        await channel.close()
        assert during > 100, f"only {during} sends were acknowledged during the outage"
        async with meta(etcd) as store:
            await wait_for(lambda: _registered(store, [b.broker_id for b in brokers]), "re-registration", 20)
        # after: new topics again, and every acknowledged message readable
        await produce_n(brokers[1].url, "/default/etcd-back", 0, 5, "after")
        got = await read_all(brokers[0].url, topic, set(acked), 30)
        assert set(got) >= set(acked)

    run(cluster, body)


async def _registered(store: Any, ids: list[int | None]) -> bool:
    for b in ids:
        if b is not None and await store.get(keys.broker_register(b)) is None:
            return False
    return True


def test_broker_paused_past_its_lease_does_not_acknowledge_after_sigcont(cluster: Cluster,
                                                                       etcd: EtcdServer) -> None:
    first = cluster.start(1)[0]
    topic = "/default/paused"

    async def body() -> None:
        await subscribe_early(first, topic)
        channel, stub, pid = await create_producer(first.target, topic, "raw")
        await stub.SendMessage(send_request(topic, pid, 0), timeout=5)
        cluster.start(1)
        assert first.process is not None
        os.kill(first.process.pid, signal.SIGSTOP)
        try:
            async with meta(etcd) as store:
                await wait_for(lambda: _owner_is_not(store, topic, first.broker_id), "reassignment", 20)
        finally:
            os.kill(first.process.pid, signal.SIGCONT)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.SendMessage(send_request(topic, pid, 1), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
        await channel.close()
        # the message refused after SIGCONT was never stored: only m0 and what follows on the new owner
        second = cluster.brokers[1]
        acked = await produce_n(second.url, topic, 2, 5, "after")
        got = await read_all(second.url, topic, {0, *acked}, 30)
        assert 1 not in got, "the paused broker stored a message after SIGCONT without revalidating"

    run(cluster, body)


async def _owner_is_not(store: Any, topic: str, broker: int | None) -> bool:
    current = await owner(store, topic)
    return current is not None and current != broker


def test_s3_down_20s_uploads_retry_wal_kept_readers_wait_nothing_lost(
        cluster: Cluster, etcd: EtcdServer, moto_server: Any, tmp_path: Any) -> None:
    bucket = moto_server.create_bucket()
    cluster.object_store = f"s3://{bucket}/tier"
    broker = cluster.add(s3_endpoint=moto_server.endpoint, s3_access_key="testing", s3_secret_key="testing")
    # Small segments, so that uploaded ones are deleted locally and old offsets are read from S3.
    assert broker.config_file is not None
    broker.config_file.write_text(broker.config_file.read_text() + "[wal]\nsegment_bytes = 4096\n"
                                  "retain_bytes = 0\n")
    broker.start()
    topic = "/default/s3-down"

    async def body() -> None:
        await subscribe_early(broker, topic)
        acked = await produce_n(broker.url, topic, 0, 300, "before")
        async with meta(etcd) as store:
            await wait_for(lambda: _uploaded_through(store, topic, 250), "uploads before the outage", 20)
        wal_dir = broker.data_dir / "wal" / "default" / "s3-down"
        moto_server.stop()
        try:
            acked += await produce_n(broker.url, topic, 300, 300, "during")  # the WAL keeps acknowledging
            await asyncio.sleep(2)
            assert any(wal_dir.iterdir()), "the local WAL was deleted while S3 was down"
            # A reader behind the WAL needs S3: it waits (the dispatcher retries the retriable error).
            reader = asyncio.create_task(read_all(broker.url, topic, set(acked), 90))
            await asyncio.sleep(3)
            assert not reader.done(), "the reader finished while the records it needs were only in S3"
            assert "subscription s on /default/s3-down: S3 get" in broker.log_tail(), \
                "the tiered reader did not meet the retriable S3 error"
            await asyncio.sleep(15)
        finally:
            moto_server.start()
        got = await reader
        offsets = sorted(next(iter(o)) for o in got.values())
        assert offsets == list(range(len(offsets))), "offsets are not contiguous"
        async with meta(etcd) as store:
            await wait_for(lambda: _uploaded_through(store, topic, 599), "uploads after the outage", 30)

    run(cluster, body)


async def _uploaded_through(store: Any, topic: str, offset: int) -> bool:
    ns, t = keys.split_topic_name(topic)
    return uploaded_through(await load_descriptors(store, ns, t)) >= offset


def test_crash_after_sealing_and_mid_load_the_move_completes_without_reusing_offsets(
        cluster: Cluster, etcd: EtcdServer) -> None:
    """The old owner dies right after writing the sealed state (its WAL not yet deleted); the new owner dies
    right after writing its reservation and opening its WAL. After both restart, the topic is served again,
    every acknowledged message is read once, and no offset is used twice."""
    old = cluster.start(1)[0]
    topic = "/default/crash-move"

    async def body() -> None:
        async with meta(etcd) as store:
            await subscribe_early(old, topic)
            acked = await produce_n(old.url, topic, 0, 50, "p1")
            old.env[crashpoints.ENV] = crashpoints.AFTER_SEAL
            old.restart()  # alone, it keeps the topic; armed from now on
            new = cluster.add()
            new.env[crashpoints.ENV] = crashpoints.MID_LOAD
            new.start()
            await wait_for(lambda: _owner_is(store, topic, old.broker_id), "the topic back on the old owner")
            await unload(store, topic)  # old seals, then dies; new loads, then dies
            await wait_for(lambda: not old.running and not new.running, "both crashes", 30)
            assert "crash point after_seal" in old.log_tail() and "crash point mid_load" in new.log_tail()
            old.env.clear()
            new.env.clear()
            old.start()
            new.start()
            await wait_for(lambda: owner(store, topic), "the topic placed after the restarts", 30)
            acked += await produce_n(old.url, topic, 50, 50, "p2")
            got = await read_all(new.url, topic, set(acked), 60)
            offsets = {n: next(iter(o)) for n, o in got.items()}
            assert all(len(o) == 1 for o in got.values()), "a message was read at two offsets"
            assert [offsets[n] for n in range(50)] == list(range(50))
            assert min(offsets[n] for n in range(50, 100)) >= 50, "an offset was reused"
            assert sorted(offsets.values()) == [offsets[n] for n in sorted(offsets)]

    run(cluster, body)


async def _owner_is(store: Any, topic: str, broker: int | None) -> bool:
    return await owner(store, topic) == broker

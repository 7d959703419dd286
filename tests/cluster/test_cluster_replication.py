"""Replicated topics on a real 3-broker cluster (etcd, a shared object folder), docs/REPLICATION.md: with
replicationFactor 2 an acknowledged record is on two brokers' disks, so when the owner's machine is gone
(kill -9 and its data directory deleted) the topic goes to the in-sync follower, which serves every
acknowledged record at once. Uploads are held off (an hour's interval), so the objects hold nothing and
only the follower's copy can have the records."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from danube import DanubeClientBuilder, SubType
from prometheus_client.parser import text_string_to_metric_families
from test_cluster_faults import create_producer, run, send_request
from test_cluster_moves import meta, produce_n, read_all, subscribe_early

from danube_fast.client import FastProducer
from danube_fast.meta import keys
from danube_fast.meta.resources import TopicReplicas
from danube_fast.meta.store import MetadataStore
from danube_fast.proto import PolicyAdmin_pb2 as policy_pb
from danube_fast.proto import PolicyAdmin_pb2_grpc as policy_grpc
from danube_fast.testing.cluster import Cluster, owner, wait_for
from danube_fast.testing.etcd import EtcdServer
from danube_fast.testing.proxy import Proxy

pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster]

HELD_UPLOADS = {"upload_interval_ms": 3_600_000, "replica_lag_ms": 2000}


@pytest.fixture(autouse=True)
def native_fetches(cluster: Cluster) -> None:
    """The brokers serve the native transport, so followers fetch over it (replication/fetch_client.py);
    test_cluster_handover.py and test_cluster_copy_dirs.py keep fetching over gRPC, and the one-way
    partition runs both ways."""
    cluster.native = True


async def set_namespace_policy(broker: Any, namespace: str, **changes: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
        stub: Any = policy_grpc.PolicyAdminStub(channel)  # type: ignore[no-untyped-call]
        await stub.SetNamespacePolicy(policy_pb.SetNamespacePolicyRequest(
            namespace=namespace, changes=json.dumps(changes)), timeout=10)


async def replicas(store: MetadataStore, topic: str) -> TopicReplicas | None:
    kv = await store.get(keys.replicas(*keys.split_topic_name(topic)))
    return None if kv is None else TopicReplicas.from_json(kv.value, key=kv.key)


async def in_sync(store: MetadataStore, topic: str, count: int) -> TopicReplicas:
    async def enough() -> TopicReplicas | None:
        got = await replicas(store, topic)
        return got if got is not None and len(got.isr) >= count else None

    found = await wait_for(enough, f"{count} copies of {topic} in sync", 30.0)
    assert isinstance(found, TopicReplicas)
    return found


def fetched_bytes(broker: Any, topic: str) -> dict[str, float]:
    """Record bytes the followers of `topic` fetched from `broker`, by transport (its metrics)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {s.labels["transport"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "danube_topic_replica_sent_bytes_total" and s.labels["topic"] == topic}


async def moved_from(store: MetadataStore, topic: str, dead: int) -> int | None:
    """The topic's owner once it is not `dead`."""
    now = await owner(store, topic)
    return now if now is not None and now != dead else None


def test_owner_machine_lost_its_follower_serves_every_acknowledged_record_at_once(
        cluster: Cluster, etcd: EtcdServer) -> None:
    brokers = cluster.start(3, **HELD_UPLOADS)
    topic = "/default/replicated"

    async def body() -> None:
        async with meta(etcd) as store:
            await set_namespace_policy(brokers[0], "default", replicationFactor=2, minInSyncReplicas=2)
            await subscribe_early(brokers[0], topic)
            copies = await in_sync(store, topic, 2)
            assert len(copies.followers) == 1 and copies.isr[0] == copies.owner
            acked = await produce_n(brokers[0].url, topic, 0, 300, "p")
            dead = await owner(store, topic)
            assert dead == copies.owner
            victim = cluster.by_id(dead)
            fetched = fetched_bytes(victim, topic)
            assert fetched.keys() == {"native"} and fetched["native"] > 0, fetched
            survivor = next(b for b in brokers if b is not victim)
            # Our producer, opened on the survivor, talks to the owner: when the owner is gone for good it
            # asks the survivor again where the topic went.
            fast = await FastProducer.connect(survivor.target, topic, "fast", reconnect_tries=200)
            await (await fast.send_batch([b"m1000"]))
            victim.kill()
            shutil.rmtree(victim.data_dir)  # the machine is gone: nothing of its WAL comes back
            lost_at = time.monotonic()
            await wait_for(lambda: moved_from(store, topic, dead), "the topic on another broker", 30.0)
            got = await read_all(survivor.url, topic, set(acked), timeout=60)
            took = time.monotonic() - lost_at
            assert set(acked) <= set(got), sorted(set(acked) - set(got))[:10]
            offsets = [o for number in acked for o in got[number]]
            assert len(offsets) == len(set(offsets)) == len(acked), "an offset holds two records"
            assert await owner(store, topic) == copies.isr[1]  # the in-sync follower took it over
            # The dead owner's lease (3 s) and one load: no wait for the dead broker's WAL.
            assert took < 20, f"read everything {took:.1f} s after the owner was lost"
            after = await replicas(store, topic)
            assert after is not None and after.owner == copies.isr[1]
            await asyncio.wait_for(await fast.send_batch([b"m1001"]), 30)
            await fast.close()
            more = await produce_n(survivor.url, topic, 300, 20, "p2")
            got = await read_all(survivor.url, topic, {*more, 1001}, timeout=60)
            assert {*more, 1001} <= set(got)

    run(cluster, body)


def test_an_owner_whose_process_died_is_replaced_before_its_lease_runs_out(
        cluster: Cluster, etcd: EtcdServer) -> None:
    """kill -9: nothing listens on the owner's admin port any more, so its follower's fetches are refused
    at once; the follower revokes the owner's lease (replication/dead_owner.py) and the topic moves to it
    well within the 15 s lease, with every acknowledged record."""
    brokers = cluster.start(3, **HELD_UPLOADS, lease_ttl_s=15)
    topic = "/default/quick-failover"

    async def body() -> None:
        async with meta(etcd) as store:
            await set_namespace_policy(brokers[0], "default", replicationFactor=2, minInSyncReplicas=2)
            await subscribe_early(brokers[0], topic)
            copies = await in_sync(store, topic, 2)
            acked = await produce_n(brokers[0].url, topic, 0, 100, "p")
            victim = cluster.by_id(copies.owner)
            survivor = cluster.by_id(copies.isr[1])
            victim.kill()
            killed = time.monotonic()
            await wait_for(lambda: moved_from(store, topic, copies.owner), "the topic elsewhere", 30.0)
            took = time.monotonic() - killed
            assert took < 6, f"moved {took:.1f} s after the kill: the lease (15 s) was waited for"
            assert await owner(store, topic) == survivor.broker_id
            got = await read_all(survivor.url, topic, set(acked), timeout=60)
            assert set(acked) <= set(got), sorted(set(acked) - set(got))[:10]
            assert "its lease is revoked so that its topics move now" in survivor.log_text()

    run(cluster, body)


async def cli_json(broker: Any, *args: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "danube_fast.cli.main", "admin", *args, "--admin-addr",
        f"127.0.0.1:{broker.admin_port}", "--output", "json", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


def test_followers_lost_leave_the_in_sync_set_sends_need_min_insync_and_a_wiped_broker_catches_up(
        cluster: Cluster, etcd: EtcdServer) -> None:
    """replicationFactor 3, minInSyncReplicas 2: one follower killed, sends go on once it left the in-sync
    set; the second killed, sends are refused (UNAVAILABLE naming the topic and the minimum) and nothing
    is acknowledged with one copy; a wiped broker comes back as a new one, is made a follower, catches up
    and sends are acknowledged again."""
    brokers = cluster.start(3, **HELD_UPLOADS)
    topic = "/default/three_copies"

    async def body() -> None:
        async with meta(etcd) as store:
            await set_namespace_policy(brokers[0], "default", replicationFactor=3, minInSyncReplicas=2)
            await subscribe_early(brokers[0], topic)
            copies = await in_sync(store, topic, 3)
            host = cluster.by_id(copies.owner)
            described = await cli_json(host, "topics", "describe", topic)
            assert (described["replication_factor"], described["in_sync"], described["under_replicated"]) \
                == (3, 3, False), described
            channel, stub, pid = await create_producer(host.target, topic, "raw")
            try:
                for n in range(20):
                    await stub.SendMessage(send_request(topic, pid, n), timeout=10)
                first, second = (cluster.by_id(b) for b in copies.followers)
                first.kill()
                started = time.monotonic()
                for n in range(20, 40):  # each waits for the copy gone until it leaves the in-sync set
                    await stub.SendMessage(send_request(topic, pid, n), timeout=15)
                assert time.monotonic() - started < 10
                shrunk = await replicas(store, topic)
                assert shrunk is not None and first.broker_id not in shrunk.isr and len(shrunk.isr) == 2
                second.kill()
                refused = None
                deadline = time.monotonic() + 15
                while refused is None and time.monotonic() < deadline:
                    try:
                        await stub.SendMessage(send_request(topic, pid, 40), timeout=15)
                    except grpc.aio.AioRpcError as e:
                        refused = e
                assert refused is not None and refused.code() == grpc.StatusCode.UNAVAILABLE, refused
                why = refused.details() or ""
                assert "minInSyncReplicas 2" in why and topic in why, why
                described = await cli_json(host, "topics", "describe", topic)
                assert (described["in_sync"], described["under_replicated"]) == (1, True), described
                shutil.rmtree(second.data_dir)  # its machine replaced: it comes back empty, as a new broker
                second.start()
                await in_sync(store, topic, 2)
                await stub.SendMessage(send_request(topic, pid, 41), timeout=15)
            finally:
                await channel.close()
            got = await read_all(host.url, topic, set(range(40)) | {41}, timeout=60)
            assert set(range(40)) | {41} <= set(got)

    run(cluster, body)


async def read_padded(url: str, topic: str, count: int, timeout: float) -> list[int]:
    """The numbers n of `count` records "m{n}:..." subscription "s" gets, in order, acknowledged."""
    client = await DanubeClientBuilder().service_url(url).build()
    consumer = client.new_consumer().with_topic(topic).with_consumer_name("reader") \
        .with_subscription("s").with_subscription_type(SubType.EXCLUSIVE).build()
    await consumer.subscribe()
    queue = await consumer.receive()
    got: list[int] = []
    try:
        async with asyncio.timeout(timeout):
            while len(got) < count:
                msg = await queue.get()
                got.append(int(bytes(msg.payload).split(b":", 1)[0][1:]))
                await consumer.ack(msg)
    finally:
        await consumer.close()
    return got


@pytest.fixture
def mounts() -> Iterator[list[Path]]:
    """tmpfs mounts made by a test, unmounted after it. Mounting needs root (CI runs as root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    made: list[Path] = []
    yield made
    for mnt in made:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_follower_whose_disk_is_full_leaves_the_in_sync_set_and_nothing_acknowledged_is_lost(
        cluster: Cluster, etcd: EtcdServer, mounts: list[Path]) -> None:
    """replicationFactor 3, minInSyncReplicas 2; one follower keeps its copies on a 4 MiB tmpfs. Sends of
    8 MiB go on (that follower leaves the in-sync set when its disk is full), and when the owner's machine is
    then lost, the follower in sync takes the topic over with every acknowledged record."""
    topic = "/default/full_follower"
    owner_broker = cluster.start(1, **HELD_UPLOADS)[0]
    payload = b"x" * 16384

    async def body() -> None:
        async with meta(etcd) as store:
            await subscribe_early(owner_broker, topic)  # placed on the only broker there is
            healthy = cluster.start(1, **HELD_UPLOADS)[0]
            full = cluster.add(**HELD_UPLOADS)
            replicas_dir = full.data_dir / "replicas"
            replicas_dir.mkdir(parents=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(replicas_dir)], check=True)
            mounts.append(replicas_dir)
            full.start()
            await set_namespace_policy(owner_broker, "default", replicationFactor=3, minInSyncReplicas=2)
            copies = await in_sync(store, topic, 3)
            assert copies.owner == owner_broker.broker_id
            channel, stub, pid = await create_producer(owner_broker.target, topic, "raw")
            try:
                for n in range(512):
                    message = send_request(topic, pid, n)
                    message.payload = b"m%d:" % n + payload
                    await stub.SendMessage(message, timeout=15)
            finally:
                await channel.close()
            now = await replicas(store, topic)
            assert now is not None and full.broker_id not in now.isr and healthy.broker_id in now.isr, now
            assert "cannot be written" in full.log_path.read_text()
            owner_broker.kill()
            shutil.rmtree(owner_broker.data_dir)
            assert await wait_for(lambda: moved_from(store, topic, copies.owner), "the topic moved",
                                  30.0) == healthy.broker_id
            got = await read_padded(healthy.url, topic, 512, timeout=90)
            assert got == list(range(512)), got[:10]

    run(cluster, body)


def test_an_owner_paused_past_its_lease_acknowledges_nothing_after_its_follower_took_over(
        cluster: Cluster, etcd: EtcdServer) -> None:
    """The owner is stopped (SIGSTOP) past its lease: its in-sync follower takes the topic over and serves
    every record; resumed, the old owner acknowledges nothing more (its follower no longer copies from it
    and its writes are fenced), and no offset holds two records."""
    brokers = cluster.start(3, **HELD_UPLOADS)
    topic = "/default/paused_owner"

    async def body() -> None:
        async with meta(etcd) as store:
            await set_namespace_policy(brokers[0], "default", replicationFactor=2, minInSyncReplicas=2)
            await subscribe_early(brokers[0], topic)
            copies = await in_sync(store, topic, 2)
            old = cluster.by_id(copies.owner)
            channel, stub, pid = await create_producer(old.target, topic, "raw")
            try:
                for n in range(50):
                    await stub.SendMessage(send_request(topic, pid, n), timeout=10)
                os.kill(old.pid, signal.SIGSTOP)
                try:
                    assert await wait_for(lambda: moved_from(store, topic, copies.owner), "the topic moved",
                                          30.0) == copies.isr[1]
                    survivor = cluster.by_id(copies.isr[1])
                    more = await produce_n(survivor.url, topic, 50, 50, "after")
                finally:
                    os.kill(old.pid, signal.SIGCONT)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.SendMessage(send_request(topic, pid, 1000), timeout=30)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
            finally:
                await channel.close()
            got = await read_all(survivor.url, topic, set(range(50)) | set(more), timeout=60)
            assert set(range(100)) <= set(got) and 1000 not in got
            offsets = [o for n in range(100) for o in got[n]]
            assert len(offsets) == len(set(offsets)) == 100, "an offset holds two records"

    run(cluster, body)


@pytest.mark.parametrize("direction", ["to_client", "to_server"], ids=["answers-held", "requests-held"])
@pytest.mark.parametrize("transport", ["native", "grpc"])
def test_a_one_way_partition_between_owner_and_follower(cluster: Cluster, etcd: EtcdServer,
                                                        direction: str, transport: str) -> None:
    """The follower's fetches reach the owner through a fault-injecting proxy in front of the owner's port
    they use (its registered native address, or its admin port when it serves no native transport). With
    only answers (or only requests) passing, the follower leaves the in-sync set and sends go on with the
    owner alone (minInSyncReplicas 1); healed, it catches up and joins again; then the owner's machine is
    lost and the follower serves every record acknowledged, those of the partition included."""
    cluster.native = transport == "native"
    brokers = [cluster.add(**HELD_UPLOADS) for _ in range(2)]
    topic = "/default/one_way"
    fetched_at = brokers[0].fast_port if cluster.native else brokers[0].admin_port

    async def body() -> None:
        with Proxy(f"127.0.0.1:{fetched_at}") as proxy:
            flag = "--fast-advertised-addr" if cluster.native else "--admin-advertised-addr"
            brokers[0].flags += [flag, proxy.target]
            brokers[0].start()
            async with meta(etcd) as store:
                await subscribe_early(brokers[0], topic)  # placed on the one broker there is: the owner
                brokers[1].start()
                await set_namespace_policy(brokers[0], "default", replicationFactor=2, minInSyncReplicas=1)
                copies = await in_sync(store, topic, 2)
                assert copies.owner == brokers[0].broker_id
                acked = await produce_n(brokers[0].url, topic, 0, 100, "p")
                await asyncio.to_thread(proxy.one_way, direction)
                started = time.monotonic()
                acked += await produce_n(brokers[0].url, topic, 100, 100, "p")
                assert time.monotonic() - started < 15
                alone = await replicas(store, topic)
                assert alone is not None and alone.isr == (copies.owner,), alone
                await asyncio.to_thread(proxy.pass_through)
                await in_sync(store, topic, 2)
                acked += await produce_n(brokers[0].url, topic, 200, 100, "p")
                fetched = fetched_bytes(brokers[0], topic)
                assert fetched.keys() == {transport} and fetched[transport] > 0, fetched
                brokers[0].kill()
                shutil.rmtree(brokers[0].data_dir)
                await wait_for(lambda: moved_from(store, topic, copies.owner), "the topic moved", 30.0)
                got = await read_all(brokers[1].url, topic, set(acked), timeout=90)
                assert set(acked) <= set(got)
                offsets = [o for n in acked for o in got[n]]
                assert len(offsets) == len(set(offsets)) == len(acked), "an offset holds two records"

    run(cluster, body)


def test_a_follower_down_when_its_owner_was_lost_fills_the_gap_from_its_copy_when_it_returns(
        cluster: Cluster, etcd: EtcdServer) -> None:
    """replicationFactor 2, minInSyncReplicas 2: the follower is killed and the owner's machine lost right
    after, before the follower left the in-sync set. No successor is alive, so the topic goes to the third
    broker with the dead owner's range a gap; the follower, started again, fills the gap from its copy and
    closes it (it held every acknowledged record), and readers get everything."""
    brokers = [cluster.add(**HELD_UPLOADS) for _ in range(3)]
    topic = "/default/late_follower"

    async def body() -> None:
        brokers[0].start()
        async with meta(etcd) as store:
            await subscribe_early(brokers[0], topic)  # owned by broker 0
            brokers[1].start()
            await set_namespace_policy(brokers[0], "default", replicationFactor=2, minInSyncReplicas=2)
            copies = await in_sync(store, topic, 2)
            assert copies.owner == brokers[0].broker_id
            brokers[2].start()
            acked = await produce_n(brokers[0].url, topic, 0, 100, "p")
            follower = cluster.by_id(copies.isr[1])
            follower.kill()
            brokers[0].kill()
            shutil.rmtree(brokers[0].data_dir)

            async def on_third() -> bool | None:  # it may go to the dead follower first, whose lease lasts
                return True if await owner(store, topic) == brokers[2].broker_id else None

            await wait_for(on_third, "the topic on the third broker", 30.0)
            follower.start()
            got = await read_all(brokers[2].url, topic, set(acked), timeout=90)
            assert set(acked) <= set(got)
            offsets = [o for n in acked for o in got[n]]
            assert len(offsets) == len(set(offsets)) == len(acked)
            more = await produce_n(brokers[2].url, topic, 100, 10, "p2")
            got = await read_all(brokers[2].url, topic, set(more), timeout=60)
            assert set(more) <= set(got)
            assert "declared empty" in follower.log_path.read_text()

    run(cluster, body)

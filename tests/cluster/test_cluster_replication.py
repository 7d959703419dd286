"""Replicated topics on a real 3-broker cluster (etcd, a shared object folder), docs/REPLICATION.md: with
replicationFactor 2 an acknowledged record is on two brokers' disks, so when the owner's machine is gone
(kill -9 and its data directory deleted) the topic goes to the in-sync follower, which serves every
acknowledged record at once. Uploads are held off (an hour's interval), so the objects hold nothing and
only the follower's copy can have the records."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from typing import Any

import grpc
import pytest
import uvloop
from test_cluster_moves import meta, produce_n, read_all, subscribe_early

from danube_fast.meta import keys
from danube_fast.meta.resources import TopicReplicas
from danube_fast.meta.store import MetadataStore
from danube_fast.proto import PolicyAdmin_pb2 as policy_pb
from danube_fast.proto import PolicyAdmin_pb2_grpc as policy_grpc
from danube_fast.testing.cluster import Cluster, owner, wait_for
from danube_fast.testing.etcd import EtcdServer

pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster]

HELD_UPLOADS = {"upload_interval_ms": 3_600_000, "replica_lag_ms": 2000}


def run(cluster: Cluster, body: Any) -> None:
    try:
        uvloop.run(asyncio.wait_for(body(), 200))
    except BaseException:
        print(cluster.logs())
        raise


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
            victim.kill()
            shutil.rmtree(victim.data_dir)  # the machine is gone: nothing of its WAL comes back
            lost_at = time.monotonic()
            survivor = next(b for b in brokers if b is not victim)

            async def moved() -> int | None:
                now = await owner(store, topic)
                return now if now is not None and now != dead else None

            await wait_for(moved, "the topic on another broker", 30.0)
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
            more = await produce_n(survivor.url, topic, 300, 20, "p2")
            got = await read_all(survivor.url, topic, set(more), timeout=60)
            assert set(more) <= set(got)

    run(cluster, body)

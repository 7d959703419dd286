"""A planned move of a replicated topic (docs/REPLICATION.md, "A planned move") on a real 3-broker cluster
(etcd, a shared object folder): the owner hands the topic to an in-sync follower, which continues from its
copy, instead of uploading the tail first; the old owner's log goes on as a copy of the new term. Uploads
are held off (an hour's interval), so only the copies can hold the records."""

from __future__ import annotations

import os
import signal

import pytest
from test_cluster_faults import run
from test_cluster_moves import meta, produce_n, read_all, subscribe_early
from test_cluster_replication import HELD_UPLOADS, in_sync, moved_from, replicas, set_namespace_policy

from danube_fast.meta import keys
from danube_fast.meta.store import MetadataStore
from danube_fast.testing.cluster import Cluster, unload, wait_for
from danube_fast.testing.etcd import EtcdServer

pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster]


async def objects(store: MetadataStore, topic: str) -> int:
    """The topic's object descriptors (what the tier holds)."""
    found = await store.get_prefix(keys.objects_prefix(*keys.split_topic_name(topic)))
    return sum(1 for kv in found if not kv.key.endswith("/cur"))


def test_a_planned_move_hands_the_topic_to_its_in_sync_follower_without_uploading(
        cluster: Cluster, etcd: EtcdServer) -> None:
    brokers = cluster.start(3, **HELD_UPLOADS)
    topic = "/default/handed"
    ns, t = keys.split_topic_name(topic)

    async def body() -> None:
        async with meta(etcd) as store:
            await set_namespace_policy(brokers[0], "default", replicationFactor=2, minInSyncReplicas=2)
            await subscribe_early(brokers[0], topic)
            first = await in_sync(store, topic, 2)
            acked = await produce_n(brokers[0].url, topic, 0, 300, "p")
            source = await unload(store, topic)
            assert source == first.owner
            target = await wait_for(lambda: moved_from(store, topic, source), "the topic elsewhere", 30.0)
            assert target == first.followers[0]  # the follower that held the tail, not the idlest broker
            assert await objects(store, topic) == 0  # nothing was uploaded for the move
            # The new owner serves every record at once, from what was its copy.
            got = await read_all(brokers[0].url, topic, set(acked), timeout=60)
            assert set(acked) <= set(got)
            offsets = [o for number in acked for o in got[number]]
            assert len(offsets) == len(set(offsets)) == len(acked), "an offset holds two records"
            # The old owner's log goes on as the new term's copy: it is in sync again without a copy
            # made anew (its copy.json names the new owner).
            second = await in_sync(store, topic, 2)
            assert (second.owner, second.followers) == (target, (source,))
            copy_dir = cluster.by_id(source).data_dir / "replicas" / ns / t
            assert (copy_dir / "copy.json").is_file()
            assert "goes on as its copy" in cluster.by_id(source).log_tail(200_000)
            more = await produce_n(brokers[0].url, topic, 300, 50, "p2")
            # And back: the old owner, in sync again, takes it over from its copy.
            assert await unload(store, topic) == target
            back = await wait_for(lambda: moved_from(store, topic, target), "the topic back", 30.0)
            assert back == source and await objects(store, topic) == 0
            later = await read_all(brokers[0].url, topic, set(more), timeout=60)  # the subscription goes on
            assert set(more) <= set(later)
            offsets += [o for number in more for o in later[number]]
            assert sorted(offsets) == list(range(350)), "an offset holds two records, or one is missing"

    run(cluster, body)


def test_a_planned_move_with_its_follower_out_of_sync_uploads_the_tail_and_loses_nothing(
        cluster: Cluster, etcd: EtcdServer) -> None:
    """The follower is stopped (SIGSTOP) and leaves the in-sync set (minInSyncReplicas 1: sends go on
    without it): the old owner uploads the tail as an unreplicated topic's move does, and the topic goes
    wherever the load manager places it."""
    brokers = cluster.start(3, **HELD_UPLOADS)
    topic = "/default/not_handed"

    async def body() -> None:
        async with meta(etcd) as store:
            await set_namespace_policy(brokers[0], "default", replicationFactor=2, minInSyncReplicas=1)
            await subscribe_early(brokers[0], topic)
            first = await in_sync(store, topic, 2)
            acked = await produce_n(brokers[0].url, topic, 0, 200, "p")
            frozen = cluster.by_id(first.followers[0])
            entry = next(b for b in brokers if b is not frozen)
            os.kill(frozen.pid, signal.SIGSTOP)
            try:
                acked += await produce_n(entry.url, topic, 200, 50, "p2")  # once the follower is out
                now = await replicas(store, topic)
                assert now is not None and now.isr == (first.owner,), now
                source = await unload(store, topic)
                await wait_for(lambda: moved_from(store, topic, source), "the topic on another broker", 30.0)
                assert await objects(store, topic) > 0  # the tail went to the objects
                assert "handed over" not in cluster.by_id(source).log_tail(200_000)
            finally:
                os.kill(frozen.pid, signal.SIGCONT)
            got = await read_all(entry.url, topic, set(acked), timeout=60)
            assert set(acked) <= set(got)
            offsets = [o for number in acked for o in got[number]]
            assert len(offsets) == len(set(offsets)) == len(acked)
            assert await replicas(store, topic) is not None

    run(cluster, body)

"""Retention while a topic moves (docs/RETENTION.md): two brokers on etcd and moto S3, a size limit on the
topic, its passes every 100 ms, the topic unloaded from owner to owner while a producer writes. Every pass
deletes through its owner's fence, so whatever the moves cut short: no descriptor names a missing object (the
whole topic reads back without an error), what is kept is contiguous up to the last acknowledged record, and
the retention state's floor is where the kept records begin."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
import uvloop
from test_cluster_moves import meta

from danube_fast.client import FastProducer
from danube_fast.client.reader import ReadFailed, TopicReader
from danube_fast.codec import frames
from danube_fast.meta import keys
from danube_fast.meta.resources import RetentionState
from danube_fast.proto import PolicyAdmin_pb2 as policy_pb
from danube_fast.proto import PolicyAdmin_pb2_grpc as policy_grpc
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.testing.cluster import Cluster, owner, unload, wait_for
from danube_fast.testing.etcd import EtcdServer

pytestmark = [pytest.mark.timeout(180), pytest.mark.cluster]
MOVES = 4
RECORD = b"r" * 1000


def test_retention_across_moves_deletes_only_through_the_owner(cluster: Cluster, etcd: EtcdServer) -> None:
    cluster.extra_config = "[broker]\nretention_check_ms = 100\n"
    brokers = cluster.start(2, upload_interval_ms=200)
    topic = "/default/kept_moving"

    async def body() -> None:
        async with meta(etcd) as store:
            producer = await FastProducer.connect(brokers[0].target, topic, "p", linger_ms=1)
            acked: dict[int, bytes] = {}

            async def produce(batches: int) -> None:
                for _ in range(batches):
                    payloads = [RECORD[:-8] + b"%08d" % (len(acked) + j) for j in range(4)]
                    first, last = await (await producer.send_batch(payloads))
                    acked.update(zip(range(first, last + 1), payloads, strict=True))

            await produce(300)
            await wait_for(lambda: _uploaded_past(store, topic, 1100), "the first records uploaded", 30.0)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{brokers[1].admin_port}") as channel:
                await policy_grpc.PolicyAdminStub(channel).SetTopicPolicy(policy_pb.SetTopicPolicyRequest(
                    topic=topic, changes=json.dumps({"retentionSizeInMB": 1})))
            for move in range(MOVES):
                source = await unload(store, topic)
                writing = asyncio.create_task(produce(60))
                await wait_for(lambda s=source: _moved(store, topic, s), f"an owner after move {move}", 20.0)
                await writing
            await producer.flush()
            await producer.close()
            end = max(acked)
            ns, t = keys.split_topic_name(topic)
            kept = await wait_for(lambda: _within(store, topic, 1 << 20, end), "retention under 1 MiB", 60.0)
            state = await store.get(keys.retention_state(ns, t))
            assert state is not None and RetentionState.from_json(state.value).floor == kept[0].start_offset
            floor = kept[0].start_offset
            async with TopicReader(brokers[0].target) as reader:
                with pytest.raises(ReadFailed, match=f"first readable offset is {floor}"):
                    [item async for item in reader.read(topic, 0, end + 1)]
                read = {r.offset: r.payload async for data, _, _ in reader.read(topic, floor, end + 1)
                        for r in frames.decode_records(data)}
            assert floor > 0 and sorted(read) == list(range(floor, end + 1)), "kept records not contiguous"
            assert all(read[o] == acked[o] for o in read), "a record was read with another payload"

    try:
        uvloop.run(asyncio.wait_for(body(), 150))
    except BaseException:
        print(cluster.logs())
        raise


async def _uploaded_past(store: object, topic: str, offset: int) -> bool:
    ns, t = keys.split_topic_name(topic)
    found = await load_descriptors(store, ns, t)  # type: ignore[arg-type]
    return bool(found) and found[-1].end_offset >= offset


async def _moved(store: object, topic: str, source: int) -> bool:
    now = await owner(store, topic)  # type: ignore[arg-type]
    return now is not None and now != source


async def _within(store: object, topic: str, limit: int, end: int) -> list | None:  # type: ignore[type-arg]
    """The descriptors once the newest ends at `end` and retention is done with them: they hold at most
    `limit` bytes together, as retention counts (storage/objects/expiry.py `expired`; it keeps the newest even
    when that one alone is over). Counting all but the newest let a CI run read the floor one pass too
    early."""
    ns, t = keys.split_topic_name(topic)
    found = await load_descriptors(store, ns, t)  # type: ignore[arg-type]
    if not found or found[-1].end_offset != end or (len(found) > 1 and sum(d.size for d in found) > limit):
        return None
    return found

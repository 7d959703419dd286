"""Topic tables in a 3-broker cluster (docs/TABLES.md): the catalog on the metadata store (a real etcd), table
files beside the objects in the shared store. A producer writes while the topic moves twice and its owner
is killed with -9 (and comes back to recover what its WAL held); the table ends with every stored offset
exactly once, every acknowledged record among them with its payload, the same rows the topic serves: first
with nothing past the dead owner's offset reservation (a hole the table must not wait at), then with records
after it."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import uvloop
from pyiceberg.table import StaticTable
from test_cluster_moves import meta

from danube_fast.client import FastProducer
from danube_fast.client.reader import TopicReader
from danube_fast.codec import frames
from danube_fast.meta import keys
from danube_fast.meta.resources_storage import TableCatalog, TablePointer
from danube_fast.meta.store import MetadataStore
from danube_fast.proto.TableAdmin_pb2 import TableStatusRequest
from danube_fast.proto.TableAdmin_pb2_grpc import TableAdminStub
from danube_fast.tables.catalog import committed_offsets
from danube_fast.testing.cluster import Cluster, owner, unload, wait_for
from danube_fast.testing.etcd import EtcdServer

pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster]

TABLES = '[tables]\nlag_ms = 500\npolicy_check_ms = 200\n[policy]\ntable_mode = "envelope"\n'


async def table_state(store: MetadataStore, topic: str) -> tuple[dict[str, int], list[tuple[int, bytes]]]:
    """The table's offsets and its (offset, value) rows, read as any reader would: the pointer in the
    metadata store, then the Iceberg metadata file it names."""
    ns, t = keys.split_topic_name(topic)
    kv = await store.get(keys.table_pointer(ns, t))
    if kv is None:
        return {}, []
    location = TablePointer.from_json(kv.value, key=kv.key).metadata_location

    def scan() -> tuple[dict[str, int], list[tuple[int, bytes]]]:
        table = StaticTable.from_metadata(location)
        got = table.scan(selected_fields=("offset", "value")).to_arrow()
        return committed_offsets(table), sorted(zip(got.column("offset").to_pylist(),
                                                    got.column("value").to_pylist(), strict=True))

    return await asyncio.to_thread(scan)


async def table_holds_the_topic(cluster: Cluster, store: MetadataStore, topic: str,
                                acked: dict[int, bytes]) -> None:
    """The owner serves every acknowledged record, and the table reaches its committed offset with the
    same rows, each offset once."""
    serving = await wait_for(lambda: owner(store, topic), "an owner", 30.0)
    target = cluster.by_id(serving).target
    async with TopicReader(target) as reader:
        start, committed = await reader.offsets(topic)
        stored: dict[int, bytes] = {}
        async for data, _first, _last in reader.read(topic, start, committed):
            for r in frames.decode_records(data):
                stored[r.offset] = r.payload
    assert set(acked) <= set(stored) and all(stored[o] == p for o, p in acked.items())

    async def caught_up() -> bool:
        offsets, _rows = await table_state(store, topic)
        return offsets.get(topic, -1) >= committed

    await wait_for(caught_up, "the table to reach the committed offset", 60.0)
    _offsets, rows = await table_state(store, topic)
    table_offsets = [o for o, _ in rows]
    assert len(table_offsets) == len(set(table_offsets)), "an offset is in the table twice"
    assert dict(rows) == stored, "the table's rows are not the topic's"


def test_moves_and_a_killed_owner_leave_every_offset_in_the_table_once(cluster: Cluster,
                                                                       etcd: EtcdServer) -> None:
    cluster.extra_config = TABLES
    brokers = cluster.start(3)
    topic = "/default/tabled"

    async def body() -> None:
        async with meta(etcd) as store:
            producer = await FastProducer.connect(brokers[0].target, topic, "p", linger_ms=5,
                                                  reconnect_tries=1000)  # across the lease of the killed
            acked: dict[int, bytes] = {}
            stop = asyncio.Event()

            async def produce() -> None:
                while not stop.is_set():
                    payloads = [b"t-%07d" % (len(acked) + i) for i in range(20)]
                    first, last = await (await producer.send_batch(payloads))
                    acked.update(zip(range(first, last + 1), payloads, strict=True))
                    await asyncio.sleep(0.01)

            task = asyncio.create_task(produce())
            await wait_for(lambda: owner(store, topic), "the first owner")
            for move in range(2):
                await asyncio.sleep(1.5)
                await unload(store, topic)
                await wait_for(lambda: owner(store, topic), f"an owner after move {move}", 20.0)
            await asyncio.sleep(1.5)
            victim = cluster.by_id(await wait_for(lambda: owner(store, topic), "the owner to kill"))
            stop.set()  # the producer stops first: what the victim acknowledged last stays in its WAL
            await asyncio.wait_for(task, 90)
            victim.kill()
            await asyncio.sleep(4.0)  # past its lease: the topic moves on
            victim.start()  # it recovers what its WAL held (docs/TOPIC_MOVE.md): the table waits for that
            # The new owner has nothing past the dead owner's reservation, a hole the table must not wait
            # at; then records after the hole.
            await table_holds_the_topic(cluster, store, topic, acked)
            stop.clear()
            task = asyncio.create_task(produce())
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.wait_for(task, 90)
            await producer.flush()
            await producer.close()
            await table_holds_the_topic(cluster, store, topic, acked)
            assert len(acked) > 300, f"only {len(acked)} records were acknowledged"
            # Any broker answers the status command: the owner's status, forwarded.
            serving = await wait_for(lambda: owner(store, topic), "an owner", 30.0)
            other = next(b for b in cluster.brokers if b.broker_id != serving)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{other.admin_port}") as channel:
                answer = await TableAdminStub(channel).Status(TableStatusRequest(topic=topic), timeout=30)
            offsets, _rows = await table_state(store, topic)
            assert [(t.stored_topic, t.committed_offset) for t in answer.tables] == [(topic, offsets[topic])]
            catalog = await store.get(keys.tables_catalog())
            assert catalog is not None and TableCatalog.from_json(catalog.value).kind == "metadata"

    try:
        uvloop.run(asyncio.wait_for(body(), 200))
    except BaseException:
        print(cluster.logs())
        raise

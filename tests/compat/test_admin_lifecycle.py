"""The admin port, and the contract appendix's lifecycle scenario: an admin deletes a topic under a live
client; health checks answer CLOSE, the consumer's stream ends, and the official client subscribes again by
itself once the topic exists again (docs/WIRE.md B.8, C.12, C.14, D.8, D.10)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import grpc
from compat_support import WAIT, RawApi, Session, bounded, rpc_error, run_async, status_line
from danube import SubType

from danube_fast.client import FastProducer
from danube_fast.proto import DanubeAdmin_pb2 as admin
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.testing.broker import Broker, BrokerFactory


class Admin:
    """NamespaceAdmin and TopicAdmin stubs on the broker's admin port."""

    def __init__(self, broker: Broker) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}")
        self.topics: Any = admin_grpc.TopicAdminStub(self.channel)  # type: ignore[no-untyped-call]
        self.namespaces: Any = admin_grpc.NamespaceAdminStub(self.channel)  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self.channel.close()


def test_namespaces_and_topics_through_the_admin_port(broker: Broker) -> None:
    async def scenario() -> None:
        a = Admin(broker)
        try:
            await bounded(a.namespaces.CreateNamespace(admin.NamespaceRequest(name="adm")), "CreateNamespace")
            again = await rpc_error(a.namespaces.CreateNamespace(admin.NamespaceRequest(name="adm")),
                                    "CreateNamespace twice")
            assert again.code() == grpc.StatusCode.NOT_FOUND and "already exists" in again.details(), \
                status_line(again)
            policies = await a.namespaces.GetNamespacePolicies(admin.NamespaceRequest(name="adm"))
            assert json.loads(policies.policies)["max_message_size"] == 10 * 1024 * 1024

            await a.topics.CreateTopic(admin.NewTopicRequest(name="/adm/one",
                                                             dispatch_strategy=admin.Reliable))
            await a.topics.CreatePartitionedTopic(admin.PartitionedTopicRequest(base_name="/adm/many",
                                                                                partitions=3))
            listed = await a.namespaces.GetNamespaceTopics(admin.NamespaceRequest(name="adm"))
            assert sorted(listed.topics) == ["adm/many-part-0", "adm/many-part-1", "adm/many-part-2",
                                             "adm/one"]
            infos = await a.topics.ListNamespaceTopics(admin.NamespaceRequest(name="adm"))
            assert {(t.name, t.delivery) for t in infos.topics} == {
                ("/adm/one", "Reliable"), ("/adm/many-part-0", "NonReliable"),
                ("/adm/many-part-1", "NonReliable"), ("/adm/many-part-2", "NonReliable")}
            assert len({t.broker_id for t in infos.topics}) == 1

            async with Session(broker.url) as s:
                assert await s.partitions("/adm/many") == [f"/adm/many-part-{i}" for i in range(3)]
                await s.consumer("/adm/one", "c", "sub-a", SubType.SHARED)
                described = await a.topics.DescribeTopic(admin.DescribeTopicRequest(name="/adm/one"))
                assert (described.delivery, list(described.subscriptions)) == ("Reliable", ["sub-a"])
                busy = await rpc_error(a.topics.Unsubscribe(admin.SubscriptionRequest(
                    topic="/adm/one", subscription="sub-a")), "Unsubscribe with an active consumer")
                assert busy.code() == grpc.StatusCode.NOT_FOUND and "active consumers" in busy.details()

            unknown = await a.topics.DescribeTopic(admin.DescribeTopicRequest(name="/adm/none"))
            assert (unknown.delivery, list(unknown.subscriptions)) == ("NonReliable", [])
            partition = await rpc_error(a.topics.DeleteTopic(admin.TopicRequest(name="/adm/many-part-1")),
                                        "DeleteTopic of one partition")
            assert partition.code() == grpc.StatusCode.NOT_FOUND, status_line(partition)
            await a.topics.DeleteTopic(admin.TopicRequest(name="/adm/many"))
            full = await rpc_error(a.namespaces.DeleteNamespace(admin.NamespaceRequest(name="adm")),
                                   "DeleteNamespace with a topic left")
            assert full.code() == grpc.StatusCode.NOT_FOUND and "topics" in full.details()
            await a.topics.DeleteTopic(admin.TopicRequest(name="/adm/one"))
            await a.namespaces.DeleteNamespace(admin.NamespaceRequest(name="adm"))
            gone = await rpc_error(a.namespaces.GetNamespacePolicies(admin.NamespaceRequest(name="adm")),
                                   "policies of a deleted namespace")
            assert gone.code() == grpc.StatusCode.NOT_FOUND
        finally:
            await a.close()

    run_async(scenario())


def test_delete_under_a_live_client_closes_and_the_client_resubscribes(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        a = Admin(broker)
        try:
            async with Session(broker.url) as s, RawApi(broker.target) as raw:
                await a.topics.CreateTopic(admin.NewTopicRequest(name=topic,
                                                                 dispatch_strategy=admin.Reliable))
                handle = await s.consumer(topic, "life-c", "life-sub", SubType.EXCLUSIVE)
                producer = await s.producer(topic, "life-p", reliable=True)
                await producer.send(b"before")
                first = await handle.get()
                assert bytes(first.payload) == b"before"
                await handle.ack(first)
                (tc,) = handle.consumer._consumers.values()
                old_consumer_id = tc.consumer_id
                (tp,) = producer._producers

                await a.topics.DeleteTopic(admin.TopicRequest(name=topic))
                assert await raw.health_check(pb.HealthCheckRequest.Consumer, old_consumer_id) == \
                    pb.HealthCheckResponse.CLOSE
                assert await raw.health_check(pb.HealthCheckRequest.Producer, tp.producer_id) == \
                    pb.HealthCheckResponse.CLOSE
                lookup = await rpc_error(raw.discovery.TopicLookup(pb.TopicLookupRequest(request_id=1,
                                                                                         topic=topic)),
                                         "lookup of the deleted topic")
                assert lookup.code() == grpc.StatusCode.NOT_FOUND

                # The topic comes back; the client must find it by itself: its health check (every 5 s)
                # sees CLOSE, the stream ends, and it subscribes again, with a new consumer id.
                await a.topics.CreateTopic(admin.NewTopicRequest(name=topic,
                                                                 dispatch_strategy=admin.Reliable))
                deadline = time.monotonic() + 5 + 2 * WAIT
                while tc.consumer_id == old_consumer_id:
                    assert time.monotonic() < deadline, "the client never subscribed again"
                    await asyncio.sleep(0.1)
                await asyncio.sleep(0.3)  # its new stream reaches the broker
                second = await s.producer(topic, "life-p2", reliable=True)
                await second.send(b"after")
                got = await handle.get(timeout=2 * WAIT)
                assert (bytes(got.payload), got.msg_id.topic_offset) == (b"after", 0)
        finally:
            await a.close()

    run_async(scenario(), timeout=60)


def test_delete_removes_the_topics_objects_too(broker_factory: BrokerFactory, topic: str) -> None:
    """DeleteTopic removes stored messages in the object tier as well, not only in the WAL: its objects
    would otherwise stay in the bucket (or DATA_DIR/objects) for ever, unreachable."""
    broker = broker_factory.start("[cluster]\nupload_interval_ms = 100\n")
    ns, short = topic.strip("/").split("/")
    objects = broker.data_dir / "objects" / ns / short

    async def scenario() -> None:
        a = Admin(broker)
        try:
            producer = await FastProducer.connect(broker.target, topic, "p", reliable=True)
            await (await producer.send_batch([b"kept-%d" % i for i in range(100)]))
            deadline = time.monotonic() + 10
            while not list(objects.glob("*.dnb1")):
                assert time.monotonic() < deadline, "nothing reached the object tier"
                await asyncio.sleep(0.05)
            await producer.close()
            await a.topics.DeleteTopic(admin.TopicRequest(name=topic))
            assert list(objects.glob("*")) == []
        finally:
            await a.close()

    run_async(scenario())

"""The cluster admin API over gRPC: two in-process brokers (X, the leader, and Y) serving their admin ports on
loopback over one embedded store, plus brokers registered straight into the store: Z, which owns a topic but
cannot be reached, and W, draining with no topic left. Calls made to one broker about the other's topics are
answered through the other (forwarding) or from the metadata."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from admin_nodes import FakeRebalancer, Node, closed_port, two_brokers
from cluster_support import lead, register, synced, topic

from danube_fast.broker.cluster.moves import Move
from danube_fast.broker.services.forward import FORWARDED
from danube_fast.errors import unavailable
from danube_fast.meta import keys
from danube_fast.meta.election import NotLeader
from danube_fast.meta.resources import (
    BrokerState,
    DeliveryMode,
    SubscriptionRecord,
    SubscriptionType,
    TopicSchemaConfig,
    Unassigned,
)
from danube_fast.meta.store import MetadataStore
from danube_fast.names import TopicName
from danube_fast.proto import DanubeAdmin_pb2 as admin
from danube_fast.proto import DanubeApi_pb2 as api

pytestmark = [pytest.mark.timeout(90), pytest.mark.cluster]

X, Y, Z, W = 101, 202, 303, 404
MOVES = [Move("/ns1/x-a", X, Y, 3.0, "topic count imbalance"),
         Move("/ns1/x-b", X, Y, 2.0, "topic count imbalance")]


async def rpc_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value


async def _others(store: MetadataStore, z_port: int) -> None:
    """Z (unreachable) owns /ns1/z-topic, which has a subscription; W is draining and owns nothing."""
    await register(store, Z, admin_port=z_port)
    await register(store, W, admin_port=closed_port(), mode="draining", reason="admin_unload")
    await topic(store, "ns1", "z-topic", Z, DeliveryMode.RELIABLE)
    await store.put(keys.topic_subscription("ns1", "z-topic", "zsub"),
                    SubscriptionRecord(None, "c", "zsub", SubscriptionType.SHARED).to_json())
    await topic(store, "ns1", "waiting", None)


async def _sync(store: MetadataStore, *nodes: Node) -> None:
    for node in nodes:
        await synced(node.view, store)


def test_cluster_admin_service_brokers(run: Any, tmp_path: Path) -> None:
    async def scenario() -> None:
        rebalancer = FakeRebalancer(MOVES)
        z_port = closed_port()
        async with two_brokers(tmp_path, X, Y, rebalancer) as (store, x, y):
            await x.stub("TopicAdmin").CreateTopic(admin.NewTopicRequest(name="/ns1/x-a"))
            await _others(store, z_port)
            await _sync(store, x, y)
            brokers: Any = y.stub("BrokerAdmin")

            listed = await brokers.ListBrokers(admin.Empty())
            assert [(b.broker_id, b.broker_role, b.broker_status) for b in listed.brokers] == [
                (str(X), "Cluster_Leader", "active"), (str(Y), "Cluster_Follower", "active"),
                (str(Z), "Cluster_Follower", "active"), (str(W), "Cluster_Follower", "drained")]
            first = listed.brokers[0]
            assert (first.admin_addr, first.broker_addr, first.metrics_addr) == (
                f"http://{x.addr}", f"http://127.0.0.1:{x.port + 1}", f"127.0.0.1:{x.port + 2}")
            assert (await brokers.GetLeaderBroker(admin.Empty())).leader == str(X)
            assert list((await brokers.ListNamespaces(admin.Empty())).namespaces) == [
                "default", "ns1", "system"]

            balance = await brokers.GetClusterBalance(admin.ClusterBalanceRequest())
            assert [(b.broker_id, b.topic_count, b.load) for b in balance.brokers] == [
                (X, 1, 1.0), (Y, 0, 0.0), (Z, 1, 1.0), (W, 0, 0.0)]
            assert (balance.broker_count, balance.mean_load, balance.max_load, balance.min_load) == (
                4, 0.5, 1.0, 0.0)
            assert (balance.coefficient_of_variation, balance.assignment_strategy) == (1.0, "least_loaded")

            # TriggerRebalance on a follower runs on the leader.
            dry = await brokers.TriggerRebalance(admin.RebalanceRequest(dry_run=True, max_moves=1))
            assert (dry.success, dry.moves_executed, dry.error_message) == (True, 0, "")
            assert [(m.topic_name, m.from_broker, m.to_broker, m.estimated_load, m.reason)
                    for m in dry.proposed_moves] == [("/ns1/x-a", X, Y, 3.0, "topic count imbalance")]
            done = await brokers.TriggerRebalance(admin.RebalanceRequest())
            assert (done.moves_executed, len(done.proposed_moves)) == (2, 2)
            assert rebalancer.calls == [(True, 1), (False, None)]
            rebalancer.fail = NotLeader("deposed")  # the election moved on before the view did
            moved = await rpc_error(brokers.TriggerRebalance(admin.RebalanceRequest()))
            assert moved.code() == grpc.StatusCode.UNAVAILABLE and "deposed" in moved.details(), moved
            rebalancer.fail = None
            rebalancer.calls.clear()

            # Drain and activate W through Y; a dry run of X changes nothing.
            planned = await brokers.UnloadBroker(admin.UnloadBrokerRequest(broker_id=str(X), dry_run=True))
            assert (planned.started, planned.total, planned.pending) == (False, 1, 1)
            await brokers.ActivateBroker(admin.ActivateBrokerRequest(broker_id=str(W), reason="back"))
            assert y.view.state(W) == BrokerState("active", "back")
            drained = await brokers.UnloadBroker(admin.UnloadBrokerRequest(broker_id=str(W)))
            assert (drained.started, drained.total, drained.succeeded) == (True, 0, 0)
            assert y.view.state(W) == BrokerState("draining", "admin_unload")
            await synced(x.view, store)
            assert [b.broker_status for b in (await x.stub("BrokerAdmin").ListBrokers(admin.Empty())).brokers
                    ] == ["active", "active", "active", "drained"]
            for bad in ("", "abc", "007"):
                e = await rpc_error(brokers.ActivateBroker(admin.ActivateBrokerRequest(broker_id=bad)))
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
            e = await rpc_error(brokers.UnloadBroker(admin.UnloadBrokerRequest(broker_id="999")))
            assert e.code() == grpc.StatusCode.NOT_FOUND

            # Leader unreachable, leader without a load manager, no leader.
            await lead(store, Z)
            await synced(y.view, store)
            e = await rpc_error(brokers.TriggerRebalance(admin.RebalanceRequest()))
            assert e.code() == grpc.StatusCode.UNAVAILABLE and f"127.0.0.1:{z_port}" in e.details(), e
            await lead(store, Y)
            await synced(y.view, store)
            e = await rpc_error(brokers.TriggerRebalance(admin.RebalanceRequest()))
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
            await store.delete(keys.leader())
            await synced(y.view, store)
            assert (await brokers.GetLeaderBroker(admin.Empty())).leader == "not_found"
            e = await rpc_error(brokers.TriggerRebalance(admin.RebalanceRequest()))
            assert e.code() == grpc.StatusCode.UNAVAILABLE and "no leader" in e.details()
            assert rebalancer.calls == []

    run(scenario(), timeout=60)


def test_cluster_admin_service_topics_across_brokers(run: Any, tmp_path: Path) -> None:
    async def scenario() -> None:
        z_port = closed_port()
        async with two_brokers(tmp_path, X, Y) as (store, x, y):
            x_topics: Any = x.stub("TopicAdmin")
            y_topics: Any = y.stub("TopicAdmin")
            await x_topics.CreateTopic(admin.NewTopicRequest(name="/ns1/x-rel",
                                                             dispatch_strategy=admin.Reliable))
            await y_topics.CreateTopic(admin.NewTopicRequest(name="/ns1/y-plain"))
            await y_topics.CreatePartitionedTopic(admin.PartitionedTopicRequest(base_name="/ns1/parts",
                                                                                partitions=2))
            await _others(store, z_port)
            # Y's topic gets a subscription (its consumer active) and a schema subject.
            y_plain = y.topics.find("/ns1/y-plain")
            assert y_plain is not None
            consumer_id = await y.ctx.subscriptions.subscribe(y_plain, api.ConsumerRequest(
                topic_name="/ns1/y-plain", consumer_name="c1", subscription="sub-y", subscription_type=1))
            await y.schemas.registry.register("orders", "string", b"")
            await y.schemas.configure(y_plain, "orders", "warn", False)
            await _sync(store, x, y)

            everything = ["ns1/parts-part-0", "ns1/parts-part-1", "ns1/waiting", "ns1/x-rel", "ns1/y-plain",
                          "ns1/z-topic"]
            listed = await x.stub("NamespaceAdmin").GetNamespaceTopics(admin.NamespaceRequest(name="ns1"))
            assert list(listed.topics) == everything
            infos = await x_topics.ListNamespaceTopics(admin.NamespaceRequest(name="ns1"))
            assert [(t.name, t.broker_id, t.delivery) for t in infos.topics] == [
                ("/ns1/parts-part-0", str(Y), "NonReliable"), ("/ns1/parts-part-1", str(Y), "NonReliable"),
                ("/ns1/waiting", "", "NonReliable"), ("/ns1/x-rel", str(X), "Reliable"),
                ("/ns1/y-plain", str(Y), "NonReliable"), ("/ns1/z-topic", str(Z), "Reliable")]
            of_y = await x_topics.ListBrokerTopics(admin.BrokerRequest(broker_id=str(Y)))
            assert [t.name for t in of_y.topics] == ["/ns1/parts-part-0", "/ns1/parts-part-1", "/ns1/y-plain"]
            assert list((await x_topics.ListBrokerTopics(admin.BrokerRequest(broker_id="999"))).topics) == []

            # DescribeTopic of Y's topic through X (from the metadata) is Y's own answer.
            request = admin.DescribeTopicRequest(name="/ns1/y-plain")
            remote, local = await x_topics.DescribeTopic(request), await y_topics.DescribeTopic(request)
            assert remote == local
            assert (remote.broker_id, list(remote.subscriptions), remote.schema_subject, remote.schema_type,
                    remote.compatibility_mode) == (str(Y), ["sub-y"], "orders", "string", "BACKWARD")
            waiting = await x_topics.DescribeTopic(admin.DescribeTopicRequest(name="/ns1/waiting"))
            assert (waiting.broker_id, waiting.delivery, waiting.HasField("schema_id")) == ("", "NonReliable",
                                                                                            False)
            z_described = await x_topics.DescribeTopic(admin.DescribeTopicRequest(name="/ns1/z-topic"))
            assert (z_described.broker_id, z_described.delivery, list(z_described.subscriptions)) == (
                str(Z), "Reliable", ["zsub"])
            bad = await x_topics.DescribeTopic(admin.DescribeTopicRequest(name="not a topic"))
            assert (bad.name, bad.broker_id, bad.delivery) == ("not a topic", "", "NonReliable")

            # Subscriptions: Y answers for its topic; Z cannot be reached, so the metadata answers.
            subs = await x_topics.ListSubscriptions(admin.TopicRequest(name="/ns1/y-plain"))
            assert list(subs.subscriptions) == ["sub-y"]
            z_subs = await x_topics.ListSubscriptions(admin.TopicRequest(name="/ns1/z-topic"))
            assert list(z_subs.subscriptions) == ["zsub"]
            unsub = admin.SubscriptionRequest(topic="/ns1/y-plain", subscription="sub-y")
            busy = await rpc_error(x_topics.Unsubscribe(unsub))
            assert busy.code() == grpc.StatusCode.NOT_FOUND and "active consumers" in busy.details()
            y.ctx.clients.consumer(consumer_id).active = False
            await x_topics.Unsubscribe(unsub)
            assert "sub-y" not in y_plain.subscriptions
            assert list((await x_topics.ListSubscriptions(admin.TopicRequest(name="/ns1/y-plain")))
                        .subscriptions) == []
            z_unsub = await rpc_error(x_topics.Unsubscribe(admin.SubscriptionRequest(topic="/ns1/z-topic",
                                                                                    subscription="zsub")))
            assert z_unsub.code() == grpc.StatusCode.UNAVAILABLE
            assert f"127.0.0.1:{z_port}" in z_unsub.details()

            # UnloadTopic: the unload marker (docs/TOPIC_MOVE.md), from any broker.
            await x_topics.UnloadTopic(admin.TopicRequest(name="/ns1/y-plain"))
            marker = await store.get(keys.unassigned("ns1", "y-plain"))
            assert marker is not None and Unassigned.from_json(marker.value) == Unassigned.unload(Y)
            assert await store.get(keys.broker_topic(Y, "ns1", "y-plain")) is None
            again = await rpc_error(x_topics.UnloadTopic(admin.TopicRequest(name="/ns1/y-plain")))
            assert again.code() == grpc.StatusCode.NOT_FOUND

            # DeleteTopic: partitions deleted by their owner Y; refusals; X's own topic here.
            part = await rpc_error(x_topics.DeleteTopic(admin.TopicRequest(name="/ns1/parts-part-0")))
            assert part.code() == grpc.StatusCode.NOT_FOUND and "partition" in part.details()
            await x_topics.DeleteTopic(admin.TopicRequest(name="/ns1/parts"))
            assert y.topics.find("/ns1/parts-part-0") is None and y.topics.find("/ns1/parts-part-1") is None
            for name, why in (("/ns1/waiting", "unassigned"), ("/ns1/z-topic", "cannot be reached"),
                              ("/ns1/none", "does not exist")):
                refused = await rpc_error(x_topics.DeleteTopic(admin.TopicRequest(name=name)))
                assert refused.code() == grpc.StatusCode.NOT_FOUND and why in refused.details(), refused
            # A forwarded call is answered here, never sent on: X does not serve Y's topic.
            looped = await rpc_error(x_topics.DeleteTopic(admin.TopicRequest(name="/ns1/parts-part-0"),
                                                          metadata=((FORWARDED, "1"),)))
            assert looped.code() == grpc.StatusCode.NOT_FOUND and f"broker {X}" in looped.details()
            await y_topics.DeleteTopic(admin.TopicRequest(name="/ns1/x-rel"))
            assert x.topics.find("/ns1/x-rel") is None
            await _sync(store, x, y)
            left = await y.stub("NamespaceAdmin").GetNamespaceTopics(admin.NamespaceRequest(name="ns1"))
            assert list(left.topics) == ["ns1/waiting", "ns1/y-plain", "ns1/z-topic"]
            full = await rpc_error(y.stub("NamespaceAdmin").DeleteNamespace(
                admin.NamespaceRequest(name="ns1")))
            assert full.code() == grpc.StatusCode.NOT_FOUND and "3 topics" in full.details()

            # CreateTopic in a cluster: the load manager placed the new topic on X (Topics answers UNAVAILABLE
            # for a producer to look it up again); the admin call succeeded, the subject is in its metadata.
            async def placed_on_x(name: TopicName, delivery: DeliveryMode) -> None:
                await topic(store, name.namespace, name.topic, X, delivery)
                raise unavailable("The topic metadata was created, need to redo the lookup")

            y.topics.create_topic = placed_on_x  # type: ignore[assignment,method-assign]
            await y_topics.CreateTopic(admin.NewTopicRequest(name="/ns1/placed", schema_subject="orders"))
            config = await store.get(keys.topic_schema("ns1", "placed"))
            assert config is not None and TopicSchemaConfig.from_json(config.value).schema_subject == "orders"
            again = await rpc_error(y_topics.CreateTopic(admin.NewTopicRequest(name="/ns1/placed")))
            assert again.code() == grpc.StatusCode.NOT_FOUND and "already exists" in again.details(), again
            del y.topics.create_topic  # Topics' own again: UNAVAILABLE without creating anything
            nowhere = await rpc_error(y_topics.CreateTopic(admin.NewTopicRequest(name="/nowhere/t")))
            assert nowhere.code() == grpc.StatusCode.NOT_FOUND and "namespace nowhere" in nowhere.details()

    run(scenario(), timeout=60)


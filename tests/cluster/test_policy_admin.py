"""PolicyAdmin over gRPC (broker/services/policy_admin.py, docs/RETENTION.md): two in-process admin nodes over
one embedded store. A namespace's policy changed on one node is the policy the other's topics follow; a
topic's own policy replaces it; bad changes get INVALID_ARGUMENT naming what was wrong, and nothing is
written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from admin_nodes import two_brokers
from cluster_support import synced, topic

from danube_fast.meta import keys
from danube_fast.names import TopicName
from danube_fast.proto import DanubeAdmin_pb2 as admin
from danube_fast.proto import PolicyAdmin_pb2 as pb
from danube_fast.proto import PolicyAdmin_pb2_grpc as policy_grpc

pytestmark = [pytest.mark.timeout(60), pytest.mark.cluster]
X, Y = 101, 202


async def refused(call: Any, code: grpc.StatusCode, *words: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    assert e.value.code() == code, e.value
    for word in words:
        assert word in (e.value.details() or ""), e.value.details()


def test_policies_of_namespaces_and_topics(run: Any, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with two_brokers(tmp_path, X, Y) as (store, x, y):
            await topic(store, "ns1", "t", X)
            await synced(y.view, store)
            on_x, on_y = policy_grpc.PolicyAdminStub(x.channel), policy_grpc.PolicyAdminStub(y.channel)

            got = await on_x.SetNamespacePolicy(pb.SetNamespacePolicyRequest(
                namespace="ns1", changes='{"retentionTimeInMinutes": 1440}'))
            assert json.loads(got.policy)["retentionTimeInMinutes"] == 1440 and not got.own
            listed = await y.stub("NamespaceAdmin").GetNamespacePolicies(admin.NamespaceRequest(name="ns1"))
            assert json.loads(listed.policies)["retentionTimeInMinutes"] == 1440
            follows = await on_y.GetTopicPolicy(pb.TopicPolicyRequest(topic="/ns1/t"))
            assert json.loads(follows.policy)["retentionTimeInMinutes"] == 1440 and not follows.own

            own = await on_y.SetTopicPolicy(pb.SetTopicPolicyRequest(topic="/ns1/t",
                                                                     changes='{"retentionSizeInMB": 10}'))
            policy = json.loads(own.policy)
            assert own.own and policy["retentionSizeInMB"] == 10 and policy["retentionTimeInMinutes"] == 1440
            assert (await x.ctx.namespaces.read_topic_policy(TopicName("ns1", "t"))).retention_size_mb == 10
            await on_x.SetNamespacePolicy(pb.SetNamespacePolicyRequest(
                namespace="ns1", changes='{"retentionTimeInMinutes": 5}'))
            mine = json.loads((await on_x.GetTopicPolicy(pb.TopicPolicyRequest(topic="/ns1/t"))).policy)
            assert mine["retentionTimeInMinutes"] == 1440, "a topic's own policy is its whole policy"
            back = await on_x.ClearTopicPolicy(pb.TopicPolicyRequest(topic="/ns1/t"))
            assert not back.own and json.loads(back.policy)["retentionTimeInMinutes"] == 5
            assert "retentionSizeInMB" not in json.loads(back.policy)

            before = await store.get(keys.namespace_policy("ns1"))
            bad = pb.SetNamespacePolicyRequest
            await refused(on_x.SetNamespacePolicy(bad(namespace="ns1", changes='{"retention": 1}')),
                          grpc.StatusCode.INVALID_ARGUMENT, "unknown policy keys ['retention']",
                          "retentionTimeInMinutes")
            await refused(on_x.SetNamespacePolicy(bad(namespace="ns1", changes='{"retentionSizeInMB": -1}')),
                          grpc.StatusCode.INVALID_ARGUMENT, "retentionSizeInMB")
            await refused(on_x.SetNamespacePolicy(bad(namespace="ns1", changes='{"max_message_size": true}')),
                          grpc.StatusCode.INVALID_ARGUMENT, "max_message_size")
            await refused(on_x.SetNamespacePolicy(bad(namespace="ns1", changes="[1]")),
                          grpc.StatusCode.INVALID_ARGUMENT, "JSON object")
            await refused(on_x.SetNamespacePolicy(bad(namespace="ns1", changes="{")),
                          grpc.StatusCode.INVALID_ARGUMENT, "not JSON")
            assert await store.get(keys.namespace_policy("ns1")) == before, "a refused change wrote nothing"
            one_mib = '{"retentionSizeInMB": 1}'
            await refused(on_x.SetNamespacePolicy(bad(namespace="nowhere", changes=one_mib)),
                          grpc.StatusCode.NOT_FOUND, "nowhere")
            await refused(on_x.SetNamespacePolicy(bad(namespace="no/pe", changes=one_mib)),
                          grpc.StatusCode.INVALID_ARGUMENT)
            await refused(on_x.GetTopicPolicy(pb.TopicPolicyRequest(topic="/ns1/nothing")),
                          grpc.StatusCode.NOT_FOUND, "/ns1/nothing")
            await refused(on_x.SetTopicPolicy(pb.SetTopicPolicyRequest(topic="ns1-t", changes="{}")),
                          grpc.StatusCode.INVALID_ARGUMENT)

    run(scenario())

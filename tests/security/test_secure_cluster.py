"""Security on a real 2-broker cluster (etcd, shared object store): a role binding made through one broker
applies on the other within a second, a token revoked through one is refused by the other within 2 s, and
admin calls forwarded between brokers go over TLS carrying the caller's token."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import grpc
import jwt
import pytest

from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc
from danube_fast.proto import SecurityAdmin_pb2 as sec_pb
from danube_fast.testing.broker import Broker
from danube_fast.testing.cluster import Cluster
from tests.compat.compat_support import run_async
from tests.security.conftest import Pki, security_toml
from tests.security.test_secure_broker import (
    bearer,
    health_error,
    seconds_until_refused,
    security_admin,
    tls,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.cluster]


async def lookup_status(broker: Broker, pki: Pki, token: str, topic: str) -> grpc.StatusCode:
    async with grpc.aio.secure_channel(broker.target, tls(pki)) as channel:
        stub: Any = pb_grpc.DiscoveryStub(channel)  # type: ignore[no-untyped-call]
        try:
            await stub.TopicLookup(pb.TopicLookupRequest(request_id=1, topic=topic), metadata=bearer(token),
                                   timeout=5)
        except grpc.aio.AioRpcError as e:
            return e.code()
        return grpc.StatusCode.OK


async def seconds_until(broker: Broker, pki: Pki, token: str, topic: str, allowed: bool) -> float:
    """Seconds until bob's lookup on `broker` is allowed (or denied), polling every 20 ms, at most 5 s."""
    start = time.monotonic()
    while time.monotonic() - start < 5:
        code = await lookup_status(broker, pki, token, topic)
        if (code != grpc.StatusCode.PERMISSION_DENIED) == allowed:
            return time.monotonic() - start
    state = "denied" if allowed else "allowed"
    raise AssertionError(f"bob's lookup on {broker.target} still {state} after 5 s")


def test_bindings_made_on_one_broker_apply_on_the_other_within_a_second(cluster: Cluster, pki: Pki) -> None:
    cluster.extra_config = security_toml(pki)
    one, two = cluster.start(2)
    bob = pki.token("bob")

    async def scenario() -> None:
        topic = "/default/shared"
        assert await lookup_status(two, pki, bob, topic) == grpc.StatusCode.PERMISSION_DENIED
        await security_admin(one, pki, "PutRole", sec_pb.Role(name="reader", permissions=["Lookup"]))
        binding = sec_pb.Binding(principal="bob", role="reader", scope="cluster")
        await security_admin(one, pki, "Bind", binding)
        assert await seconds_until(two, pki, bob, topic, allowed=True) <= 1.0
        await security_admin(two, pki, "Unbind", binding)
        assert await seconds_until(one, pki, bob, topic, allowed=False) <= 1.0
    try:
        run_async(scenario())
    except BaseException:
        print(cluster.logs())
        raise


def test_a_token_revoked_through_one_broker_is_refused_by_the_other_within_2_s(cluster: Cluster,
                                                                              pki: Pki) -> None:
    """The deny list travels as the bindings do, through each broker's watch-fed cache. Measured from the
    moment the RevokeToken call is sent to broker one (so the store write is included) to the first refusal
    by broker two, which is called every 20 ms from before the revocation is sent."""
    cluster.extra_config = security_toml(pki)
    one, two = cluster.start(2)
    leaked, sibling = (pki.token("carol", jti=str(uuid.uuid4())) for _ in range(2))
    jti = jwt.decode(leaked, options={"verify_signature": False})["jti"]

    async def scenario() -> None:
        for broker in (one, two):
            assert await health_error(broker, pki, leaked) is None
        sent = time.monotonic()
        watching = asyncio.create_task(seconds_until_refused(two, pki, leaked, sent))
        await security_admin(one, pki, "RevokeToken", sec_pb.RevokeTokenRequest(jti=jti, sub="carol"))
        answered = time.monotonic() - sent
        seconds, error = await watching
        print(f"RevokeToken answered by broker one after {answered * 1000:.0f} ms; broker two refused the "
              f"token {seconds * 1000:.0f} ms after it was sent")
        assert seconds <= 2.0
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED and "revoked" in (error.details() or "")
        assert await health_error(one, pki, leaked) is not None  # the answering broker had it on return
        for broker in (one, two):
            assert await health_error(broker, pki, sibling) is None
    try:
        run_async(scenario())
    except BaseException:
        print(cluster.logs())
        raise


def test_admin_calls_forwarded_to_the_owner_go_over_tls_with_the_callers_token(cluster: Cluster,
                                                                               pki: Pki) -> None:
    """ListSubscriptions is answered by the topic's owner: asked on both brokers, one of them forwards it."""
    from danube_fast.proto import DanubeAdmin_pb2 as admin_pb
    from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc

    cluster.extra_config = security_toml(pki)
    brokers = cluster.start(2)

    async def subscriptions(broker: Broker, who: str) -> Any:
        async with grpc.aio.secure_channel(f"127.0.0.1:{broker.admin_port}", tls(pki)) as channel:
            stub: Any = admin_grpc.TopicAdminStub(channel)  # type: ignore[no-untyped-call]
            return await stub.ListSubscriptions(admin_pb.TopicRequest(name="/default/owned"),
                                                metadata=bearer(pki.token(who)), timeout=10)

    async def scenario() -> None:
        async with grpc.aio.secure_channel(f"127.0.0.1:{brokers[0].admin_port}", tls(pki)) as channel:
            stub: Any = admin_grpc.TopicAdminStub(channel)  # type: ignore[no-untyped-call]
            await stub.CreateTopic(admin_pb.NewTopicRequest(name="/default/owned"),
                                   metadata=bearer(pki.token("admin")), timeout=10)
        for broker in brokers:
            assert list((await subscriptions(broker, "admin")).subscriptions) == []
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await subscriptions(broker, "mallory")
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    try:
        run_async(scenario())
    except BaseException:
        print(cluster.logs())
        raise


@pytest.mark.parametrize("trusted", [True, False])
def test_on_mtls_brokers_forward_as_themselves_only_when_named_broker_principals(cluster: Cluster, pki: Pki,
                                                                                 trusted: bool) -> None:
    """Certificates only (mode tls, verify_client): a forwarded call carries no token, so the owner sees the
    forwarding broker's certificate; it passes only if that is one of `broker_principals`."""
    from danube_fast.proto import DanubeAdmin_pb2 as admin_pb
    from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc

    extra = 'broker_principals = ["cert:broker"]\n' if trusted else ""
    cluster.extra_config = security_toml(pki, mode="tls", verify_client=True, super_admins=("cert:alice",),
                                         extra=extra)
    brokers = cluster.start(2)
    alice = tls(pki, pki.alice)

    async def call(broker: Broker, method: str, request: Any) -> Any:
        async with grpc.aio.secure_channel(f"127.0.0.1:{broker.admin_port}", alice) as channel:
            stub: Any = admin_grpc.TopicAdminStub(channel)  # type: ignore[no-untyped-call]
            return await getattr(stub, method)(request, timeout=10)

    async def scenario() -> None:
        await call(brokers[0], "CreateTopic", admin_pb.NewTopicRequest(name="/default/mtls-owned"))
        codes = []
        for broker in brokers:
            try:
                await call(broker, "ListSubscriptions", admin_pb.TopicRequest(name="/default/mtls-owned"))
                codes.append(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as e:
                codes.append(e.code())
        # The owner answers alice itself; the other forwards, as cert:broker.
        assert grpc.StatusCode.OK in codes
        assert codes.count(grpc.StatusCode.OK) == (2 if trusted else 1), codes
        if not trusted:
            assert grpc.StatusCode.PERMISSION_DENIED in codes
    try:
        run_async(scenario())
    except BaseException:
        print(cluster.logs())
        raise


def test_both_brokers_of_a_cluster_refuse_bad_credentials(cluster: Cluster, pki: Pki) -> None:
    """The refusals of tests/security/test_secure_broker.py, on each broker of a 2-broker cluster (raw gRPC
    on the client and admin ports): nothing is created by a refused call."""
    from danube_fast.proto import DanubeAdmin_pb2 as admin_pb
    from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
    from tests.compat.compat_support import rpc_error
    from tests.security.test_secure_broker import create_producer

    cluster.extra_config = security_toml(pki)
    brokers = cluster.start(2)
    cases = {
        "no token": ((), grpc.StatusCode.UNAUTHENTICATED),
        "expired": (bearer(pki.token("admin", ttl=-120)), grpc.StatusCode.UNAUTHENTICATED),
        "wrong audience": (bearer(pki.token("admin", aud="other")), grpc.StatusCode.UNAUTHENTICATED),
        "spoofed header": ((("x-danube-internal-broker", "1"),), grpc.StatusCode.UNAUTHENTICATED),
        "no permission": (bearer(pki.token("mallory")), grpc.StatusCode.PERMISSION_DENIED),
    }

    async def scenario() -> None:
        for i, broker in enumerate(brokers):
            for case, (metadata, code) in cases.items():
                topic = f"/default/refused-{i}-{case.replace(' ', '-')}"
                error = await rpc_error(create_producer(broker, pki, topic, metadata), case)
                assert error.code() == code, (broker.target, case, error)
                async with grpc.aio.secure_channel(f"127.0.0.1:{broker.admin_port}", tls(pki)) as channel:
                    stub: Any = admin_grpc.TopicAdminStub(channel)  # type: ignore[no-untyped-call]
                    error = await rpc_error(stub.CreateTopic(admin_pb.NewTopicRequest(name=topic),
                                                             metadata=metadata, timeout=10), case)
                    assert error.code() == code, (broker.target, case, error)
                    listed = await stub.ListNamespaceTopics(admin_pb.NamespaceRequest(name="default"),
                                                            metadata=bearer(pki.token("admin")), timeout=10)
                    assert topic not in [t.name for t in listed.topics]
    try:
        run_async(scenario())
    except BaseException:
        print(cluster.logs())
        raise

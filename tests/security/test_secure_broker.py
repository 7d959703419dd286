"""A standalone broker with `mode = tls_jwt` (and one with mTLS), driven by the official client and by raw
gRPC calls: who gets in, who gets refused with which status, and that a refusal changes nothing."""

from __future__ import annotations

import asyncio
import ssl
import time
import urllib.error
import urllib.request
from typing import Any

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from danube import DanubeClientBuilder

from danube_fast.client import FastProducer
from danube_fast.client.credentials import Credentials
from danube_fast.proto import DanubeAdmin_pb2 as admin_pb
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc
from danube_fast.proto import SecurityAdmin_pb2 as sec_pb
from danube_fast.proto import SecurityAdmin_pb2_grpc as sec_grpc
from danube_fast.proto import SubscriptionAdmin_pb2 as subs_pb
from danube_fast.proto import SubscriptionAdmin_pb2_grpc as subs_grpc
from danube_fast.testing.broker import Broker
from tests.compat.compat_support import rpc_error, run_async
from tests.security.conftest import Pki

Untyped = Any  # the generated stubs are untyped code


def tls(pki: Pki, client: Any = None, ca: Any = None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=(ca or pki.ca).read_bytes(),
        private_key=client.key.read_bytes() if client else None,
        certificate_chain=client.cert.read_bytes() if client else None)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def producer_request(topic: str, name: str = "p") -> pb.ProducerRequest:
    return pb.ProducerRequest(request_id=1, producer_name=name, topic_name=topic,
                              producer_access_mode=pb.Shared)


async def create_producer(broker: Broker, pki: Pki, topic: str, metadata: Any = (),
                          credentials: grpc.ChannelCredentials | None = None) -> Any:
    async with grpc.aio.secure_channel(broker.target, credentials or tls(pki)) as channel:
        stub: Untyped = pb_grpc.ProducerServiceStub(channel)  # type: ignore[no-untyped-call]
        return await stub.CreateProducer(producer_request(topic), metadata=metadata, timeout=10)


async def topics_of(broker: Broker, pki: Pki, namespace: str = "default") -> list[str]:
    async with grpc.aio.secure_channel(f"127.0.0.1:{broker.admin_port}", tls(pki)) as channel:
        stub: Untyped = admin_grpc.TopicAdminStub(channel)  # type: ignore[no-untyped-call]
        answer = await stub.ListNamespaceTopics(admin_pb.NamespaceRequest(name=namespace),
                                                metadata=bearer(pki.token("admin")), timeout=10)
        return sorted(t.name for t in answer.topics)


async def security_admin(broker: Broker, pki: Pki, method: str, request: Any, who: str = "admin") -> Any:
    async with grpc.aio.secure_channel(f"127.0.0.1:{broker.admin_port}", tls(pki)) as channel:
        stub: Untyped = sec_grpc.SecurityAdminStub(channel)  # type: ignore[no-untyped-call]
        return await getattr(stub, method)(request, metadata=bearer(pki.token(who)), timeout=10)


async def health_error(broker: Broker, pki: Pki, token: str) -> grpc.aio.AioRpcError | None:
    """A HealthCheck with `token` on the client port (open to any authenticated principal): the error it
    ends with, None when the broker answered."""
    async with grpc.aio.secure_channel(broker.target, tls(pki)) as channel:
        stub: Untyped = pb_grpc.HealthCheckStub(channel)  # type: ignore[no-untyped-call]
        try:
            await stub.HealthCheck(pb.HealthCheckRequest(request_id=1), metadata=bearer(token), timeout=5)
        except grpc.aio.AioRpcError as e:
            return e
    return None


async def seconds_until_refused(broker: Broker, pki: Pki, token: str, since: float,
                                limit: float = 5.0) -> tuple[float, grpc.aio.AioRpcError]:
    """Seconds from `since` (time.monotonic()) until `broker` refuses `token`, calling every 20 ms for at most
    `limit` s, and the refusal."""
    while time.monotonic() - since < limit:
        error = await health_error(broker, pki, token)
        if error is not None:
            return time.monotonic() - since, error
        await asyncio.sleep(0.02)
    raise AssertionError(f"{broker.target} still accepts the token {limit} s after it was revoked")


# -- the official client --------------------------------------------------------------------------------


def test_the_official_client_produces_and_consumes_over_tls_with_a_token(jwt_broker: Broker,
                                                                        pki: Pki) -> None:
    async def scenario() -> None:
        client = await (DanubeClientBuilder().service_url(f"https://{jwt_broker.target}")
                        .with_tls(str(pki.ca)).with_token(pki.token("admin")).build())
        producer = client.new_producer().with_topic("/default/secured").with_name("p1").build()
        await producer.create()
        consumer = (client.new_consumer().with_topic("/default/secured").with_consumer_name("c1")
                    .with_subscription("s1").build())
        await consumer.subscribe()
        receiving = await consumer.receive()
        for i in range(5):
            await producer.send(f"m{i}".encode(), None)
        got = []
        while len(got) < 5:
            message = await receiving.get()
            got.append(message.payload)
            await consumer.ack(message)
        assert got == [f"m{i}".encode() for i in range(5)]
        await consumer.close()
        await producer.close()
    run_async(scenario())


def test_the_official_client_with_mtls(mtls_broker: Broker, pki: Pki) -> None:
    async def scenario() -> None:
        client = await (DanubeClientBuilder().service_url(f"https://{mtls_broker.target}")
                        .with_mtls(str(pki.ca), str(pki.alice.cert), str(pki.alice.key)).build())
        producer = client.new_producer().with_topic("/default/mtls").with_name("p1").build()
        await producer.create()
        assert await producer.send(b"hello", None) >= 0
        await producer.close()
    run_async(scenario())


# -- refused: authentication ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["no token", "malformed", "not bearer", "alg none", "expired", "nbf ahead",
                                  "wrong issuer", "wrong audience", "wrong secret", "no exp", "cert sub",
                                  "spoofed internal header"])
def test_bad_credentials_are_unauthenticated_and_change_nothing(jwt_broker: Broker, pki: Pki,
                                                                case: str) -> None:
    tokens = {
        "malformed": "not.a.jwt",
        "alg none": jwt.encode({"sub": "admin", "iss": "danube-test", "aud": "danube",
                                "exp": int(time.time()) + 600}, None, algorithm="none"),
        "expired": pki.token("admin", ttl=-120),
        "nbf ahead": pki.token("admin", nbf=int(time.time()) + 3600),
        "wrong issuer": pki.token("admin", iss="someone-else"),
        "wrong audience": pki.token("admin", aud="another-service"),
        "wrong secret": pki.token("admin", key=b"x" * 64),
        "no exp": pki.token("admin", exp=None),
        "cert sub": pki.token("cert:alice"),
    }
    if case == "no token":
        metadata: Any = ()
    elif case == "not bearer":
        metadata = (("authorization", f"Basic {pki.token('admin')}"),)
    elif case == "spoofed internal header":
        metadata = (("x-danube-internal-broker", "1"), ("x-danube-fast-forwarded", "1"))
    else:
        metadata = bearer(tokens[case])
    topic = f"/default/refused-{case.replace(' ', '-')}"

    async def scenario() -> None:
        error = await rpc_error(create_producer(jwt_broker, pki, topic, metadata), case)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error
        assert topic not in await topics_of(jwt_broker, pki)
    run_async(scenario())


def test_a_plaintext_connection_to_a_tls_port_fails(jwt_broker: Broker) -> None:
    async def scenario() -> None:
        async with grpc.aio.insecure_channel(jwt_broker.target) as channel:
            stub: Untyped = pb_grpc.ProducerServiceStub(channel)  # type: ignore[no-untyped-call]
            error = await rpc_error(stub.CreateProducer(producer_request("/default/plain"), timeout=5),
                                    "plaintext")
            assert error.code() == grpc.StatusCode.UNAVAILABLE
    run_async(scenario())


def test_client_certificates_from_another_ca_or_none_are_refused_on_mtls(mtls_broker: Broker,
                                                                         pki: Pki) -> None:
    async def scenario() -> None:
        for credentials in (tls(pki, pki.mallory), tls(pki)):
            error = await rpc_error(create_producer(mtls_broker, pki, "/default/rogue", (), credentials),
                                    "mtls")
            assert error.code() == grpc.StatusCode.UNAVAILABLE  # the handshake fails
    run_async(scenario())


# -- refused: authorization, and RBAC ---------------------------------------------------------------------


def test_rbac_denies_by_default_and_bindings_apply_at_once(jwt_broker: Broker, pki: Pki) -> None:
    bob = bearer(pki.token("bob"))

    async def scenario() -> None:
        error = await rpc_error(create_producer(jwt_broker, pki, "/default/bobs", bob), "bob, no binding")
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "Produce" in (error.details() or "")
        assert "/default/bobs" not in await topics_of(jwt_broker, pki)
        # Only ManageCluster may administer security.
        error = await rpc_error(
            security_admin(jwt_broker, pki, "ListRoles", sec_pb.ListRolesRequest(), "bob"), "bob lists roles")
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED

        await security_admin(jwt_broker, pki, "PutRole", sec_pb.Role(name="writer",
                                                                     permissions=["Produce", "Lookup"]))
        await security_admin(jwt_broker, pki, "Bind", sec_pb.Binding(principal="bob", role="writer",
                                                                     scope="/default"))
        assert (await create_producer(jwt_broker, pki, "/default/bobs", bob)).producer_id > 0
        error = await rpc_error(create_producer(jwt_broker, pki, "/other/bobs", bob), "another namespace")
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED

        error = await rpc_error(
            security_admin(jwt_broker, pki, "DeleteRole", sec_pb.RoleRequest(name="writer")), "delete bound")
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        listed = await security_admin(jwt_broker, pki, "ListBindings",
                                      sec_pb.ListBindingsRequest(principal="bob"))
        assert [(b.role, b.scope) for b in listed.bindings] == [("writer", "/default")]

        await security_admin(jwt_broker, pki, "Unbind", sec_pb.Binding(principal="bob", role="writer",
                                                                       scope="/default"))
        error = await rpc_error(create_producer(jwt_broker, pki, "/default/bobs2", bob), "after unbind")
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    run_async(scenario())


def test_moving_a_subscription_or_browsing_needs_consume_and_describing_lookup(jwt_broker: Broker,
                                                                               pki: Pki) -> None:
    carol = bearer(pki.token("carol"))
    topic = "/default/carols"

    async def call(method: str, request: Any) -> grpc.aio.AioRpcError:
        async with grpc.aio.secure_channel(f"127.0.0.1:{jwt_broker.admin_port}", tls(pki)) as channel:
            stub: Untyped = subs_grpc.SubscriptionAdminStub(channel)  # type: ignore[no-untyped-call]
            return await rpc_error(getattr(stub, method)(request, metadata=carol, timeout=10), method)

    async def scenario() -> None:
        seek = subs_pb.SeekRequest(topic=topic, subscription="s", earliest=True)
        describe = subs_pb.DescribeRequest(topic=topic, subscription="s")
        await security_admin(jwt_broker, pki, "PutRole", sec_pb.Role(name="looker", permissions=["Lookup"]))
        await security_admin(jwt_broker, pki, "Bind", sec_pb.Binding(principal="carol", role="looker",
                                                                     scope="/default"))
        assert (await call("Describe", describe)).code() == grpc.StatusCode.NOT_FOUND  # allowed: no topic
        browse = subs_pb.BrowseRequest(topic=topic, latest=True, backward=True, count=10)
        for method, request in (("Seek", seek), ("Browse", browse)):
            error = await call(method, request)
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "Consume" in (error.details() or "")
        await security_admin(jwt_broker, pki, "PutRole", sec_pb.Role(name="eater", permissions=["Consume"]))
        await security_admin(jwt_broker, pki, "Bind", sec_pb.Binding(principal="carol", role="eater",
                                                                     scope=topic))
        assert (await call("Seek", seek)).code() == grpc.StatusCode.NOT_FOUND  # allowed now
        assert (await call("Browse", browse)).code() == grpc.StatusCode.NOT_FOUND
    run_async(scenario())


@pytest.mark.parametrize(("request_", "detail"), [
    (sec_pb.Role(name="r", permissions=["Fly"]), "unknown permissions"),
    (sec_pb.Role(name="a/b", permissions=["Lookup"]), "role name"),
    (sec_pb.Role(name="r", permissions=[]), "at least one"),
    (sec_pb.Binding(principal="x", role="nosuch", scope="cluster"), "no role"),
    (sec_pb.Binding(principal="x", role="r", scope="default"), "scope"),
])
def test_security_admin_refuses_bad_input_clearly(jwt_broker: Broker, pki: Pki, request_: Any,
                                                  detail: str) -> None:
    method = "PutRole" if isinstance(request_, sec_pb.Role) else "Bind"

    async def scenario() -> None:
        error = await rpc_error(security_admin(jwt_broker, pki, method, request_), method)
        assert error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
        assert detail in (error.details() or ""), error.details()
    run_async(scenario())


def test_our_fast_client_with_a_token(jwt_broker: Broker, pki: Pki) -> None:
    async def scenario() -> None:
        credentials = Credentials(ca_file=str(pki.ca), token=pki.token("admin"))
        producer = await FastProducer.connect(jwt_broker.target, "/default/fast-secured", "fp",
                                              credentials=credentials)
        ack = await (await producer.send_batch([b"a", b"b"]))
        assert ack is not None
        await producer.close()
        with pytest.raises(Exception, match="PERMISSION_DENIED"):
            await FastProducer.connect(jwt_broker.target, "/default/fast-secured", "fp2", reconnect_tries=0,
                                       credentials=Credentials(ca_file=str(pki.ca), token=pki.token("eve")))
    run_async(scenario())


# -- algorithm confusion, over the wire -----------------------------------------------------------------


def test_an_hs256_token_signed_with_the_rs256_public_key_is_refused(pki: Pki, tmp_path_factory: Any) -> None:
    """The classic confusion: the broker verifies RS256 with a public key; the attacker signs HS256 with that
    public key's bytes as the secret. The algorithm comes from the config, so it fails."""
    from tests.security.conftest import security_toml, started

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    directory = tmp_path_factory.mktemp("rs256")
    (directory / "jwt.pub").write_bytes(public)
    config = security_toml(pki, mode="tls").replace('mode = "tls"', 'mode = "tls_jwt"')
    config += (f'jwt_algorithms = ["RS256"]\njwt_public_key_file = "{directory / "jwt.pub"}"\n'
               'jwt_issuer = "danube-test"\njwt_audience = "danube"\n')
    for broker in started(directory / "broker", config):
        forged = _forge_hs256(public)
        good = jwt.encode({"sub": "admin", "iss": "danube-test", "aud": "danube",
                           "exp": int(time.time()) + 600}, key, algorithm="RS256")

        async def scenario(broker: Broker = broker, forged: str = forged, good: str = good) -> None:
            error = await rpc_error(create_producer(broker, pki, "/default/forged", bearer(forged)), "forged")
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED
            assert (await create_producer(broker, pki, "/default/genuine", bearer(good))).producer_id > 0
        run_async(scenario())


def _forge_hs256(secret: bytes) -> str:
    """An HS256 JWT made by hand (PyJWT refuses to use a PEM key as an HMAC secret, as it should)."""
    import base64
    import hashlib
    import hmac
    import json

    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"sub": "admin", "iss": "danube-test", "aud": "danube",
                           "exp": int(time.time()) + 600}).encode())
    signature = b64(hmac.new(secret, head + b"." + body, hashlib.sha256).digest())
    return (head + b"." + body + b"." + signature).decode()


# -- metrics ----------------------------------------------------------------------------------------------


def test_metrics_need_https_and_a_token(jwt_broker: Broker, pki: Pki) -> None:
    url = f"https://127.0.0.1:{jwt_broker.prom_port}/metrics"
    context = ssl.create_default_context(cafile=str(pki.ca))

    def get(token: str | None) -> int:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as answer:
                assert b"danube" in answer.read()
                return int(answer.status)
        except urllib.error.HTTPError as e:
            return e.code

    assert get(None) == 401
    assert get(pki.token("nobody")) == 403
    assert get(pki.token("admin")) == 200
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # the TLS port takes no plain HTTP
        urllib.request.urlopen(f"http://127.0.0.1:{jwt_broker.prom_port}/metrics", timeout=5)


def test_metrics_on_mtls_need_a_certificate_whose_principal_has_lookup(mtls_broker: Broker, pki: Pki) -> None:
    """mode tls with verify_client and no tokens: the certificate the handshake verified names the principal,
    which RBAC checks as in tls_jwt (cert:alice is a super admin, cert:bob has no role)."""
    url = f"https://127.0.0.1:{mtls_broker.prom_port}/metrics"

    def get(who: Any) -> int:
        context = ssl.create_default_context(cafile=str(pki.ca))
        context.load_cert_chain(str(who.cert), str(who.key))
        try:
            with urllib.request.urlopen(url, context=context, timeout=10) as answer:
                assert b"danube" in answer.read()
                return int(answer.status)
        except urllib.error.HTTPError as e:
            assert b"cert:bob may not read metrics" in e.read()
            return e.code

    assert get(pki.alice) == 200
    assert get(pki.bob) == 403


def test_our_clients_ask_a_token_supplier_on_every_call(jwt_broker: Broker, pki: Pki) -> None:
    """A supplier is asked per call: a token refreshed while the client runs is used from the next call on."""
    from danube_fast.client.reader import TopicReader

    current = [pki.token("admin")]
    asked = []

    def supplier() -> str:
        asked.append(current[0])
        return current[0]

    async def scenario() -> None:
        credentials = Credentials(ca_file=str(pki.ca), token_supplier=supplier)
        producer = await FastProducer.connect(jwt_broker.target, "/default/supplied", "sp",
                                              credentials=credentials)
        await (await producer.send_batch([b"x"]))
        await producer.close()
        async with TopicReader(jwt_broker.target, credentials=credentials, retries=0) as reader:
            assert (await reader.offsets("/default/supplied"))[1] == 1
            current[0] = pki.token("stranger")  # refreshed to a principal without the permission
            with pytest.raises(Exception, match="PERMISSION_DENIED"):
                await reader.offsets("/default/supplied")
        assert len(set(asked)) == 2
    run_async(scenario())

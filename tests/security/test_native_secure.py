"""The native transport on a secured broker (docs/TRANSPORT.md, "Serving it"): TLS as on the gRPC ports, the
principal from HELLO's token or the client certificate, and the gRPC fast API's RBAC rules for opening a
producer and subscribing. The clients run on uvloop, as ours do: Python 3.11's own loop leaves the socket of
a connection whose TLS handshake the broker refused unclosed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from danube_fast.client.credentials import Credentials
from danube_fast.client.native import NativeConnection, NativeConsumer, NativeProducer
from danube_fast.client.producer import ProduceRejected
from danube_fast.codec import frames as codec
from danube_fast.testing.broker import Broker
from tests.security.conftest import Pki, security_toml, started


@pytest.fixture(scope="module")
def jwt_native(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    yield from started(tmp_path_factory.mktemp("jwt-native"), security_toml(pki), native=True)


@pytest.fixture(scope="module")
def mtls_native(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    yield from started(tmp_path_factory.mktemp("mtls-native"),
                       security_toml(pki, mode="tls", verify_client=True, super_admins=("cert:alice",)),
                       native=True)


async def round_trip(broker: Broker, credentials: Credentials, topic: str) -> list[bytes]:
    conn = await NativeConnection.connect(broker.fast_target, credentials=credentials)
    try:
        producer = await NativeProducer.open(conn, topic, "p")
        assert await (await producer.send_batch([b"one", b"two"])) == (0, 1)
        consumer = await NativeConsumer.subscribe(conn, topic, "s", "c", earliest=True)
        data, _, last = await asyncio.wait_for(anext(consumer), 10)
        consumer.ack(up_to=last)
        return [bytes(r.payload) for r in codec.iter_records(data, verify=True)]
    finally:
        await conn.aclose()


def test_a_token_over_tls_produces_and_consumes(jwt_native: Broker, pki: Pki) -> None:
    got = uvloop.run(round_trip(jwt_native, Credentials(ca_file=str(pki.ca), token=pki.token("admin")),
                                 "/default/native-jwt"))
    assert got == [b"one", b"two"]


@pytest.mark.parametrize("token, message", [
    (None, "authentication required"),
    ("expired", "authentication failed"),
    ("wrong secret", "authentication failed"),
])
def test_no_token_or_a_bad_one_is_unauthenticated_at_hello(jwt_native: Broker, pki: Pki, token: str | None,
                                                           message: str) -> None:
    tokens: dict[str | None, str | None] = {None: None, "expired": pki.token("admin", ttl=-120),
                                            "wrong secret": pki.token("admin", key=b"x" * 64)}

    async def run() -> None:
        with pytest.raises(ProduceRejected, match=f"UNAUTHENTICATED: {message}"):
            await NativeConnection.connect(jwt_native.fast_target,
                                           credentials=Credentials(ca_file=str(pki.ca), token=tokens[token]))

    uvloop.run(run())


def test_a_principal_without_the_permission_is_denied_per_request(jwt_native: Broker, pki: Pki) -> None:
    async def run() -> None:
        eve = Credentials(ca_file=str(pki.ca), token=pki.token("eve"))
        conn = await NativeConnection.connect(jwt_native.fast_target, credentials=eve)
        with pytest.raises(ProduceRejected, match="PERMISSION_DENIED: eve may not"):
            await NativeProducer.open(conn, "/default/native-denied", "p")
        with pytest.raises(ProduceRejected, match="PERMISSION_DENIED: eve may not"):
            await NativeConsumer.subscribe(conn, "/default/native-denied", "s", "c")
        await conn.aclose()

    uvloop.run(run())


def test_plaintext_to_the_tls_listener_is_refused(jwt_native: Broker) -> None:
    async def run() -> None:
        with pytest.raises((ProduceRejected, ConnectionError, asyncio.TimeoutError)):
            await NativeConnection.connect(jwt_native.fast_target, timeout=15)

    uvloop.run(run())


def test_mtls_takes_the_certificate_as_the_principal_and_refuses_none(mtls_native: Broker, pki: Pki) -> None:
    alice = Credentials(ca_file=str(pki.ca), cert_file=str(pki.alice.cert), key_file=str(pki.alice.key))
    assert uvloop.run(round_trip(mtls_native, alice, "/default/native-mtls")) == [b"one", b"two"]
    bob = Credentials(ca_file=str(pki.ca), cert_file=str(pki.bob.cert), key_file=str(pki.bob.key))

    async def denied() -> None:
        conn = await NativeConnection.connect(mtls_native.fast_target, credentials=bob)
        with pytest.raises(ProduceRejected, match="PERMISSION_DENIED: cert:bob may not"):
            await NativeProducer.open(conn, "/default/native-mtls", "p")
        await conn.aclose()

    async def anonymous() -> Any:
        return await NativeConnection.connect(mtls_native.fast_target,
                                              credentials=Credentials(ca_file=str(pki.ca)), timeout=15)

    uvloop.run(denied())
    with pytest.raises((ProduceRejected, ConnectionError, OSError, asyncio.TimeoutError)):
        uvloop.run(anonymous())


def test_a_principal_over_its_connection_cap_is_refused_and_others_are_not(pki: Pki, tmp_path: Path) -> None:
    config = security_toml(pki, extra="[broker]\nfast_max_connections_per_principal = 2\n")

    async def run(broker: Broker) -> None:
        def as_(name: str) -> Credentials:
            return Credentials(ca_file=str(pki.ca), token=pki.token(name))

        first = [await NativeConnection.connect(broker.fast_target, credentials=as_("admin"))
                 for _ in range(2)]
        with pytest.raises(ProduceRejected, match="RESOURCE_EXHAUSTED: admin has 2 native connections"):
            await NativeConnection.connect(broker.fast_target, credentials=as_("admin"))
        other = await NativeConnection.connect(broker.fast_target, credentials=as_("eve"))  # not eve's cap
        await first[0].aclose()
        for _ in range(100):  # room again once the broker has seen the close
            try:
                again = await NativeConnection.connect(broker.fast_target, credentials=as_("admin"))
                break
            except ProduceRejected as e:
                assert e.grpc_code == "RESOURCE_EXHAUSTED", e
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("the closed connection still counted")
        producer = await NativeProducer.open(again, "/default/native-capped", "p")
        assert await (await producer.send_batch([b"x"])) == (0, 0)
        for conn in (first[1], other, again):
            await conn.aclose()

    for broker in started(tmp_path / "capped", config, native=True):
        uvloop.run(run(broker))

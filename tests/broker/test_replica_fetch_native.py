"""A follower's fetch over the native transport (replication/fetch_client.py, transport/replica_frames.py;
docs/TRANSPORT.md, "Replication") where nothing is replicated: each refusal comes back as the status the
gRPC Fetch gives, and a malformed request fails itself, not the connection. The fetch of records itself
runs in tests/cluster/test_cluster_replication.py, on real clusters."""

from __future__ import annotations

import asyncio

import pytest

from danube_fast.broker.cluster.replication.fetch_client import OwnerFetch
from danube_fast.broker.services.forward import Forwarder
from danube_fast.client.native import NativeConnection
from danube_fast.errors import ApiError
from danube_fast.meta.resources import BrokerRegistration
from danube_fast.proto import Replication_pb2 as pb
from danube_fast.testing.broker import Broker, BrokerFactory
from danube_fast.testing.ports import free_ports
from danube_fast.transport import replica_frames
from danube_fast.transport.frames import FrameError, FrameType


def registration(fast_addr: str, admin_port: int) -> BrokerRegistration:
    return BrokerRegistration(admin_addr=f"http://127.0.0.1:{admin_port}", advertised_addr="", broker_addr="",
                              prom_exporter="", fast_addr=fast_addr)


REQUEST = pb.FetchRequest(topic="/default/t", follower_id=7, epoch=3, from_offset=-1, max_bytes=1 << 20,
                          wait_ms=0, durable_offset=-1)


def test_a_broker_that_replicates_nothing_refuses_a_fetch_as_the_grpc_fetch_would(
        broker_factory: BrokerFactory) -> None:
    broker: Broker = broker_factory.start(native=True)

    async def main() -> None:
        owners = OwnerFetch(Forwarder(), None)
        try:
            with pytest.raises(ApiError) as refused:
                await owners.fetch(registration(broker.fast_target, broker.admin_port), REQUEST)
            assert refused.value.grpc_code == "FAILED_PRECONDITION"
            assert "replicates no topic (not in a cluster)" in str(refused.value)
            # Over gRPC the standalone broker serves no Replication service at all.
            with pytest.raises(ApiError) as unserved:
                await owners.fetch(registration("", broker.admin_port), REQUEST)
            assert unserved.value.grpc_code == "UNIMPLEMENTED"
            # Nothing listens there: UNAVAILABLE, which makes the follower probe the owner.
            [port] = free_ports(1)
            with pytest.raises(ApiError) as away:
                await owners.fetch(registration(f"127.0.0.1:{port}", broker.admin_port), REQUEST)
            assert away.value.grpc_code == "UNAVAILABLE"
        finally:
            await owners.close()

    asyncio.run(main())


def test_a_malformed_fetch_fails_itself_and_the_connection_goes_on(broker_factory: BrokerFactory) -> None:
    broker: Broker = broker_factory.start(native=True)

    async def main() -> None:
        conn = await NativeConnection.connect(broker.fast_target)
        try:
            short = replica_frames.ReplicaFetch("/default/t", 7, 3, -1, 0, 0, -1).encode()[:-3]
            answer = await conn.send(FrameType.REPLICA_FETCH, [short], len(short))
            assert answer.type == FrameType.ERROR
            assert b"REPLICA_FETCH: durable_offset needs 8 bytes" in bytes(answer.body)
            body = replica_frames.ReplicaFetch("/default/t", 7, 3, -1, 0, 0, -1).encode()
            answer = await conn.send(FrameType.REPLICA_FETCH, [body], len(body))
            assert answer.type == FrameType.ERROR and b"replicates no topic" in bytes(answer.body)
        finally:
            await conn.aclose()

    asyncio.run(main())


def test_replica_frames_carry_negative_offsets_and_the_batches_after_the_fields() -> None:
    fetch = replica_frames.ReplicaFetch("/ns/t-part-2", 1 << 63, 5, -1, 4 << 20, 1000, -1)
    assert replica_frames.ReplicaFetch.decode(fetch.encode()) == fetch
    body = replica_frames.data_fields(120, 100, -1, True) + b"batches"
    data = replica_frames.ReplicaData.decode(body)
    assert (data.next_offset, data.start_offset, data.uploaded_through, data.reset) == (120, 100, -1, True)
    assert bytes(data.data) == b"batches" and data.encode() == body
    bad = bytearray(body)
    bad[replica_frames.DATA_FIELDS - 1] = 2
    with pytest.raises(FrameError, match="reset is 2"):
        replica_frames.ReplicaData.decode(bytes(bad))

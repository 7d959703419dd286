"""How a follower asks a topic's owner for records (docs/REPLICATION.md, "Fetches"): over the owner's
native transport where it registered one (`fast_addr`; transport/replica_frames.py), else the Replication
service's Fetch over gRPC on its admin port.

Over frames the owner writes the records from its log's buffers to the socket and the follower appends
them from the buffer the kernel read the frame into; over gRPC the owner joins them into one message and
grpcio copies it once more each way (what that costs: docs/REPLICATION.md, "Fetches").

Either way a refusal is an ApiError with the owner's status, and an owner out of reach (refused, reset, no
answer within `timeout`) is UNAVAILABLE, as Forwarder.call says it. One connection per owner, shared by
every topic copied from it; one that failed is dropped and made again at the next fetch.

Owner: the event loop (the follower's copy tasks).
"""

from __future__ import annotations

import asyncio
import contextlib

from danube_fast.broker.services.forward import CALL_TIMEOUT, Forwarder
from danube_fast.client.credentials import Credentials
from danube_fast.client.native import NativeConnection, native_refusal
from danube_fast.client.status import ProduceRejected
from danube_fast.codec.replication_wire import FetchAnswer
from danube_fast.errors import ApiError
from danube_fast.meta.resources import BrokerRegistration
from danube_fast.proto import Replication_pb2 as pb
from danube_fast.security.config import SecurityConfig
from danube_fast.transport.frames import FrameError, FrameType
from danube_fast.transport.replica_frames import ReplicaData, ReplicaFetch


def broker_credentials(security: SecurityConfig) -> Credentials | None:
    """How this broker reaches another's native listener: as Forwarder reaches its admin port (TLS with
    the cluster's CA, and this broker's certificate where brokers' certificates are checked)."""
    if not security.tls:
        return None
    mtls = security.verify_client
    return Credentials(ca_file=security.ca_file or None, cert_file=security.cert_file if mtls else None,
                       key_file=security.key_file if mtls else None)


class OwnerFetch:
    def __init__(self, forwarder: Forwarder, credentials: Credentials | None,
                 timeout: float = CALL_TIMEOUT) -> None:
        self._forwarder = forwarder
        self._credentials = credentials
        self._timeout = timeout
        self._connections: dict[str, NativeConnection] = {}
        self._connecting: dict[str, asyncio.Lock] = {}

    async def fetch(self, owner: BrokerRegistration, request: pb.FetchRequest) -> FetchAnswer:
        if not owner.fast_addr:
            return await self._forwarder.call(owner.admin_addr, "Replication", "Fetch", request, FetchAnswer)
        address = owner.fast_addr
        conn = await self._connection(address)
        body = ReplicaFetch(request.topic, request.follower_id, request.epoch, request.from_offset,
                            request.max_bytes, request.wait_ms, request.durable_offset).encode()
        try:
            answer = conn.send(FrameType.REPLICA_FETCH, [body], len(body))
            frame = await asyncio.wait_for(answer, self._timeout)
        except ProduceRejected as e:
            if e.retriable:
                self._drop(address, conn)
            raise ApiError(e.grpc_code, f"fetching {request.topic} from {address}: {e}") from e
        except TimeoutError:
            self._drop(address, conn)
            raise ApiError("UNAVAILABLE", f"the broker at {address} did not answer a fetch of "
                                          f"{request.topic} within {self._timeout:g} s") from None
        if frame.type != FrameType.REPLICA_DATA:
            refusal = native_refusal(frame, "REPLICA_FETCH")
            raise ApiError(refusal.grpc_code, f"fetching {request.topic} from {address}: {refusal}")
        try:
            data = ReplicaData.decode(frame.body)
        except FrameError as e:
            self._drop(address, conn)
            raise ApiError("INTERNAL", f"the broker at {address} answered a fetch with a bad frame: "
                                       f"{e}") from e
        return FetchAnswer(data.data, data.next_offset, data.start_offset, data.uploaded_through, data.reset)

    async def _connection(self, address: str) -> NativeConnection:
        lock = self._connecting.setdefault(address, asyncio.Lock())
        async with lock:  # the copies fetching from one owner share one connection
            conn = self._connections.get(address)
            if conn is None:
                try:
                    conn = await NativeConnection.open(address, self._credentials)
                except ProduceRejected as e:
                    raise ApiError(e.grpc_code, str(e)) from e
                self._connections[address] = conn
            return conn

    def _drop(self, address: str, conn: NativeConnection) -> None:
        if self._connections.get(address) is conn:
            del self._connections[address]
        conn.close()

    async def close(self) -> None:
        connections = list(self._connections.values())
        self._connections.clear()
        for conn in connections:
            with contextlib.suppress(Exception):
                await conn.aclose()

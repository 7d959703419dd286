"""Admin calls answered by another broker: a topic's owner (DeleteTopic, Unsubscribe, ListSubscriptions,
TableAdmin's Status) or the leader (TriggerRebalance). The call is made again, unchanged, on that broker's
registered `admin_addr`, and its answer (or its status) is returned as if it were this broker's.

A forwarded call carries the `x-danube-fast-forwarded` header and is never forwarded again: a broker whose
view is stale answers it from what it holds instead of sending it on, so two brokers that disagree about an
owner cannot pass a call back and forth.

Owner: the event loop; one channel per address, kept until `close()`.
"""

from __future__ import annotations

import grpc

from danube_fast.broker.services.status import Context
from danube_fast.client.rpc import M, WireMessage, dial_target, method_path
from danube_fast.errors import ApiError

FORWARDED = "x-danube-fast-forwarded"
CALL_TIMEOUT = 10.0  # seconds, when the caller set no deadline
# Answers up to a replication fetch's 8 MiB of records and its framing (gRPC's own default is 4 MiB).
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
_UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def is_forwarded(context: Context) -> bool:
    return any(key == FORWARDED for key, _ in context.invocation_metadata() or ())


class Forwarder:
    """`credentials`: TLS to the other brokers (with this broker's certificate on mTLS), None for plaintext.
    The caller's `authorization` header goes along, so the owner checks the same principal again."""

    def __init__(self, timeout: float = CALL_TIMEOUT,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        self._timeout = timeout
        self._credentials = credentials
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def call(self, admin_addr: str, service: str, method: str, request: WireMessage, reply: type[M],
                   context: Context | None = None) -> M:
        """`request` to `service.method` of the broker at `admin_addr`, within the caller's deadline (else
        the forwarder's timeout). The callee's error status comes back as an ApiError of the same code; a
        broker that cannot be reached is UNAVAILABLE, naming its address."""
        target = dial_target(admin_addr)
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = (
                grpc.aio.secure_channel(target, self._credentials, CHANNEL_OPTIONS)
                if self._credentials is not None else grpc.aio.insecure_channel(target, CHANNEL_OPTIONS))
        stub = channel.unary_unary(method_path(service, method),
                                   request_serializer=type(request).SerializeToString,
                                   response_deserializer=reply.FromString)
        remaining = context.time_remaining() if context is not None else None
        metadata = [(FORWARDED, "1")]
        if context is not None:
            metadata += [(k, v) for k, v in context.invocation_metadata() or () if k == "authorization"]
        try:
            answer: M = await stub(request, timeout=remaining if remaining is not None else self._timeout,
                                   metadata=tuple(metadata))
        except grpc.aio.AioRpcError as e:
            if e.code() in _UNREACHABLE:
                raise ApiError("UNAVAILABLE", f"{method}: the broker at {target} cannot be reached "
                                              f"({e.code().name}: {e.details()})") from e
            raise ApiError(e.code().name, e.details() or e.code().name) from e
        return answer

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()

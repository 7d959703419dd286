"""The console's calls to the admin API, made as the signed-in user (docs/CONSOLE.md, "Security").

The console holds no permission of its own: every page's data comes from the broker's own admin port over
loopback, each call carrying the user's token, so the gate and the RBAC rules that judge the CLI judge the
console too (and a cluster's forwarding to owners and the leader works unchanged). The channel is shared
by every session; the token travels per call.
"""

from __future__ import annotations

import grpc

from danube_fast.client.rpc import M, WireMessage, method_path
from danube_fast.errors import ApiError

CALL_TIMEOUT = 10.0


class AdminCalls:
    def __init__(self, channel: grpc.aio.Channel, timeout: float = CALL_TIMEOUT) -> None:
        self._channel = channel
        self._timeout = timeout

    async def call(self, service: str, method: str, request: WireMessage, reply: type[M],
                   token: str | None) -> M:
        """`service.method(request)` as the holder of `token`; the broker's refusal as an ApiError with
        its status code and message."""
        stub = self._channel.unary_unary(method_path(service, method),
                                         request_serializer=type(request).SerializeToString,
                                         response_deserializer=reply.FromString)
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        try:
            answer: M = await stub(request, timeout=self._timeout, metadata=metadata)
        except grpc.aio.AioRpcError as e:
            raise ApiError(e.code().name, e.details() or e.code().name) from e
        return answer

    async def close(self) -> None:
        await self._channel.close()

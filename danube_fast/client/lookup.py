"""Where a topic is served: Discovery.TopicLookup, as the official client uses it (CONTRACT B.3, C.3).

Connect and Redirect both name the broker to talk to; NOT_FOUND (unknown, or not yet assigned) and an
unreachable broker leave the caller where it was.
"""

from __future__ import annotations

from typing import Any

import grpc

from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc

LOOKUP_TIMEOUT = 5.0  # seconds


async def lookup(channel: grpc.aio.Channel, topic: str) -> str | None:
    """host:port of the broker serving `topic`, asked through `channel`; None when the answer says nothing."""
    stub: Any = pb_grpc.DiscoveryStub(channel)  # type: ignore[no-untyped-call]
    try:
        response = await stub.TopicLookup(pb.TopicLookupRequest(topic=topic), timeout=LOOKUP_TIMEOUT)
    except grpc.aio.AioRpcError:
        return None
    if response.response_type == pb.TopicLookupResponse.Failed:
        return None
    url: str = response.broker_url or response.connect_url
    return url.removeprefix("http://").removeprefix("https://") or None

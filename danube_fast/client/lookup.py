"""Where a topic is served: Discovery.TopicLookup, as the official client uses it (docs/WIRE.md B.3, C.3).

Connect and Redirect both name the broker to talk to; NOT_FOUND (unknown, or not yet assigned) and an
unreachable broker leave the caller where it was.
"""

from __future__ import annotations

from typing import Any

import grpc

from danube_fast.client.credentials import Credentials, open_channel
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc

LOOKUP_TIMEOUT = 5.0  # seconds
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 64 * 1024 * 1024),
                   ("grpc.max_receive_message_length", 64 * 1024 * 1024)]


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


async def follow(channel: grpc.aio.Channel, target: str, topic: str, credentials: Credentials | None = None,
                 bootstrap: str | None = None) -> tuple[grpc.aio.Channel, str]:
    """(channel, target) for the broker serving `topic`: the ones given when the lookup names `target` or
    says nothing, else a new channel to the broker it names (the old channel is closed). When the broker at
    `target` says nothing (it may be gone for good: a machine lost) the lookup is asked of `bootstrap`, the
    address the client was opened with, too."""
    found = await lookup(channel, topic)
    if found is None and bootstrap is not None and bootstrap != target:
        asked = open_channel(bootstrap, CHANNEL_OPTIONS, credentials)
        try:
            found = await lookup(asked, topic)
        finally:
            await asked.close()
    if found is None or found == target:
        return channel, target
    new = open_channel(found, CHANNEL_OPTIONS, credentials)
    await channel.close()
    return new, found

"""danube.Discovery and danube.HealthCheck (docs/WIRE.md B.3, B.10, C.3, C.11)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from danube_fast.broker.context import BrokerContext
from danube_fast.broker.services.status import Context, unary
from danube_fast.errors import invalid, not_found
from danube_fast.meta.resources_cluster import BrokerRegistration
from danube_fast.names import TopicName, parse_topic
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc

LOOKUP_POLL = 0.02  # seconds between looks at a topic that has no owner right now


async def locate(ctx: BrokerContext, name: TopicName) -> BrokerRegistration | None:
    """Where `name` is served: None for this broker, else its owner's registration; NOT_FOUND when it is
    unknown. A topic that exists but has no owner right now (it is being placed or moved) is waited for, up
    to `assign_wait_ms`, before NOT_FOUND: the official client gives up a send whose lookup fails after its
    retries (docs/WIRE.md B.5), and a move outlasting those 1.5-3 s would otherwise surface as an error to
    the application. Both transports' lookups answer from this (TopicLookup, the native LOOKUP)."""
    placement = ctx.placement
    waited = 0.0
    while True:
        if ctx.topics.find(name.full) is not None:
            return None
        owner = placement.owner(name)
        registration = placement.registration(owner) if owner is not None and owner != ctx.broker_id else None
        if registration is not None:
            return registration
        if waited >= placement.assign_wait or not ctx.topics.exists(name):
            ctx.topics.check_loadable(name)
            raise not_found(f"Unable to find the requested topic: {name}")
        await asyncio.sleep(LOOKUP_POLL)  # being placed, moved, or loaded here: look again
        waited += LOOKUP_POLL


class DiscoveryService(pb_grpc.DiscoveryServicer):
    def __init__(self, ctx: BrokerContext, url: Callable[[], str]) -> None:
        self._ctx = ctx
        self._topics = ctx.topics
        self._url = url  # dialable by the client: http://host:port (D.2)

    @unary
    async def TopicLookup(self, request: pb.TopicLookupRequest, context: Context) -> pb.TopicLookupResponse:
        """Connect when the topic is served here, Redirect to its owner's registered URL when another broker
        serves it, NOT_FOUND when it is unknown (C.3)."""
        owner = await locate(self._ctx, parse_topic(request.topic))
        if owner is None:
            return self._answer(request, pb.TopicLookupResponse.Connect, self._url())
        return self._answer(request, pb.TopicLookupResponse.Redirect, owner.broker_addr)

    @staticmethod
    def _answer(request: pb.TopicLookupRequest, kind: pb.TopicLookupResponse.LookupType,
                url: str) -> pb.TopicLookupResponse:
        return pb.TopicLookupResponse(request_id=request.request_id, response_type=kind,
                                      connect_url=url, broker_url=url, proxy=False)

    @unary
    async def TopicPartitions(self, request: pb.TopicLookupRequest, context: Context
                              ) -> pb.TopicPartitionsResponse:
        name = parse_topic(request.topic)
        return pb.TopicPartitionsResponse(request_id=request.request_id,
                                          partitions=self._topics.partitions(name))


class HealthService(pb_grpc.HealthCheckServicer):
    """Unknown ids answer CLOSE, never an error: an error silently ends the client's health loop (D.10)."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self._topics = ctx.topics

    @unary
    async def HealthCheck(self, request: pb.HealthCheckRequest, context: Context) -> pb.HealthCheckResponse:
        ok = pb.HealthCheckResponse.OK
        close = pb.HealthCheckResponse.CLOSE
        if request.client == pb.HealthCheckRequest.Producer:
            known = self._ctx.clients.has_producer(request.id)
            return pb.HealthCheckResponse(status=ok if known else close)
        if request.client == pb.HealthCheckRequest.Consumer:
            c = self._ctx.clients.find_consumer(request.id)
            if c is not None and c.active:
                return pb.HealthCheckResponse(status=ok)
            self._ctx.clients.told_close(request.id)
            return pb.HealthCheckResponse(status=close)
        raise invalid(f"Invalid client type {request.client} (0 Producer, 1 Consumer)")

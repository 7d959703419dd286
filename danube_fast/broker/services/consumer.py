"""danube.ConsumerService: Subscribe, ReceiveMessages, Ack, Nack (docs/WIRE.md B.7-B.9, C.7-C.10).

Subscribe reads one request header of ours, INITIAL_POSITION (earliest, latest or an offset): where
a subscription it creates starts (docs/SUBSCRIPTIONS.md). The official client never sends it, so its wire is
unchanged; our CLI's `consume --subscription S --from earliest` does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from danube_fast import latency
from danube_fast.broker.context import BrokerContext
from danube_fast.broker.services.status import Context, unary
from danube_fast.broker.subscription import Subscription
from danube_fast.client.headers import INITIAL_POSITION
from danube_fast.errors import ApiError, invalid, not_found
from danube_fast.names import clip, parse_topic
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc

HEALTH_WAIT = 6.0  # the client health-checks every 5 s
UNKNOWN_DELAY = 0.25


def _text(value: str | bytes | None) -> str | None:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _internal(message: str) -> ApiError:
    return ApiError("INTERNAL", message)


class ConsumerService(pb_grpc.ConsumerServiceServicer):
    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self._topics = ctx.topics

    @unary
    async def Subscribe(self, request: pb.ConsumerRequest, context: Context) -> pb.ConsumerResponse:
        topic = self._topics.topic_for_consumer(parse_topic(request.topic_name))
        position = next((v for k, v in context.invocation_metadata() or () if k == INITIAL_POSITION), None)
        cid = await self._ctx.subscriptions.subscribe(topic, request, _text(position))
        return pb.ConsumerResponse(request_id=request.request_id, consumer_id=cid,
                                   consumer_name=request.consumer_name)

    async def ReceiveMessages(self, request: pb.ReceiveRequest, context: Context
                              ) -> AsyncIterator[pb.StreamMessage]:
        """Stream until the consumer is taken over by a newer stream or removed; then end with OK (C.8).

        The official client reopens a stream at once, without backoff, whether it ended or failed, and only
        resubscribes once a health check said CLOSE (B.8). So a stream for a consumer that was removed waits
        until the client has been told CLOSE (or HEALTH_WAIT) and then ends with OK, instead of failing
        thousands of times a second; an id never seen (e.g. from before a restart) gets NOT_FOUND (C.8),
        slowed down by UNKNOWN_DELAY for the same reason."""
        consumer = self._ctx.clients.find_consumer(request.consumer_id)
        if consumer is None:
            told_close = self._ctx.clients.gone(request.consumer_id)
            if told_close is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(told_close.wait(), HEALTH_WAIT)
                return
            await asyncio.sleep(UNKNOWN_DELAY)
            error = not_found(f"The consumer with the id {request.consumer_id} does not exist")
            await context.abort(grpc.StatusCode[error.grpc_code], str(error))
            return
        sub = consumer.subscription
        replacing = consumer.streaming
        token = consumer.attach()
        if replacing:
            sub.stream_replaced(consumer)
        sub.stream_started(consumer)
        try:
            while True:
                batch = await consumer.take(token)
                if not batch:
                    return
                latency.observe_age(latency.DELIVERY_DANUBE, batch[0].publish_time)
                for msg in batch:
                    yield msg
        finally:
            if consumer.detach(token):
                sub.stream_ended(consumer)

    def _subscription(self, msg_id: pb.MsgID, subscription: str, what: str) -> Subscription | None:
        """None for a topic this broker let go of (cluster mode): its new owner delivers the message again
        from the saved cursor (at least once), so the ack or nack is dropped instead of failing the client's
        call, which the official client raises to the application (docs/WIRE.md B.9)."""
        name = parse_topic(msg_id.topic_name)
        topic = self._topics.find(name.full)
        if topic is None and self._ctx.clients.moved(name.full):
            return None
        if topic is None:
            raise _internal(f"Error {what} message: Topic {name} not found on this broker")
        sub = topic.subscriptions.get(subscription)
        if sub is None:
            raise _internal(f"Error {what} message: Subscription {clip(subscription)!r} not found on {name}")
        return sub

    @unary
    async def Ack(self, request: pb.AckRequest, context: Context) -> pb.AckResponse:
        if not request.HasField("msg_id"):
            raise invalid("AckRequest has no msg_id: send back the msg_id of the message being acknowledged")
        sub = self._subscription(request.msg_id, request.subscription_name, "acknowledging")
        if sub is not None:
            sub.dispatcher.ack(request.msg_id.topic_offset)
        return pb.AckResponse(request_id=request.request_id)

    @unary
    async def Nack(self, request: pb.NackRequest, context: Context) -> pb.NackResponse:
        if not request.HasField("msg_id"):
            raise invalid("NackRequest has no msg_id: send back the msg_id of the message being rejected")
        sub = self._subscription(request.msg_id, request.subscription_name, "rejecting")
        delay = request.delay_ms if request.HasField("delay_ms") else None
        if sub is not None:
            sub.dispatcher.nack(request.msg_id.topic_offset, delay)
        return pb.NackResponse(request_id=request.request_id)

"""danube.ProducerService: CreateProducer and SendMessage (docs/WIRE.md B.4, B.5, C.5, C.6).

A producer's `schema_ref` gives its topic a schema subject (C.4 step 2, danube_fast.schema.topic_schema);
SendMessage runs the topic's schema gate, which exists only when the topic's validation can refuse something,
and checks a delayed record's time (danube_fast/deliver_at.py).
"""

from __future__ import annotations

import time

from danube_fast import deliver_at, latency
from danube_fast.broker.context import BrokerContext
from danube_fast.broker.services.status import Context, unary
from danube_fast.errors import denied, invalid, precondition
from danube_fast.meta.resources import DeliveryMode
from danube_fast.names import check_name, clip, parse_topic
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc
from danube_fast.schema import SubjectNotFound, TopicSchemas


class ProducerService(pb_grpc.ProducerServiceServicer):
    def __init__(self, ctx: BrokerContext, schemas: TopicSchemas) -> None:
        self._ctx = ctx
        self._topics = ctx.topics
        self._schemas = schemas

    @unary
    async def CreateProducer(self, request: pb.ProducerRequest, context: Context) -> pb.ProducerResponse:
        name = parse_topic(request.topic_name)
        check_name(request.producer_name, "ProducerRequest.producer_name")  # before the topic is created
        if request.dispatch_strategy not in (0, 1):
            raise invalid(f"unknown dispatch strategy {request.dispatch_strategy} "
                          "(0 NonReliable, 1 Reliable)")
        delivery = DeliveryMode.RELIABLE if request.dispatch_strategy == 1 else DeliveryMode.NON_RELIABLE
        subject = request.schema_ref.subject if request.HasField("schema_ref") else None
        if subject is not None and self._topics.find(name.full) is None \
                and await self._schemas.registry.subject_id(subject) is None:
            # Refused before auto-creation, so that a refused producer leaves no topic behind.
            raise self._unregistered(subject, name.full)
        topic = await self._topics.topic_for_producer(name, delivery)
        if subject is not None:
            try:
                await self._schemas.assign_subject(topic, subject)
            except SubjectNotFound as e:
                raise self._unregistered(subject, name.full) from e
        pid = await self._topics.add_producer(topic, request.producer_name, request.producer_access_mode)
        return pb.ProducerResponse(request_id=request.request_id, producer_id=pid,
                                   producer_name=request.producer_name)

    @unary
    async def SendMessage(self, request: pb.StreamMessage, context: Context) -> pb.MessageResponse:
        entry = self._ctx.clients.producer(request.msg_id.producer_id)
        topic = entry.topic
        if request.msg_id.topic_name != topic.full:
            raise denied(f"Unable to publish the message: producer {request.msg_id.producer_id} is "
                         f"attached to {topic.full}, not to {clip(request.msg_id.topic_name)!r}")
        limit = topic.policy.max_message_size
        if limit and len(request.payload) > limit:
            raise invalid(f"payload of {len(request.payload)} bytes exceeds the max_message_size policy of "
                          f"{topic.full} ({limit} bytes)")
        at = request.attributes.get(deliver_at.ATTRIBUTE)
        if at is not None:
            try:
                deliver_at.check(at, deliver_at.now_ms(), self._ctx.config.dispatch.max_delivery_delay_ms)
            except ValueError as e:
                raise invalid(f"Unable to publish the message to {topic.full}: {e}") from None
        gate = topic.schema_gate
        if gate is not None:
            await gate.check(request)
        started = time.perf_counter()
        await topic.publish(request)
        latency.PUBLISH_DANUBE.observe(time.perf_counter() - started)
        return pb.MessageResponse(request_id=request.request_id)

    @staticmethod
    def _unregistered(subject: str, topic: str) -> Exception:
        return precondition(f"Failed to assign schema subject '{clip(subject)}' to {topic}: the subject is "
                            "not registered in the schema registry")

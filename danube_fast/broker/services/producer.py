"""danube.ProducerService: CreateProducer and SendMessage (CONTRACT B.4, B.5, C.5, C.6)."""

from __future__ import annotations

from danube_fast.broker.errors import denied, invalid, precondition
from danube_fast.broker.names import parse_topic
from danube_fast.broker.services.status import Context, unary
from danube_fast.broker.topics import Topics
from danube_fast.meta.resources import DeliveryMode
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc


class ProducerService(pb_grpc.ProducerServiceServicer):
    def __init__(self, topics: Topics) -> None:
        self._topics = topics

    @unary
    async def CreateProducer(self, request: pb.ProducerRequest, context: Context) -> pb.ProducerResponse:
        name = parse_topic(request.topic_name)
        if not request.producer_name:
            raise invalid("ProducerRequest.producer_name is empty: name the producer")
        if request.dispatch_strategy not in (0, 1):
            raise invalid(f"unknown dispatch strategy {request.dispatch_strategy} "
                          "(0 NonReliable, 1 Reliable)")
        delivery = DeliveryMode.RELIABLE if request.dispatch_strategy == 1 else DeliveryMode.NON_RELIABLE
        if request.HasField("schema_ref"):
            # The schema registry is not served yet: no subject is registered, so none can be assigned
            # (CONTRACT C.4: an unregistered subject is FAILED_PRECONDITION).
            raise precondition(f"Failed to assign schema subject {request.schema_ref.subject!r} to "
                               f"{name}: the subject is not registered (this broker has no schema "
                               "registry yet)")
        topic = await self._topics.topic_for_producer(name, delivery)
        pid = await self._topics.add_producer(topic, request.producer_name, request.producer_access_mode)
        return pb.ProducerResponse(request_id=request.request_id, producer_id=pid,
                                   producer_name=request.producer_name)

    @unary
    async def SendMessage(self, request: pb.StreamMessage, context: Context) -> pb.MessageResponse:
        entry = self._topics.producer(request.msg_id.producer_id)
        topic = entry.topic
        if request.msg_id.topic_name != topic.full:
            raise denied(f"Unable to publish the message: producer {request.msg_id.producer_id} is "
                         f"attached to {topic.full}, not to {request.msg_id.topic_name!r}")
        limit = topic.policy.max_message_size
        if limit and len(request.payload) > limit:
            raise invalid(f"payload of {len(request.payload)} bytes exceeds the max_message_size policy of "
                          f"{topic.full} ({limit} bytes)")
        await topic.publish(request)
        return pb.MessageResponse(request_id=request.request_id)

"""danube_admin.NamespaceAdmin and danube_admin.TopicAdmin on the admin port (docs/WIRE.md A.4, C.14), for one
standalone broker, from its own topics. The cluster calls (BrokerAdmin, UnloadTopic, ListBrokerTopics) and the
answers about topics hosted anywhere in the cluster are in cluster/admin/service.py, which extends these.

Statuses follow v0.7.3 where the contract names them (creation and deletion failures are NOT_FOUND with the
cause in the message; DescribeTopic never fails), without its duplicates in ListSubscriptions (D.16).
A `schema_subject` on CreateTopic or CreatePartitionedTopic must be registered; each topic created then uses
it as a producer's `use_latest` schema reference would (C.14).
"""

from __future__ import annotations

import json

from danube_fast.broker.context import BrokerContext
from danube_fast.broker.services.status import Context, unary
from danube_fast.broker.topic import Topic
from danube_fast.errors import DanubeError, invalid, not_found
from danube_fast.meta.resources import DeliveryMode
from danube_fast.names import (
    TopicName,
    check_namespace,
    check_topic,
    clip,
    parse_topic,
    partition_base,
)
from danube_fast.proto import DanubeAdmin_pb2 as pb
from danube_fast.proto import DanubeAdmin_pb2_grpc as pb_grpc
from danube_fast.schema import TopicSchemas
from danube_fast.schema.topic_schema import SchemaTopic

MAX_PARTITIONS = 1024  # per partitioned topic: each partition is a topic with its own WAL


def namespace_name(name: str) -> str:
    return check_namespace(name)


def delivery_mode(value: int) -> DeliveryMode:
    return DeliveryMode.RELIABLE if value == 1 else DeliveryMode.NON_RELIABLE


class NamespaceAdmin(pb_grpc.NamespaceAdminServicer):
    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self._topics = ctx.topics

    @unary
    async def GetNamespaceTopics(self, request: pb.NamespaceRequest, context: Context
                                 ) -> pb.TopicListResponse:
        ns = namespace_name(request.name)
        if not self._ctx.namespaces.exists(ns):
            raise not_found(f"namespace {ns} does not exist")
        return pb.TopicListResponse(topics=self._topic_names(ns))

    def _topic_names(self, ns: str) -> list[str]:
        """`ns/topic` (no leading slash, C.14) of each topic of the namespace, sorted."""
        return sorted(t.full[1:] for t in self._topics.served() if t.name.namespace == ns)

    @unary
    async def GetNamespacePolicies(self, request: pb.NamespaceRequest, context: Context) -> pb.PolicyResponse:
        policy = self._ctx.namespaces.policy(namespace_name(request.name))
        return pb.PolicyResponse(policies=json.dumps(policy.to_obj()))

    @unary
    async def CreateNamespace(self, request: pb.NamespaceRequest, context: Context) -> pb.NamespaceResponse:
        ns = namespace_name(request.name)
        try:
            await self._ctx.namespaces.create(ns)
        except DanubeError as e:
            raise not_found(f"Unable to create the namespace {ns} due to: {e}") from e
        return pb.NamespaceResponse(success=True)

    @unary
    async def DeleteNamespace(self, request: pb.NamespaceRequest, context: Context) -> pb.NamespaceResponse:
        ns = namespace_name(request.name)
        try:
            await self._ctx.namespaces.delete(ns)
        except DanubeError as e:
            raise not_found(f"Unable to delete the namespace {ns} due to: {e}") from e
        return pb.NamespaceResponse(success=True)


class TopicAdmin(pb_grpc.TopicAdminServicer):
    def __init__(self, ctx: BrokerContext, schemas: TopicSchemas) -> None:
        self._ctx = ctx
        self._topics = ctx.topics
        self._schemas = schemas

    async def _create(self, name: TopicName, dispatch_strategy: int, subject: str | None) -> None:
        """One topic, with its schema subject if given; NOT_FOUND with the cause for any failure."""
        try:
            topic = await self._topics.create_topic(name, delivery_mode(dispatch_strategy))
            if subject is not None:
                await self._schemas.assign_subject(topic, subject)
        except DanubeError as e:
            raise not_found(f"Unable to create the topic {name} due to: {e}") from e

    async def _require_subject(self, name: TopicName, subject: str | None) -> None:
        if subject is not None and await self._schemas.registry.subject_id(subject) is None:
            raise not_found(f"Unable to create the topic {name} due to: schema subject {clip(subject)!r} is "
                            "not registered")

    def _info(self, topic: Topic) -> pb.TopicInfo:
        return pb.TopicInfo(name=topic.full, broker_id=str(self._ctx.broker_id),
                            delivery=topic.delivery.value)

    @unary
    async def ListNamespaceTopics(self, request: pb.NamespaceRequest, context: Context
                                  ) -> pb.TopicInfoListResponse:
        ns = namespace_name(request.name)
        served = sorted(self._topics.served(), key=lambda t: t.full)
        return pb.TopicInfoListResponse(topics=[self._info(t) for t in served if t.name.namespace == ns])

    @unary
    async def CreateTopic(self, request: pb.NewTopicRequest, context: Context) -> pb.TopicResponse:
        name = parse_topic(request.name)
        subject = request.schema_subject if request.HasField("schema_subject") else None
        await self._require_subject(name, subject)
        await self._create(name, request.dispatch_strategy, subject)
        return pb.TopicResponse(success=True)

    @unary
    async def CreatePartitionedTopic(self, request: pb.PartitionedTopicRequest, context: Context
                                     ) -> pb.TopicResponse:
        base = parse_topic(request.base_name)
        if not 1 <= request.partitions <= MAX_PARTITIONS:
            raise invalid(f"{request.partitions} partitions asked for {base}: 1 to {MAX_PARTITIONS}")
        # Every partition's name is checked before any is created: the last may be too long.
        parts = [check_topic(TopicName(base.namespace, f"{base.topic}-part-{i}"))
                 for i in range(request.partitions)]
        subject = request.schema_subject if request.HasField("schema_subject") else None
        await self._require_subject(base, subject)
        for name in parts:
            await self._create(name, request.dispatch_strategy, subject)
        return pb.TopicResponse(success=True)

    @unary
    async def DeleteTopic(self, request: pb.TopicRequest, context: Context) -> pb.TopicResponse:
        name = parse_topic(request.name)
        if partition_base(name.topic) is not None:
            raise not_found(f"Unable to delete the topic {name}: it is a partition; delete its base topic")
        targets = self._topics.partitions(name)
        if not targets:
            raise not_found(f"Unable to delete the topic {name}: it does not exist")
        for full in targets:
            topic = self._topics.find(full)
            if topic is not None:
                await self._topics.delete_topic(topic)
        return pb.TopicResponse(success=True)

    @unary
    async def ListSubscriptions(self, request: pb.TopicRequest, context: Context
                                ) -> pb.SubscriptionListResponse:
        topic = self._topics.find(parse_topic(request.name).full)
        names = sorted(topic.subscriptions) if topic is not None else []
        return pb.SubscriptionListResponse(subscriptions=names)

    @unary
    async def Unsubscribe(self, request: pb.SubscriptionRequest, context: Context) -> pb.SubscriptionResponse:
        name = parse_topic(request.topic)
        topic = self._topics.find(name.full)
        if topic is None:
            raise not_found(f"Unable to unsubscribe: topic {name} does not exist")
        await self._ctx.subscriptions.unsubscribe(topic, request.subscription)
        return pb.SubscriptionResponse(success=True)

    @unary
    async def DescribeTopic(self, request: pb.DescribeTopicRequest, context: Context
                            ) -> pb.DescribeTopicResponse:
        topic = self._topics.find(request.name)
        if topic is None:
            return pb.DescribeTopicResponse(name=request.name, delivery=DeliveryMode.NON_RELIABLE.value)
        response = pb.DescribeTopicResponse(name=request.name, subscriptions=sorted(topic.subscriptions),
                                            broker_id=str(self._ctx.broker_id),
                                            delivery=topic.delivery.value)
        await self._schema_fields(response, topic)
        return response

    async def _schema_fields(self, response: pb.DescribeTopicResponse, topic: SchemaTopic) -> None:
        """The optional schema fields of DescribeTopic, when the topic has a subject."""
        try:
            schema = await self._schemas.describe(topic)
        except DanubeError:  # DescribeTopic never fails (C.14): without the registry, no schema fields
            schema = None
        if schema is not None:
            response.schema_subject = schema.subject
            response.schema_id = schema.schema_id
            response.schema_version = schema.version
            response.schema_type = schema.schema_type
            response.compatibility_mode = schema.compatibility_mode

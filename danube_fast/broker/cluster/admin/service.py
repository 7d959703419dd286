"""The admin API of a broker in a cluster (docs/WIRE.md A.4, C.14): danube_admin.BrokerAdmin, and the
NamespaceAdmin and TopicAdmin of services/admin.py extended to the topics of every broker.

Where answers come from:
* the cluster (brokers, leader, owners, namespaces, topic lists): the ClusterView, this broker's cache;
* topic details of topics hosted elsewhere (delivery, subscriptions, schema): the metadata store;
* what only the owner can do (DeleteTopic, Unsubscribe) or knows first-hand (ListSubscriptions): the owner,
  through the Forwarder; a rebalance: the leader's load manager (the `Rebalancer`), forwarded to the leader
  by the other brokers.

Statuses as v0.7.3 (C.14) where it names them; a broker that must answer for another one it cannot reach
answers UNAVAILABLE naming it. ListNamespaces and ListSubscriptions list each name once (D.16). A broker's
status is `active`, `draining`, or `drained` once a draining broker has no topic left (v0.7.3 writes the
mode `drained` only when a drain finds no topic; both read as `drained` here).
"""

from __future__ import annotations

from dataclasses import dataclass

from danube_fast import names
from danube_fast.broker.cluster.admin import ops as admin_ops
from danube_fast.broker.cluster.moves import Rebalancer
from danube_fast.broker.cluster.view import ClusterView
from danube_fast.broker.context import BrokerContext
from danube_fast.broker.services.admin import NamespaceAdmin, TopicAdmin, delivery_mode, namespace_name
from danube_fast.broker.services.forward import Forwarder, is_forwarded
from danube_fast.broker.services.status import Context, unary
from danube_fast.broker.topic import Topic
from danube_fast.client.rpc import M, WireMessage
from danube_fast.errors import DanubeError, invalid, not_found, precondition, unavailable
from danube_fast.meta import keys
from danube_fast.meta.election import NotLeader
from danube_fast.meta.keys import U64_MAX
from danube_fast.meta.resources import BrokerMode, BrokerState, DeliveryMode, TopicSchemaConfig
from danube_fast.meta.store import MetadataStore
from danube_fast.names import TopicName, parse_topic
from danube_fast.proto import DanubeAdmin_pb2 as pb
from danube_fast.proto import DanubeAdmin_pb2_grpc as pb_grpc
from danube_fast.schema import TopicSchemas
from danube_fast.schema.topic_schema import SchemaGate

LEADER, FOLLOWER = "Cluster_Leader", "Cluster_Follower"
DRAINED = "drained"
ASSIGNMENT_STRATEGY = "least_loaded"  # the load manager places a topic on the broker with the fewest topics


def broker_id_of(text: str) -> int:
    """A broker id from a request: canonical unsigned decimal, as ListBrokers writes it."""
    if not text:
        raise invalid("broker_id must be provided")
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0") or int(text) > U64_MAX:
        raise invalid(f"broker_id {text!r} is not a broker id (an unsigned 64-bit decimal)")
    return int(text)


def broker_status(state: BrokerState | None, topics_left: int) -> str:
    if state is None or state.mode == BrokerMode.ACTIVE:
        return BrokerMode.ACTIVE
    if state.mode in (BrokerMode.DRAINING, DRAINED):
        return DRAINED if topics_left == 0 else BrokerMode.DRAINING
    return state.mode  # another mode (maintenance, upgrade) as the broker wrote it


async def forward(forwarder: Forwarder, view: ClusterView, broker_id: int, what: str, service: str,
                   method: str, request: WireMessage, reply: type[M], context: Context) -> M:
    """The call answered by broker `broker_id` (`what` says why it is asked)."""
    registration = view.registration(broker_id)
    if registration is None:
        raise unavailable(f"{method}: broker {broker_id}, {what}, is not registered (its lease expired?)")
    return await forwarder.call(registration.admin_addr, service, method, request, reply, context)


class BrokerAdmin(pb_grpc.BrokerAdminServicer):
    def __init__(self, view: ClusterView, store: MetadataStore, broker_id: int, forwarder: Forwarder,
                 rebalancer: Rebalancer | None, assignment_strategy: str = ASSIGNMENT_STRATEGY) -> None:
        self._view = view
        self._store = store
        self._broker_id = broker_id
        self._forwarder = forwarder
        # The leader's load manager; set once it exists (the servicer is built before the broker joins).
        self.rebalancer = rebalancer
        self._strategy = assignment_strategy

    @unary
    async def ListBrokers(self, request: pb.Empty, context: Context) -> pb.BrokerListResponse:
        return pb.BrokerListResponse(brokers=[
            pb.BrokerInfo(broker_id=str(b.broker_id), broker_addr=b.registration.broker_addr,
                          broker_role=LEADER if b.is_leader else FOLLOWER,
                          admin_addr=b.registration.admin_addr, metrics_addr=b.registration.prom_exporter,
                          broker_status=broker_status(b.state, len(self._view.broker_topics(b.broker_id))))
            for b in self._view.brokers()])

    @unary
    async def GetLeaderBroker(self, request: pb.Empty, context: Context) -> pb.BrokerResponse:
        leader = self._view.leader_id()
        return pb.BrokerResponse(leader="not_found" if leader is None else str(leader))

    @unary
    async def ListNamespaces(self, request: pb.Empty, context: Context) -> pb.NamespaceListResponse:
        return pb.NamespaceListResponse(namespaces=self._view.namespaces())

    @unary
    async def UnloadBroker(self, request: pb.UnloadBrokerRequest, context: Context
                           ) -> pb.UnloadBrokerResponse:
        report = await admin_ops.drain_broker(
            self._store, self._view, broker_id_of(request.broker_id),
            namespaces_include=set(request.namespaces_include),
            namespaces_exclude=set(request.namespaces_exclude), max_parallel=request.max_parallel,
            dry_run=request.dry_run, timeout=float(request.timeout_seconds))
        return pb.UnloadBrokerResponse(started=report.started, total=report.total, succeeded=report.succeeded,
                                       failed=report.failed, pending=report.pending,
                                       failed_topics=report.failed_topics)

    @unary
    async def ActivateBroker(self, request: pb.ActivateBrokerRequest, context: Context
                             ) -> pb.ActivateBrokerResponse:
        await admin_ops.activate_broker(self._store, self._view, broker_id_of(request.broker_id),
                                        request.reason)
        return pb.ActivateBrokerResponse(success=True)

    @unary
    async def GetClusterBalance(self, request: pb.ClusterBalanceRequest, context: Context
                                ) -> pb.ClusterBalanceResponse:
        balance = admin_ops.cluster_balance(self._view)
        return pb.ClusterBalanceResponse(
            coefficient_of_variation=balance.coefficient_of_variation, mean_load=balance.mean_load,
            max_load=balance.max_load, min_load=balance.min_load, std_deviation=balance.std_deviation,
            broker_count=len(balance.brokers), assignment_strategy=self._strategy,
            brokers=[pb.BrokerLoadInfo(broker_id=b.broker_id, load=b.load, topic_count=b.topic_count,
                                       is_overloaded=b.is_overloaded, is_underloaded=b.is_underloaded)
                     for b in balance.brokers])

    @unary
    async def TriggerRebalance(self, request: pb.RebalanceRequest, context: Context) -> pb.RebalanceResponse:
        leader = self._view.leader_id()
        if leader != self._broker_id:
            if leader is None:
                raise unavailable("TriggerRebalance: the cluster has no leader at the moment")
            if is_forwarded(context):  # this broker's view is behind the sender's
                raise unavailable(f"TriggerRebalance: broker {self._broker_id} is not the leader "
                                  f"(broker {leader} is)")
            return await forward(self._forwarder, self._view, leader, "the leader", "BrokerAdmin",
                                  "TriggerRebalance", request, pb.RebalanceResponse, context)
        if self.rebalancer is None:
            raise precondition("TriggerRebalance: rebalancing is not configured on this broker")
        max_moves = request.max_moves if request.HasField("max_moves") else None
        try:
            moves = await self.rebalancer.rebalance(dry_run=request.dry_run, max_moves=max_moves)
        except NotLeader as e:  # the view named this broker a moment ago
            raise unavailable(f"TriggerRebalance: the leadership moved; try again ({e})") from e
        return pb.RebalanceResponse(
            success=True, moves_executed=0 if request.dry_run else len(moves),
            proposed_moves=[pb.ProposedMove(topic_name=m.topic, from_broker=m.from_broker,
                                            to_broker=m.to_broker, estimated_load=m.load, reason=m.reason)
                            for m in moves])


class ClusterNamespaceAdmin(NamespaceAdmin):
    """GetNamespaceTopics and DeleteNamespace over the topics of every broker (the namespace markers)."""

    def __init__(self, ctx: BrokerContext, view: ClusterView) -> None:
        super().__init__(ctx)
        self._view = view

    def _topic_names(self, ns: str) -> list[str]:
        return [keys.topic_name(ns, t)[1:] for t in self._view.namespace_topics(ns)]

    @unary
    async def DeleteNamespace(self, request: pb.NamespaceRequest, context: Context) -> pb.NamespaceResponse:
        ns = namespace_name(request.name)
        left = self._view.namespace_topics(ns)
        if left:
            raise not_found(f"Unable to delete the namespace {ns} due to: it still has {len(left)} topics "
                            "(delete them first)")
        return await super().DeleteNamespace(request, context)


@dataclass
class _StoredTopic:
    """A topic hosted elsewhere, as the schema layer sees a topic (SchemaTopic), from its metadata."""

    name: TopicName
    schema_config: TopicSchemaConfig | None
    schema_gate: SchemaGate | None = None

    @property
    def full(self) -> str:
        return self.name.full

    def set_schema(self, config: TopicSchemaConfig, gate: SchemaGate | None) -> None:
        self.schema_config = config
        self.schema_gate = gate


class ClusterTopicAdmin(TopicAdmin):
    """TopicAdmin over the topics of every broker: listings and owners from the ClusterView, details from the
    store, DeleteTopic / Unsubscribe / ListSubscriptions by the owner. CreateTopic and
    CreatePartitionedTopic are TopicAdmin's, through this broker's registry, wherever the topic is placed."""

    def __init__(self, ctx: BrokerContext, schemas: TopicSchemas, view: ClusterView, store: MetadataStore,
                 forwarder: Forwarder) -> None:
        super().__init__(ctx, schemas)
        self._view = view
        self._store = store
        self._forwarder = forwarder
        self._me = ctx.broker_id

    async def _create(self, name: TopicName, dispatch_strategy: int, subject: str | None) -> None:
        """In a cluster the load manager may place a new topic on another broker, or not yet: the topic is
        created all the same (the registry answers UNAVAILABLE, for a producer to look it up again), and its
        schema subject goes to its metadata. A topic that already exists anywhere is refused."""
        if await self._store.get(keys.topic_root(name.namespace, name.topic)) is not None:
            raise not_found(f"Unable to create the topic {name} due to: it already exists")
        placed: Topic | _StoredTopic
        try:
            placed = await self._topics.create_topic(name, delivery_mode(dispatch_strategy))
        except DanubeError as e:
            created = await self._store.get(keys.topic_root(name.namespace, name.topic)) is not None
            if e.grpc_code != "UNAVAILABLE" or not created:
                raise not_found(f"Unable to create the topic {name} due to: {e}") from e
            placed = _StoredTopic(name, None)
        if subject is not None:
            try:
                await self._schemas.assign_subject(placed, subject)
            except DanubeError as e:
                raise not_found(f"Unable to create the topic {name} due to: {e}") from e

    def _owner(self, name: TopicName) -> int | None:
        return self._view.owner(name.namespace, name.topic)

    async def _by_owner(self, owner: int, name: TopicName, method: str, request: WireMessage, reply: type[M],
                        context: Context) -> M:
        return await forward(self._forwarder, self._view, owner, f"the owner of {name}", "TopicAdmin",
                              method, request, reply, context)

    async def _infos(self, topics: list[tuple[str, str]]) -> list[pb.TopicInfo]:
        records = await admin_ops.topic_records(self._store, topics, details=False)
        owners = self._view.owners()
        return [pb.TopicInfo(name=keys.topic_name(ns, t), broker_id=str(owners.get((ns, t), "")),
                             delivery=records[(ns, t)].delivery.value) for ns, t in topics]

    @unary
    async def ListNamespaceTopics(self, request: pb.NamespaceRequest, context: Context
                                  ) -> pb.TopicInfoListResponse:
        ns = namespace_name(request.name)
        return pb.TopicInfoListResponse(topics=await self._infos([(ns, t)
                                                                  for t in self._view.namespace_topics(ns)]))

    @unary
    async def ListBrokerTopics(self, request: pb.BrokerRequest, context: Context) -> pb.TopicInfoListResponse:
        topics = self._view.broker_topics(broker_id_of(request.broker_id))
        return pb.TopicInfoListResponse(topics=await self._infos(topics))

    @unary
    async def UnloadTopic(self, request: pb.TopicRequest, context: Context) -> pb.TopicResponse:
        name = parse_topic(request.name)
        await admin_ops.unload_topic(self._store, self._view, name.namespace, name.topic)
        return pb.TopicResponse(success=True)

    @unary
    async def DeleteTopic(self, request: pb.TopicRequest, context: Context) -> pb.TopicResponse:
        """A partition is deleted through its base; the base's partitions are deleted by their owners, each
        one even when another fails (v0.7.3's best effort), and the failures are reported."""
        name = parse_topic(request.name)
        if is_forwarded(context):  # the sender found this broker the owner of exactly this topic
            await self._delete_here(name)
            return pb.TopicResponse(success=True)
        if names.partition_base(name.topic) is not None:
            raise not_found(f"Unable to delete the topic {name}: it is a partition; delete its base topic")
        existing = self._view.namespace_topics(name.namespace)
        if name.topic in existing:
            targets = [name]
        else:
            parts = sorted((t for t in existing if names.is_partition_of(t, name.topic)),
                           key=names.partition_index)
            targets = [TopicName(name.namespace, t) for t in parts]
        if not targets:
            raise not_found(f"Unable to delete the topic {name}: it does not exist")
        failures = []
        for target in targets:
            try:
                await self._delete(target, context)
            except DanubeError as e:
                failures.append(f"{target}: {e}")
        if failures:
            raise not_found(f"Unable to delete the topic {name}: " + "; ".join(failures))
        return pb.TopicResponse(success=True)

    async def _delete(self, name: TopicName, context: Context) -> None:
        owner = self._owner(name)
        if owner is None:
            raise not_found(f"Unable to delete the topic {name}: it is unassigned (being moved); try again "
                            "once a broker serves it")
        if owner == self._me:
            await self._delete_here(name)
        else:
            await self._by_owner(owner, name, "DeleteTopic", pb.TopicRequest(name=name.full),
                                 pb.TopicResponse, context)

    async def _delete_here(self, name: TopicName) -> None:
        topic = self._topics.find(name.full)
        if topic is None:
            raise not_found(f"Unable to delete the topic {name}: broker {self._me} does not serve it")
        await self._topics.delete_topic(topic)

    @unary
    async def ListSubscriptions(self, request: pb.TopicRequest, context: Context
                                ) -> pb.SubscriptionListResponse:
        """From the owner (its subscriptions in memory); from the metadata when the topic is unassigned or
        its owner cannot be reached."""
        name = parse_topic(request.name)
        owner = self._owner(name)
        if owner == self._me and self._topics.find(name.full) is not None:
            return await super().ListSubscriptions(request, context)
        if owner is not None and owner != self._me and not is_forwarded(context):
            try:
                return await self._by_owner(owner, name, "ListSubscriptions", request,
                                            pb.SubscriptionListResponse, context)
            except DanubeError as e:
                if e.grpc_code != "UNAVAILABLE":
                    raise
        records = await admin_ops.topic_records(self._store, [(name.namespace, name.topic)])
        return pb.SubscriptionListResponse(subscriptions=records[(name.namespace, name.topic)].subscriptions)

    @unary
    async def Unsubscribe(self, request: pb.SubscriptionRequest, context: Context) -> pb.SubscriptionResponse:
        name = parse_topic(request.topic)
        owner = self._owner(name)
        if owner is not None and owner != self._me and not is_forwarded(context):
            return await self._by_owner(owner, name, "Unsubscribe", request, pb.SubscriptionResponse, context)
        if owner is None:
            raise not_found(f"Unable to unsubscribe: topic {name} is unassigned (being moved) or does not "
                            "exist")
        return await super().Unsubscribe(request, context)

    @unary
    async def DescribeTopic(self, request: pb.DescribeTopicRequest, context: Context
                            ) -> pb.DescribeTopicResponse:
        """Never fails (C.14): an invalid or unknown name, or metadata that cannot be read, gives the name, no
        owner and NonReliable."""
        try:
            name = parse_topic(request.name)
        except DanubeError:
            return pb.DescribeTopicResponse(name=request.name, delivery=DeliveryMode.NON_RELIABLE.value)
        owner = self._owner(name)
        broker_id = "" if owner is None else str(owner)
        local = self._topics.find(name.full) if owner == self._me else None
        if local is not None:
            response = await super().DescribeTopic(request, context)
            response.broker_id = broker_id
            return response
        response = pb.DescribeTopicResponse(name=request.name, broker_id=broker_id,
                                            delivery=DeliveryMode.NON_RELIABLE.value)
        try:
            record = (await admin_ops.topic_records(self._store, [(name.namespace, name.topic)]))[
                (name.namespace, name.topic)]
        except DanubeError:
            return response
        response.delivery = record.delivery.value
        response.subscriptions.extend(record.subscriptions)
        await self._schema_fields(response, _StoredTopic(name, record.schema))
        return response

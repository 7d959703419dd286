"""danube_fast.replication.v1.Replication on the admin port (proto/Replication.proto), docs/REPLICATION.md.

- Fetch: the owner of a replicated topic answers its followers (manager.py `Replication.fetch`), for
  followers whose owner serves no native transport (which they use where it does: services/native.py).
- Copies: a topic's copies for `admin topics describe`: the owner answers from what it tracks (how much
  each follower holds); another broker forwards the call to the owner, or, asked by a forwarded call or
  with the owner unreachable, answers from the copies' key it caches (without the figures).
"""

from __future__ import annotations

import contextlib

from danube_fast.broker.cluster.admin.service import forward
from danube_fast.broker.cluster.replication.manager import Replication
from danube_fast.broker.cluster.replication.owner import ReplicaSet
from danube_fast.broker.cluster.view import ClusterView
from danube_fast.broker.namespaces import Namespaces
from danube_fast.broker.services.forward import Forwarder, is_forwarded
from danube_fast.broker.services.status import Context, unary
from danube_fast.codec.fast_wire import serialize_request
from danube_fast.errors import ApiError, not_found
from danube_fast.meta import keys
from danube_fast.meta.resources import TopicReplicas
from danube_fast.meta.store import BadValue
from danube_fast.names import parse_topic
from danube_fast.proto import Replication_pb2 as pb


class ReplicationService:
    # Fetch answers with the wire bytes of its FetchResponse (codec/replication_wire.py): records copied once.
    response_serializers = {"Fetch": serialize_request}

    def __init__(self, replication: Replication, view: ClusterView, namespaces: Namespaces,
                 forwarder: Forwarder) -> None:
        self._replication = replication
        self._view = view
        self._namespaces = namespaces
        self._forwarder = forwarder

    @unary
    async def Fetch(self, request: pb.FetchRequest, context: Context) -> bytes:
        return (await self._replication.fetch(request, "grpc")).encode()

    @unary
    async def Copies(self, request: pb.CopiesRequest, context: Context) -> pb.CopiesResponse:
        name = parse_topic(request.topic)
        rs = self._replication.find(name.full)
        if rs is not None:
            return _live(rs)
        owner = self._view.owner(name.namespace, name.topic)
        if owner is None:
            raise not_found(f"topic {name.full} has no owner (it does not exist, or it is being placed)")
        if owner != self._replication.me and not is_forwarded(context):
            with contextlib.suppress(ApiError):
                return await forward(self._forwarder, self._view, owner, "its owner", "Replication", "Copies",
                                     request, pb.CopiesResponse, context)
        policy = await self._namespaces.read_topic_policy(name)
        response = pb.CopiesResponse(owner=owner, replication_factor=policy.copies,
                                     min_insync_replicas=policy.insync_needed, end_offset=-1, in_sync=1)
        kv = self._view.cache.get(keys.replicas(name.namespace, name.topic))
        if kv is not None:
            with contextlib.suppress(BadValue):
                written = TopicReplicas.from_json(kv.value, key=kv.key)
                if written.owner == owner:
                    response.followers.extend(pb.Copy(broker_id=b, in_sync=b in written.isr, holds=-1,
                                                      behind=-1) for b in written.followers)
                    response.in_sync = len(written.isr)
        response.under_replicated = response.in_sync < policy.copies
        return response


def _live(rs: ReplicaSet) -> pb.CopiesResponse:
    written = rs.describe()
    end = rs.topic.wal.durable_offset
    followers = [pb.Copy(broker_id=b, in_sync=b in written.isr, holds=f.durable,
                         behind=max(end - f.durable, 0) if f.durable >= 0 else -1)
                 for b, f in sorted(rs.followers.items())]
    return pb.CopiesResponse(owner=rs.me, replication_factor=rs.copies, min_insync_replicas=rs.needed,
                             end_offset=end, followers=followers, in_sync=len(written.isr),
                             under_replicated=len(written.isr) < rs.copies)

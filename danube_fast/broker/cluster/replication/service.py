"""danube_fast.replication.v1.Replication on the admin port (proto/Replication.proto): the owner of a
replicated topic answers its followers' fetches (docs/REPLICATION.md). A fetch for a topic this broker
does not own as a replicated topic, under another term (epoch), or from a broker that is not one of its
followers is FAILED_PRECONDITION: the follower reads the metadata again and asks whoever owns it now."""

from __future__ import annotations

from danube_fast.broker.cluster.replication.manager import Replication
from danube_fast.broker.services.status import Context, unary
from danube_fast.errors import precondition
from danube_fast.proto import Replication_pb2 as pb


class ReplicationService:
    def __init__(self, replication: Replication) -> None:
        self._replication = replication

    @unary
    async def Fetch(self, request: pb.FetchRequest, context: Context) -> pb.FetchResponse:
        me = self._replication.me
        rs = self._replication.find(request.topic)
        if rs is None:
            raise precondition(f"broker {me} does not own {request.topic} as a replicated topic")
        if request.epoch != rs.epoch:
            raise precondition(f"broker {me} owns {request.topic} in term {rs.epoch}, not {request.epoch}")
        if request.follower_id not in rs.followers:
            raise precondition(f"broker {request.follower_id} is not a follower of {request.topic} "
                               f"(they are {sorted(rs.followers)})")
        return await rs.fetch(request)

"""BrokerStats in a cluster: each registered broker's figures are its own, so the others are asked of them
(the Forwarder, once, with only_this_broker set); one that cannot be reached is a row saying why, and the
rest are still answered."""

from __future__ import annotations

from danube_fast.broker.cluster.admin.service import forward
from danube_fast.broker.cluster.view import ClusterView
from danube_fast.broker.context import BrokerContext
from danube_fast.broker.history import History
from danube_fast.broker.retention import Retention
from danube_fast.broker.services.forward import Forwarder
from danube_fast.broker.services.stats import BrokerStatsService
from danube_fast.broker.services.status import Context
from danube_fast.broker.tables import TableWriter
from danube_fast.errors import ApiError
from danube_fast.proto import BrokerStats_pb2 as pb


class ClusterBrokerStats(BrokerStatsService):
    def __init__(self, ctx: BrokerContext, history: History, retention: Retention, tables: TableWriter,
                 view: ClusterView, forwarder: Forwarder) -> None:
        super().__init__(ctx, history, retention, tables)
        self._view = view
        self._forwarder = forwarder

    async def elsewhere(self, request: pb.FiguresRequest, context: Context) -> list[pb.BrokerFigures]:
        one = pb.FiguresRequest(only_this_broker=True, topics=request.topics, no_topics=request.no_topics)
        out = []
        for broker in self._view.brokers():
            if broker.broker_id == self._ctx.broker_id:
                continue
            try:
                answer = await forward(self._forwarder, self._view, broker.broker_id, "for its figures",
                                       "BrokerStats", "Figures", one,
                                       pb.FiguresResponse, context)
                out += answer.brokers
            except ApiError as e:
                out.append(pb.BrokerFigures(broker_id=str(broker.broker_id), error=f"{e.grpc_code}: {e}"))
        return out

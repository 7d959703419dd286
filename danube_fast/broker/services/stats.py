"""BrokerStats on the admin port (proto/BrokerStats.proto, docs/CONSOLE.md): this broker's recent history
(broker/history.py) and the live figures of the topics it serves, read from the parts that own them (the
topics, retention's last pass, the table writer). In a cluster the other brokers' are asked of them
(cluster/admin/stats.py)."""

from __future__ import annotations

from danube_fast.broker.context import BrokerContext
from danube_fast.broker.history import History
from danube_fast.broker.retention import Retention
from danube_fast.broker.services.forward import is_forwarded
from danube_fast.broker.services.status import Context, unary
from danube_fast.broker.tables import TableWriter
from danube_fast.broker.topic import Topic, stored
from danube_fast.proto import BrokerStats_pb2 as pb


class BrokerStatsService:
    def __init__(self, ctx: BrokerContext, history: History, retention: Retention,
                 tables: TableWriter) -> None:
        self._ctx = ctx
        self._history = history
        self._retention = retention
        self._tables = tables

    @unary
    async def Figures(self, request: pb.FiguresRequest, context: Context) -> pb.FiguresResponse:
        brokers = [self.here(request)]
        if not request.only_this_broker and not is_forwarded(context):
            brokers += await self.elsewhere(request, context)
        return pb.FiguresResponse(brokers=brokers)

    def here(self, request: pb.FiguresRequest) -> pb.BrokerFigures:
        history = self._history
        wanted = set(request.topics)
        served = [] if request.no_topics else [t for t in self._ctx.topics.served()
                                               if not wanted or t.full in wanted]
        totals = history.totals()
        return pb.BrokerFigures(
            broker_id=str(self._ctx.broker_id), period_s=history.period, messages_in=totals.messages_in,
            bytes_in=totals.bytes_in, messages_out=totals.messages_out, bytes_out=totals.bytes_out,
            history=[pb.Point(time=p.time, messages_in=p.messages_in, bytes_in=p.bytes_in,
                              messages_out=p.messages_out, bytes_out=p.bytes_out) for p in history.points()],
            topics=[self._topic(t) for t in served])

    def _topic(self, topic: Topic) -> pb.TopicFigures:
        out = pb.TopicFigures(stored_topic=topic.full, subscriptions=len(topic.subscriptions),
                              producers=sorted(topic.producers),
                              backlog=sum(s.dispatcher.backlog for s in topic.subscriptions.values()))
        rates = self._history.rates.get(topic.full)
        if rates is not None:
            out.messages_in_rate, out.bytes_in_rate = rates.messages_in, rates.bytes_in
            out.messages_out_rate = rates.messages_out
        reliable = stored(topic)
        if reliable is not None:
            out.start_offset, out.end_offset = reliable.log.start_offset, reliable.log.committed_offset
            out.wal_bytes = reliable.wal.disk_bytes
        kept = self._retention.state.get(topic.full)
        if kept is not None:
            out.retained_bytes, out.retained_records = kept.retained_bytes, kept.retained_records
        table = self._tables.status.get(topic.full)
        if table is not None:
            out.table = "failing" if table.error or table.stopped else table.mode
        return out

    async def elsewhere(self, request: pb.FiguresRequest, context: Context) -> list[pb.BrokerFigures]:
        """The other brokers' figures (cluster mode: cluster/admin/stats.py); none standalone."""
        return []

"""TableAdmin on the admin port (proto/TableAdmin.proto): what each topic's Iceberg table holds, read from
this broker's table writer (broker/tables.py), which owns that state; the snapshots a table keeps, read from
the catalog by this broker's table worker."""

from __future__ import annotations

import time

from danube_fast import names
from danube_fast.broker.context import BrokerContext
from danube_fast.broker.services.forward import is_forwarded
from danube_fast.broker.services.status import Context, unary
from danube_fast.broker.tables import TableStatus, TableWriter
from danube_fast.errors import ApiError, not_found, precondition
from danube_fast.names import parse_topic
from danube_fast.proto import TableAdmin_pb2 as pb


class TableAdminService:
    def __init__(self, ctx: BrokerContext, writer: TableWriter) -> None:
        self._ctx = ctx
        self._topics = ctx.topics
        self._writer = writer

    @unary
    async def Status(self, request: pb.TableStatusRequest, context: Context) -> pb.TableStatusResponse:
        name = parse_topic(request.topic)
        stored = self._topics.partitions(name)
        if not stored:
            raise not_found(f"topic {name.full} does not exist (as a topic or as a partitioned topic)")
        writer = self._writer
        here = [s for s in stored if self._topics.find(s) is not None]
        status = writer.status
        now = time.time()
        found = [_view(s, status[s], now) for s in here if s in status]
        elsewhere = [s for s in stored if s not in here]
        if elsewhere and not is_forwarded(context):
            found += await self.elsewhere(request, elsewhere, context)
        if not here and not found:
            raise ApiError("UNAVAILABLE", f"topic {name.full} is served by another broker: ask its owner")
        if not found:
            raise precondition(f"topic {name.full} has no table (its tableMode is none, or the writer has "
                               f"not seen the change yet): admin policies set {name.full} --table envelope")
        found.sort(key=lambda t: t.stored_topic)
        return pb.TableStatusResponse(tables=found,
                                      catalog_uri=writer.location.uri, warehouse=writer.location.warehouse,
                                      catalog_kind=writer.location.kind)

    @unary
    async def Snapshots(self, request: pb.TableStatusRequest, context: Context) -> pb.TableSnapshotsResponse:
        """Any broker answers: the catalog is every broker's, read through this one's table worker."""
        name = parse_topic(request.topic)
        if not self._topics.partitions(name):
            raise not_found(f"topic {name.full} does not exist (as a topic or as a partitioned topic)")
        base = names.partition_base(name.topic) or name.topic
        kept = await self._writer.snapshots(name.namespace, base)
        if kept is None:
            raise precondition(f"topic {name.full} has no table yet: admin policies set {name.full} --table "
                               "envelope, and wait for the first commit")
        return pb.TableSnapshotsResponse(table=f"{name.namespace}.{base}", snapshots=[
            pb.TableSnapshot(snapshot_id=s.snapshot_id, committed_at_ms=s.committed_at_ms,
                             operation=s.operation, offsets=s.offsets, records=s.records, files=s.files)
            for s in kept])

    async def elsewhere(self, request: pb.TableStatusRequest, stored: list[str],
                        context: Context) -> list[pb.TableStatus]:
        """The status of `stored` topics this broker does not serve, asked of their owners (cluster mode:
        cluster/admin/tables.py); none in standalone mode, where they are only not loaded."""
        return []


def _view(stored: str, st: TableStatus, now: float) -> pb.TableStatus:
    return pb.TableStatus(
        stored_topic=stored, mode=st.mode, table=st.table, committed_offset=st.committed_offset,
        topic_offset=st.topic_offset, lag_ms=st.lag_ms(now), files=st.files, bytes=st.bytes,
        dlq_records=st.dlq_records, skipped_records=st.skipped_records, commits=st.commits,
        metadata_location=st.metadata_location, error=st.error, stopped=st.stopped,
        compacted_files=st.compacted_files, partitioning=st.partitioning)

"""TableAdmin's Status in a cluster: the tables of a topic's partitions are written by their owners, so the
status of the ones another broker serves is asked of it (the Forwarder, once: a forwarded call answers
from what the callee serves) and merged with this broker's."""

from __future__ import annotations

from danube_fast.broker.cluster.admin.service import forward
from danube_fast.broker.cluster.view import ClusterView
from danube_fast.broker.context import BrokerContext
from danube_fast.broker.services.forward import Forwarder
from danube_fast.broker.services.status import Context
from danube_fast.broker.services.table_admin import TableAdminService
from danube_fast.broker.tables import TableWriter
from danube_fast.errors import ApiError
from danube_fast.names import parse_topic
from danube_fast.proto import TableAdmin_pb2 as pb


class ClusterTableAdmin(TableAdminService):
    def __init__(self, ctx: BrokerContext, writer: TableWriter, view: ClusterView,
                 forwarder: Forwarder) -> None:
        super().__init__(ctx, writer)
        self._view = view
        self._forwarder = forwarder

    async def elsewhere(self, request: pb.TableStatusRequest, stored: list[str],
                        context: Context) -> list[pb.TableStatus]:
        by_owner: dict[int, set[str]] = {}
        for name in stored:
            topic = parse_topic(name)
            owner = self._view.owner(topic.namespace, topic.topic)
            # An unassigned partition (moving) has no status to show now; this broker's own, not loaded
            # (or loading), has none either.
            if owner is not None and owner != self._ctx.broker_id:
                by_owner.setdefault(owner, set()).add(name)
        found: list[pb.TableStatus] = []
        for owner, names in sorted(by_owner.items()):
            what = f"the owner of {', '.join(sorted(names))}"
            try:
                answer = await forward(self._forwarder, self._view, owner, what, "TableAdmin", "Status",
                                       request, pb.TableStatusResponse, context)
            except ApiError as e:
                if e.grpc_code == "FAILED_PRECONDITION":  # no table there (yet)
                    continue
                raise
            found += [t for t in answer.tables if t.stored_topic in names]
        return found

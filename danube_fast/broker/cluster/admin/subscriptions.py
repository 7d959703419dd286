"""SubscriptionAdmin in a cluster: a subscription's position is its topic owner's, so the partitions another
broker serves are asked of it (the Forwarder, once: a forwarded call answers only from what the callee
serves), one partition per call, and the answers merged with this broker's."""

from __future__ import annotations

from danube_fast.broker.cluster.admin.service import forward
from danube_fast.broker.cluster.view import ClusterView
from danube_fast.broker.context import BrokerContext
from danube_fast.broker.services.forward import Forwarder
from danube_fast.broker.services.status import Context
from danube_fast.broker.services.subscription_admin import SubscriptionAdminService
from danube_fast.client.rpc import M, WireMessage
from danube_fast.errors import unavailable
from danube_fast.names import parse_topic


class ClusterSubscriptionAdmin(SubscriptionAdminService):
    def __init__(self, ctx: BrokerContext, view: ClusterView, forwarder: Forwarder) -> None:
        super().__init__(ctx)
        self._view = view
        self._forwarder = forwarder

    async def elsewhere(self, stored: list[str], method: str, request: WireMessage, reply: type[M],
                        context: Context) -> list[M]:
        answers = []
        for name in stored:
            topic = parse_topic(name)
            owner = self._view.owner(topic.namespace, topic.topic)
            if owner is None or owner == self._ctx.broker_id:  # being placed or moved, or loading here
                raise unavailable(f"{name} is being placed on a broker: try again")
            one = type(request).FromString(request.SerializeToString())
            one.topic = name  # type: ignore[attr-defined]  # every SubscriptionAdmin request names it
            answers.append(await forward(self._forwarder, self._view, owner, f"the owner of {name}",
                                         "SubscriptionAdmin", method, one, reply, context))
        return answers

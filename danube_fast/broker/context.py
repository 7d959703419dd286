"""What a service of the broker is given: the parts it may use, named, instead of a hub to reach through.

A BrokerContext is built once by assemble() (assemble.py) and never changes; every part keeps its own state
and is the only writer of it (docs/ARCHITECTURE.md, "Who owns what").
"""

from __future__ import annotations

from dataclasses import dataclass

from danube_fast.broker.clients import Clients
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.dispatch.budget import ByteBudget, ReadBudget
from danube_fast.broker.namespaces import Namespaces
from danube_fast.broker.ownership import Placement
from danube_fast.broker.subscriptions import Subscriptions
from danube_fast.broker.topic_registry import TopicRegistry
from danube_fast.storage.log_manager import LogManager


@dataclass(frozen=True)
class BrokerContext:
    config: BrokerConfig
    broker_id: int
    topics: TopicRegistry  # the served topics: find, create, delete
    namespaces: Namespaces  # namespaces and the policies topics take from them
    subscriptions: Subscriptions  # subscribe, unsubscribe, dispatchers, the end of streams at stop
    clients: Clients  # producers and consumers by id
    placement: Placement  # where a topic lives (this broker or another)
    logs: LogManager  # the WALs, their cache budget and the idle sweeper
    budget: ByteBudget  # bytes every dispatcher holds for delivery
    reads: ReadBudget  # the offset reader's responses in flight, within `budget`

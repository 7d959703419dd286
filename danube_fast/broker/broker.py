"""A broker assembled from its parts (assemble.py), started and stopped in order.

Start: the topics (standalone: every topic of the store, its WAL recovered, its producers, subscriptions and
cursors), their schema configurations, then the listeners (the ports are bound already: assemble.py), then
the cluster node (membership; in cluster mode the reconciler and the load manager), then the background work
(retention, the recent history, the web console, the table writer, the stall dump). Stop (SIGTERM or
SIGINT): hand the topics over (cluster mode), close the console, end consumer streams (clients look the
topic up again), stop accepting RPCs and let running ones finish, flush cursors, fsync and close every WAL,
close the store.

Broker holds its parts and never changes them; each part owns its own state (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import grpc

from danube_fast.broker import heap
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.context import BrokerContext
from danube_fast.broker.history import History
from danube_fast.broker.metrics import MetricsServer
from danube_fast.broker.retention import Retention
from danube_fast.broker.services.forward import Forwarder
from danube_fast.broker.services.native import NativeServer
from danube_fast.broker.stall_dump import StallDump
from danube_fast.broker.tables import TableWriter
from danube_fast.broker.tiering import Tier
from danube_fast.console.server import ConsoleServer
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.store import MetadataStore
from danube_fast.schema import TopicSchemas

STOP_GRACE = 2.0  # seconds running RPCs get to finish at shutdown


class Node(Protocol):
    """The broker's place in its cluster (cluster/node.py; standalone, a cluster of one)."""

    async def start(self) -> None: ...

    async def drain(self) -> None:
        """Hand this broker's topics to the others before it stops."""

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Listening:
    client_port: int
    admin_port: int
    metrics_port: int | None
    fast_port: int | None = None  # the native transport's, when it listens
    console_port: int | None = None  # the web console's, when it listens


@dataclass(frozen=True)
class Listeners:
    """The gRPC servers, their services registered and their ports bound, and the metrics endpoint."""
    client: grpc.aio.Server
    admin: grpc.aio.Server
    metrics: MetricsServer | None
    ports: Listening
    native: NativeServer | None = None
    console: ConsoleServer | None = None


class Broker:
    def __init__(self, config: BrokerConfig, ctx: BrokerContext, store: MetadataStore, cache: LocalCache,
                 tier: Tier, schemas: TopicSchemas, listeners: Listeners, url: str, node: Node,
                 retention: Retention, tables: TableWriter, stall_dump: StallDump | None,
                 forwarder: Forwarder, close_store: Callable[[], Awaitable[None]] | None,
                 history: History) -> None:
        """`close_store`: None when the store was given to assemble() (its opener closes it)."""
        self.config = config
        self.ctx = ctx
        self.topics = ctx.topics
        self.store = store
        self.cache = cache  # /cluster/, /namespaces/ and the security keys
        self.tier = tier
        self.schemas = schemas
        self.listeners = listeners
        self.listening = listeners.ports
        self._url = url
        self.cluster = node
        self.retention = retention
        self.tables = tables
        self.stall_dump = stall_dump
        self._forwarder = forwarder
        self._close_store = close_store
        self.history = history
        self._started = False

    def url(self) -> str:
        """The client API URL lookups return."""
        return self._url

    async def start(self) -> None:
        """Serve; on a failure everything started is stopped again and the error raised."""
        self._started = True
        try:
            await self.topics.start()
            # Topics' schema configurations are in place before any producer can publish.
            await self.schemas.registry.load()
            await self.schemas.load(self.topics.served())
            await self.tables.prepare()
            heap.settle("start")  # before any client or the cluster's pause detector waits on this loop
            await self.listeners.client.start()
            await self.listeners.admin.start()
            if self.listeners.metrics is not None:
                await self.listeners.metrics.serve()
            if self.listeners.native is not None:
                await self.listeners.native.serve()
            await self.cluster.start()
            self.retention.start()
            self.history.start()
            if self.listeners.console is not None:
                await self.listeners.console.serve()
            await self.tables.publish_location()
            self.tables.start()
            if self.stall_dump is not None:
                self.stall_dump.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        if self._started:
            await self.cluster.drain()
        if self.listeners.console is not None:
            await self.listeners.console.close()
        await self.history.close()
        await self.retention.close()
        await self.tables.close()
        if self.stall_dump is not None:
            await self.stall_dump.close()
        self.topics.stop_streams()
        if self.listeners.native is not None:
            await self.listeners.native.close()
        await asyncio.gather(self.listeners.client.stop(STOP_GRACE), self.listeners.admin.stop(STOP_GRACE))
        await self._forwarder.close()
        if self.listeners.metrics is not None:
            await self.listeners.metrics.close()
        try:
            await self.cluster.close()
            await self.topics.close()
            await self.tier.close()
            await self.cache.close()
        finally:
            if self._close_store is not None:
                await self._close_store()

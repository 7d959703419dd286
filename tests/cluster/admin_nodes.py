"""In-process admin nodes for the service and CLI tests: a broker's admin port (BrokerAdmin,
ClusterNamespaceAdmin, ClusterTopicAdmin) on a real grpc.aio server on a free loopback port, over its own
Topics (standalone: the topics it creates are assigned to it) and a ClusterView of the shared store; the
broker is registered with that port as its admin_addr, as membership registers it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from cluster_support import lead, register

from danube_fast.broker.cluster.admin.service import BrokerAdmin, ClusterNamespaceAdmin, ClusterTopicAdmin
from danube_fast.broker.cluster.moves import Move
from danube_fast.broker.cluster.view import CACHE_PREFIXES, ClusterView
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.services.forward import Forwarder
from danube_fast.broker.services.policy_admin import PolicyAdminService
from danube_fast.broker.topics import Topics
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.store import MetadataStore
from danube_fast.proto import DanubeAdmin_pb2 as admin
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.proto import PolicyAdmin_pb2_grpc as policy_grpc
from danube_fast.schema import SchemaRegistry, TopicSchemas
from danube_fast.storage import SyncPolicy, WalConfig
from danube_fast.testing.ports import free_port


def closed_port() -> int:
    """A loopback port nothing listens on (a registered broker that cannot be reached)."""
    return free_port()


@dataclass
class FakeRebalancer:
    """The leader's load manager as TriggerRebalance sees it: records its calls, proposes `moves`."""

    moves: list[Move]
    calls: list[tuple[bool, int | None]] = field(default_factory=list)
    fail: Exception | None = None

    async def rebalance(self, *, dry_run: bool, max_moves: int | None) -> list[Move]:
        self.calls.append((dry_run, max_moves))
        if self.fail is not None:
            raise self.fail
        return self.moves if max_moves is None else self.moves[:max_moves]


@dataclass
class Node:
    broker_id: int
    port: int
    topics: Topics
    schemas: TopicSchemas
    view: ClusterView
    channel: grpc.aio.Channel

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stub(self, service: str) -> Any:
        """`BrokerAdmin`, `NamespaceAdmin` or `TopicAdmin` stub on this node's admin port."""
        return getattr(admin_grpc, f"{service}Stub")(self.channel)


@contextlib.asynccontextmanager
async def admin_node(store: MetadataStore, broker_id: int, data_dir: Path,
                     rebalancer: FakeRebalancer | None = None) -> AsyncIterator[Node]:
    config = BrokerConfig(data_dir=str(data_dir), wal=WalConfig(sync=SyncPolicy("none")))
    topics = await Topics.open(config, store, broker_id)
    schemas = TopicSchemas(store, SchemaRegistry(store))
    cache = await LocalCache.start(store, CACHE_PREFIXES)
    view = ClusterView(cache)
    forwarder = Forwarder()
    server = grpc.aio.server()
    admin_grpc.add_BrokerAdminServicer_to_server(
        BrokerAdmin(view, store, broker_id, forwarder, rebalancer), server)
    admin_grpc.add_NamespaceAdminServicer_to_server(ClusterNamespaceAdmin(topics, view), server)
    admin_grpc.add_TopicAdminServicer_to_server(ClusterTopicAdmin(topics, schemas, view, store, forwarder),
                                                server)
    policy_grpc.add_PolicyAdminServicer_to_server(PolicyAdminService(topics, store, cache), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        await register(store, broker_id, admin_port=port)
        yield Node(broker_id, port, topics, schemas, view, channel)
    finally:
        await channel.close()
        await server.stop(None)
        await forwarder.close()
        await cache.close()
        await topics.close()


@contextlib.asynccontextmanager
async def two_brokers(tmp_path: Path, x_id: int, y_id: int, rebalancer: FakeRebalancer | None = None
                      ) -> AsyncIterator[tuple[MetadataStore, Node, Node]]:
    """Admin nodes X (the leader, with `rebalancer`) and Y over one embedded store, namespace ns1 created."""
    store = await EmbeddedStore.open(tmp_path / "meta.db")
    try:
        async with admin_node(store, x_id, tmp_path / "x", rebalancer) as x, \
                admin_node(store, y_id, tmp_path / "y") as y:
            await lead(store, x_id)
            await x.stub("NamespaceAdmin").CreateNamespace(admin.NamespaceRequest(name="ns1"))
            yield store, x, y
    finally:
        await store.close()

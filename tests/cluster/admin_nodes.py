"""In-process brokers for the admin service and CLI tests: real brokers (assemble()) over one shared metadata
store, on free loopback ports, standalone (the topics each creates are assigned to it). The cluster's
metadata is the tests' to write (brokers registered, drained or unreachable; who leads), so each broker's
place in the cluster is a node that does nothing instead of its membership; a broker is registered with its
admin port as membership registers it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from cluster_support import lead, register

from danube_fast.broker.assemble import assemble
from danube_fast.broker.cluster.moves import Move
from danube_fast.broker.cluster.view import ClusterView
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.context import BrokerContext
from danube_fast.broker.topic_registry import TopicRegistry
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.store import MetadataStore
from danube_fast.proto import DanubeAdmin_pb2 as admin
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.schema import TopicSchemas
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


class QuietNode:
    """A broker's place in the cluster that does nothing: the tests write what membership would."""

    async def start(self) -> None:
        pass

    async def drain(self) -> None:
        pass

    async def close(self) -> None:
        pass


@dataclass
class Node:
    broker_id: int
    port: int
    ctx: BrokerContext
    schemas: TopicSchemas
    view: ClusterView
    channel: grpc.aio.Channel

    @property
    def topics(self) -> TopicRegistry:
        return self.ctx.topics

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stub(self, service: str) -> Any:
        """`BrokerAdmin`, `NamespaceAdmin` or `TopicAdmin` stub on this node's admin port."""
        return getattr(admin_grpc, f"{service}Stub")(self.channel)


@contextlib.asynccontextmanager
async def admin_node(store: MetadataStore, broker_id: int, data_dir: Path,
                     rebalancer: FakeRebalancer | None = None) -> AsyncIterator[Node]:
    (data_dir / "broker_id").parent.mkdir(parents=True, exist_ok=True)
    (data_dir / "broker_id").write_text(f"{broker_id}\n")  # the id the tests registered it under
    config = BrokerConfig(data_dir=str(data_dir), wal=WalConfig(sync=SyncPolicy("none")),
                          broker_addr="127.0.0.1:0", admin_addr="127.0.0.1:0", prom_exporter="", fast_addr="",
                          console_addr="")
    broker = await assemble(config, store=store, node=QuietNode(), rebalancer=rebalancer)
    await broker.start()
    port = broker.listening.admin_port
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        await register(store, broker_id, admin_port=port)
        yield Node(broker_id, port, broker.ctx, broker.schemas, ClusterView(broker.cache), channel)
    finally:
        await channel.close()
        await broker.stop()


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

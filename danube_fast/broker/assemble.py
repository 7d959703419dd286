"""Building a broker: the one place its parts are made and given to each other.

Every part gets what it uses in its constructor and nothing is assigned to it afterwards; the order below is
the order of their dependencies (docs/ARCHITECTURE.md, "How a broker is assembled"). server.py runs what
assemble() returns; a test that needs a broker in its own process calls it too. The ports are bound here, so
that the registration a cluster node publishes names them, and served from Broker.start() on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from danube_fast.broker import namespaces as namespaces_
from danube_fast.broker.broker import Broker, Listeners, Listening, Node
from danube_fast.broker.clients import Clients, new_id
from danube_fast.broker.cluster.admin.service import BrokerAdmin, ClusterNamespaceAdmin, ClusterTopicAdmin
from danube_fast.broker.cluster.admin.stats import ClusterBrokerStats
from danube_fast.broker.cluster.admin.subscriptions import ClusterSubscriptionAdmin
from danube_fast.broker.cluster.admin.tables import ClusterTableAdmin
from danube_fast.broker.cluster.assignments import ClusterPlacement
from danube_fast.broker.cluster.moves import Rebalancer
from danube_fast.broker.cluster.node import ClusterNode
from danube_fast.broker.cluster.replication.service import ReplicationService
from danube_fast.broker.cluster.view import CACHE_PREFIXES, ClusterView
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.context import BrokerContext
from danube_fast.broker.dispatch.budget import ByteBudget, ReadBudget
from danube_fast.broker.history import History
from danube_fast.broker.message_ttl import MessageTtl
from danube_fast.broker.metrics import MetricsServer
from danube_fast.broker.namespaces import Namespaces
from danube_fast.broker.ownership import LocalPlacement, Placement
from danube_fast.broker.retention import Retention
from danube_fast.broker.services.consumer import ConsumerService
from danube_fast.broker.services.discovery import DiscoveryService, HealthService
from danube_fast.broker.services.fast import FastConsumerService, FastProducerService, FastTransportsService
from danube_fast.broker.services.fast_reader import FastReaderService
from danube_fast.broker.services.forward import Forwarder
from danube_fast.broker.services.native import NativeServer
from danube_fast.broker.services.policy_admin import PolicyAdminService
from danube_fast.broker.services.producer import ProducerService
from danube_fast.broker.services.schema import SchemaRegistryService
from danube_fast.broker.services.security_admin import SecurityAdminService
from danube_fast.broker.services.wire_guard import register, server_options
from danube_fast.broker.stall_dump import StallDump
from danube_fast.broker.table_worker import TableWorker
from danube_fast.broker.tables import TableWriter
from danube_fast.broker.tiering import Tier
from danube_fast.broker.topic_registry import TopicRegistry
from danube_fast.console.build import build_console
from danube_fast.meta import keys
from danube_fast.meta.connect import open_store
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import BrokerRegistration, TableCatalog
from danube_fast.meta.store import MetadataStore
from danube_fast.proto import BrokerStats_pb2_grpc as stats_grpc
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc
from danube_fast.proto import FastApi_pb2_grpc as fast_grpc
from danube_fast.proto import PolicyAdmin_pb2_grpc as policy_grpc
from danube_fast.proto import Replication_pb2_grpc as replication_grpc
from danube_fast.proto import SchemaRegistry_pb2_grpc as schema_grpc
from danube_fast.proto import SecurityAdmin_pb2_grpc as security_grpc
from danube_fast.proto import SubscriptionAdmin_pb2_grpc as subscription_grpc
from danube_fast.proto import TableAdmin_pb2_grpc as table_grpc
from danube_fast.schema import SchemaRegistry, TopicSchemas
from danube_fast.security.gate import Gate
from danube_fast.security.rbac import Authorizer
from danube_fast.security.revocation import DenyList
from danube_fast.security.tls import channel_credentials, server_credentials, server_ssl_context
from danube_fast.storage.log_manager import LogManager
from danube_fast.tables.catalog import cluster_catalog, file_io, standalone_catalog

# gRPC's own inbound limit sits well above the max_message_size policy: a request over gRPC's limit is
# refused with RESOURCE_EXHAUSTED, which the official client retries for ever (docs/WIRE.md D.11); one under
# it reaches the policy check and gets INVALID_ARGUMENT.
MIN_GRPC_RECEIVE = 64 * 1024 * 1024


class StartError(Exception):
    pass


async def assemble(config: BrokerConfig, *, store: MetadataStore | None = None, node: Node | None = None,
                   rebalancer: Rebalancer | None = None) -> Broker:
    """The broker `config` describes, built and bound to its ports; Broker.start() serves.

    `store`: a metadata store opened by the caller, who closes it (default: the one `config` names, opened
    here and closed by Broker.stop()). `node`: the broker's place in its cluster (default: a ClusterNode:
    membership, and in cluster mode the reconciler and the load manager); a test that writes the cluster's
    metadata itself gives one that does nothing. `rebalancer`: what TriggerRebalance asks (default: the
    ClusterNode's load manager in cluster mode, none standalone)."""
    os.makedirs(config.data_dir, exist_ok=True)
    broker_id = _broker_id(config.data_dir)
    close_store = None
    if store is None:
        store = await (open_store(config.cluster.metadata_store, access=config.cluster.etcd_access(),
                                  timeout=10.0) if config.clustered
                       else EmbeddedStore.open(config.metadata_path))
        close_store = store.close
    undo: list[Callable[[], Awaitable[Any]]] = []
    try:
        await namespaces_.bootstrap(store, config.policy)
        cache = await LocalCache.start(store, (*CACHE_PREFIXES, keys.security_prefix()))
        undo.append(cache.close)
        tier = await Tier.open(config, store, broker_id)
        undo.append(tier.close)
        cluster_placement = ClusterPlacement(config, cache, broker_id) if config.clustered else None
        placement: Placement = cluster_placement or LocalPlacement(broker_id)
        namespaces = Namespaces(store, cache, config.policy)
        logs = LogManager(config.wal_root, config.wal)
        clients = Clients()
        budget = ByteBudget(config.dispatch.broker_bytes)
        topics = TopicRegistry(config, store, cache, namespaces, logs, tier, placement, clients, budget,
                               broker_id)
        undo.append(topics.close)
        ctx = BrokerContext(config, broker_id, topics, namespaces, topics.subscriptions, clients, placement,
                            logs, budget, ReadBudget(budget))
        schemas = TopicSchemas(store, SchemaRegistry(store))
        retention = Retention(topics, namespaces, tier.objects, store, config.retention_check_ms / 1000,
                              ttl=MessageTtl(topics.subscriptions))
        c = config.cluster
        catalog = table_catalog(config)
        tables = TableWriter(topics, namespaces, store, catalog, config.tables, TableWorker(
            catalog, file_io(c.s3_endpoint, c.s3_region, c.s3_access_key, c.s3_secret_key), store,
            os.path.join(config.data_dir, "tables"), config.tables.worker_nice, config.tables.worker_threads))
        undo.append(tables.close)
        security = config.security
        forwarder = Forwarder(credentials=channel_credentials(
            security.ca_file or None, security.cert_file if security.verify_client else None,
            security.key_file if security.verify_client else None) if security.tls else None)
        undo.append(forwarder.close)
        gate = None
        if security.authenticates:
            def consumer_topic(consumer_id: int) -> str | None:
                consumer = clients.find_consumer(consumer_id)
                return None if consumer is None else consumer.subscription.topic_name

            privileged = [*security.super_admins, *security.broker_principals]
            gate = Gate(security, Authorizer(cache, privileged), consumer_topic, DenyList(cache))
        metrics = MetricsServer(ctx, retention, tables) if config.prom_exporter else None
        client, admin, listening = await _bind(config, gate, metrics, undo)
        native = None
        if config.native_addr:
            native = NativeServer(ctx, gate, server_ssl_context(security) if security.tls else None,
                                  keepalive_ms=config.fast_keepalive_ms,
                                  max_connections=config.fast_max_connections,
                                  max_per_principal=config.fast_max_connections_per_principal,
                                  inflight_bytes=config.fast_inflight_bytes, sendfile=config.fast_sendfile)
            undo.append(native.close)
            if metrics is not None and native.files is not None:
                metrics.register(native.files)
            listening = dataclasses.replace(
                listening, fast_port=await _listen(native.bind, config.native_addr, "--fast-addr"))
        history = History(topics)
        replication: ReplicationService | None = None
        console = None
        if config.console_listen:
            console = build_console(config, listening.admin_port, schemas.registry)
            undo.append(console.close)
            listening = dataclasses.replace(
                listening, console_port=await _listen(console.bind, config.console_listen, "--console-addr"))
        url = config.advertised_url  # a port 0 in the config is replaced by the bound one
        if url.endswith(":0"):
            url = url[:-1] + str(listening.client_port)
        # The native listener is advertised as set, or at the advertised address's host and its bound port.
        native_url = "" if listening.fast_port is None else config.fast_advertised_addr or \
            f"{url.split('://', 1)[-1].rpartition(':')[0]}:{listening.fast_port}"
        if native is not None:
            native.address = native_url  # what its LOOKUP answers for the topics served here
        if node is None:
            cluster = ClusterNode(config, store, cache, topics, logs,
                                  _registration(config, listening, url, native_url),
                                  cluster_placement, tier, lambda topic: schemas.load([topic]), namespaces,
                                  forwarder)
            node, rebalancer = cluster, rebalancer or cluster.load_manager
            if cluster.replication is not None:
                replication = ReplicationService(cluster.replication, ClusterView(cache), namespaces,
                                                 forwarder)
                if native is not None:
                    native.replicas = cluster.replication
        view = ClusterView(cache)
        client_services: list[tuple[Callable[[Any, grpc.aio.Server], None], object]] = [
            (pb_grpc.add_ProducerServiceServicer_to_server, ProducerService(ctx, schemas)),
            (pb_grpc.add_ConsumerServiceServicer_to_server, ConsumerService(ctx)),
            (pb_grpc.add_DiscoveryServicer_to_server, DiscoveryService(ctx, lambda: url)),
            (pb_grpc.add_HealthCheckServicer_to_server, HealthService(ctx)),
            (fast_grpc.add_FastProducerServicer_to_server, FastProducerService(ctx)),
            (fast_grpc.add_FastConsumerServicer_to_server, FastConsumerService(ctx)),
            (fast_grpc.add_FastReaderServicer_to_server, FastReaderService(ctx)),
            (fast_grpc.add_FastTransportsServicer_to_server, FastTransportsService(native_url, security.tls)),
        ]
        admin_services: list[tuple[Callable[[Any, grpc.aio.Server], None], object]] = [
            (admin_grpc.add_BrokerAdminServicer_to_server,
             BrokerAdmin(view, store, broker_id, forwarder, rebalancer)),
            (admin_grpc.add_NamespaceAdminServicer_to_server, ClusterNamespaceAdmin(ctx, view)),
            (admin_grpc.add_TopicAdminServicer_to_server,
             ClusterTopicAdmin(ctx, schemas, view, store, forwarder)),
            (security_grpc.add_SecurityAdminServicer_to_server, SecurityAdminService(store, cache)),
            (policy_grpc.add_PolicyAdminServicer_to_server, PolicyAdminService(ctx, store, cache)),
            (table_grpc.add_TableAdminServicer_to_server, ClusterTableAdmin(ctx, tables, view, forwarder)),
            (subscription_grpc.add_SubscriptionAdminServicer_to_server,
             ClusterSubscriptionAdmin(ctx, view, forwarder)),
            (stats_grpc.add_BrokerStatsServicer_to_server,
             ClusterBrokerStats(ctx, history, retention, tables, view, forwarder)),
        ]
        if replication is not None:
            admin_services.append((replication_grpc.add_ReplicationServicer_to_server, replication))
        for add, servicer in client_services:
            register(add, servicer, client, gate)
        for add, servicer in admin_services:
            register(add, servicer, admin, gate)
        # SchemaRegistry is served on both ports, as v0.7.3 does (docs/WIRE.md A.3, C.1); one servicer.
        registry = SchemaRegistryService(ctx, schemas)
        for server in (client, admin):
            register(schema_grpc.add_SchemaRegistryServicer_to_server, registry, server, gate)
        stall_dump = StallDump(config.stall_dump_ms / 1000) if config.stall_dump_ms else None
        listeners = Listeners(client, admin, metrics, listening, native, console)
        return Broker(config, ctx, store, cache, tier, schemas, listeners, url, node, retention, tables,
                      stall_dump, forwarder, close_store, history)
    except BaseException:
        for step in reversed(undo):
            with contextlib.suppress(Exception):
                await step()
        if close_store is not None:
            await close_store()
        raise


async def _listen(bind: Callable[[str, int], Awaitable[int]], addr: str, flag: str) -> int:
    """`bind(host, port)` of a listener that is not gRPC's; its bound port, or StartError naming `flag`."""
    host, _, port = addr.rpartition(":")
    try:
        return await bind(host, int(port))
    except OSError as e:
        raise StartError(f"cannot listen on {addr} ({flag}): {e}") from e


async def _bind(config: BrokerConfig, gate: Gate | None, metrics: MetricsServer | None,
                undo: list[Callable[[], Awaitable[Any]]]
                ) -> tuple[grpc.aio.Server, grpc.aio.Server, Listening]:
    """The client and admin gRPC servers and the metrics endpoint, on their ports (not serving yet)."""
    security = config.security
    receive = max(MIN_GRPC_RECEIVE, 2 * config.max_message_size)
    client = grpc.aio.server(options=server_options(receive))
    admin = grpc.aio.server(options=server_options())
    undo.append(lambda: client.stop(None))
    undo.append(lambda: admin.stop(None))
    credentials = server_credentials(security) if security.tls else None
    client_port = _bind_grpc(client, config.broker_addr, "--broker-addr", credentials)
    admin_port = _bind_grpc(admin, config.admin_addr, "--admin-addr", credentials)
    metrics_port = None
    if metrics is not None:
        undo.append(metrics.close)
        host, _, port = config.prom_exporter.rpartition(":")
        guard: dict[str, Any] = {}
        if security.tls and not security.metrics_open:
            # The metrics port follows the security mode unless `metrics_open` says otherwise: HTTPS in the
            # tls modes, and the Lookup permission cluster-wide when the broker checks identities.
            guard["ssl"] = server_ssl_context(security)
            if gate is not None:
                guard["admit"] = gate.admit_metrics
        try:
            metrics_port = await metrics.bind(host, int(port), **guard)
        except OSError as e:
            raise StartError(f"cannot serve metrics on {config.prom_exporter}: {e}") from e
    return client, admin, Listening(client_port, admin_port, metrics_port)


def _bind_grpc(server: grpc.aio.Server, addr: str, flag: str,
               credentials: grpc.ServerCredentials | None = None) -> int:
    try:
        port: int = (server.add_secure_port(addr, credentials) if credentials is not None
                     else server.add_insecure_port(addr))
    except RuntimeError as e:
        raise StartError(f"cannot listen on {addr} ({flag}): {e}") from e
    if port == 0:
        raise StartError(f"cannot listen on {addr} ({flag}): address in use or not local")
    return port


def _registration(config: BrokerConfig, listening: Listening, url: str, native_url: str
                  ) -> BrokerRegistration:
    """What membership publishes about this broker: its bound ports, under the configured hosts."""
    admin = config.admin_advertised_addr or config.admin_addr.rpartition(":")[0] + f":{listening.admin_port}"
    prom = "" if listening.metrics_port is None else \
        config.prom_exporter.rpartition(":")[0] + f":{listening.metrics_port}"
    scheme = "https://" if config.security.tls else "http://"
    return BrokerRegistration(admin_addr=scheme + admin, advertised_addr=url.split("//", 1)[1],
                              broker_addr=url, prom_exporter=prom, fast_addr=native_url)


def table_catalog(config: BrokerConfig) -> TableCatalog:
    """Where topic tables are committed (docs/TABLES.md): standalone, the settings or a SQLite catalog under
    the data dir; a cluster, the settings or the catalog on the metadata store, files beside the objects."""
    tables = config.tables
    if config.clustered:
        return cluster_catalog(config.object_store, tables.catalog_uri, tables.warehouse)
    return standalone_catalog(config.data_dir, tables.catalog_uri, tables.warehouse)


def _broker_id(data_dir: str) -> int:
    """This broker's id, kept in the data dir so that a restart is the same broker (its topics are assigned
    to it under /cluster/brokers/{id}/)."""
    path = os.path.join(data_dir, "broker_id")
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except FileNotFoundError:
        pass
    except ValueError as e:
        raise StartError(f"{path} does not hold a broker id: {e}") from e
    value = new_id()
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"{value}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return value

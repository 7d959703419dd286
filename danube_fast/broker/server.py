"""The broker process: metadata store, topics, the gRPC servers and the metrics endpoint, with an orderly
stop.

Start order: data dir, broker id, embedded metadata store, topics (namespaces, WAL recovery, subscriptions and
cursors), then the listeners; the "broker ready" line is logged only once every listener is bound. Stop order
(SIGTERM or SIGINT): end consumer streams (clients re-lookup), stop accepting RPCs and let running ones
finish, flush cursors, fsync and close every WAL, close the store; exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
from dataclasses import dataclass
from typing import Any

import grpc

from danube_fast.broker.clients import new_id
from danube_fast.broker.cluster.admin.service import BrokerAdmin, ClusterNamespaceAdmin, ClusterTopicAdmin
from danube_fast.broker.cluster.admin.tables import ClusterTableAdmin
from danube_fast.broker.cluster.assignments import ClusterPlacement
from danube_fast.broker.cluster.node import ClusterNode
from danube_fast.broker.cluster.view import CACHE_PREFIXES, ClusterView
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.metrics import MetricsServer
from danube_fast.broker.ownership import LocalPlacement
from danube_fast.broker.retention import Retention
from danube_fast.broker.services.consumer import ConsumerService
from danube_fast.broker.services.discovery import DiscoveryService, HealthService
from danube_fast.broker.services.fast import FastConsumerService, FastProducerService
from danube_fast.broker.services.fast_reader import FastReaderService
from danube_fast.broker.services.forward import Forwarder
from danube_fast.broker.services.policy_admin import PolicyAdminService
from danube_fast.broker.services.producer import ProducerService
from danube_fast.broker.services.schema import SchemaRegistryService
from danube_fast.broker.services.security_admin import SecurityAdminService
from danube_fast.broker.services.wire_guard import register, server_options
from danube_fast.broker.stall_dump import StallDump
from danube_fast.broker.tables import TableWriter
from danube_fast.broker.tiering import Tier
from danube_fast.broker.topic import Topic
from danube_fast.broker.topics import Topics
from danube_fast.meta import keys
from danube_fast.meta.connect import open_store
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import BrokerRegistration, TableCatalog
from danube_fast.meta.store import MetadataStore
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc
from danube_fast.proto import FastApi_pb2_grpc as fast_grpc
from danube_fast.proto import PolicyAdmin_pb2_grpc as policy_grpc
from danube_fast.proto import SchemaRegistry_pb2_grpc as schema_grpc
from danube_fast.proto import SecurityAdmin_pb2_grpc as security_grpc
from danube_fast.proto import TableAdmin_pb2_grpc as table_grpc
from danube_fast.schema import SchemaRegistry, TopicSchemas
from danube_fast.security.gate import Gate
from danube_fast.security.rbac import Authorizer
from danube_fast.security.tls import channel_credentials, metrics_ssl_context, server_credentials
from danube_fast.tables.catalog import cluster_catalog, file_io, standalone_catalog

log = logging.getLogger("danube_fast.broker")

STOP_GRACE = 2.0  # seconds running RPCs get to finish at shutdown
# gRPC's own inbound limit sits well above the max_message_size policy: a request over gRPC's limit is
# refused with RESOURCE_EXHAUSTED, which the official client retries for ever (docs/WIRE.md D.11); one under
# it reaches the policy check and gets INVALID_ARGUMENT.
MIN_GRPC_RECEIVE = 64 * 1024 * 1024


class StartError(Exception):
    pass


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


@dataclass
class Listening:
    client_port: int
    admin_port: int
    metrics_port: int | None


class Broker:
    def __init__(self, config: BrokerConfig, store: MetadataStore, topics: Topics, cache: LocalCache) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.cache = cache  # /cluster/ and /namespaces/: the admin API's ClusterView and the cluster node
        security = config.security
        self._forwarder = Forwarder(credentials=channel_credentials(
            security.ca_file or None, security.cert_file if security.verify_client else None,
            security.key_file if security.verify_client else None) if security.tls else None)
        self.schemas = TopicSchemas(store, SchemaRegistry(store))
        receive = max(MIN_GRPC_RECEIVE, 2 * config.max_message_size)
        self._client = grpc.aio.server(options=server_options(receive))
        self._admin = grpc.aio.server(options=server_options())
        tier = topics.tier
        self.retention = Retention(topics, tier.objects, store, config.retention_check_ms / 1000) \
            if isinstance(tier, Tier) else None
        c = config.cluster
        self.tables = TableWriter(topics, store, table_catalog(config), config.tables,
                                  file_io(c.s3_endpoint, c.s3_region, c.s3_access_key, c.s3_secret_key))
        self._metrics = MetricsServer(topics, self.retention, self.tables) if config.prom_exporter else None
        self.stall_dump = StallDump(config.stall_dump_ms / 1000) if config.stall_dump_ms else None
        self.gate: Gate | None = None
        self.listening: Listening | None = None
        self.cluster: ClusterNode | None = None
        self.broker_admin: BrokerAdmin | None = None

    @classmethod
    async def start(cls, config: BrokerConfig) -> Broker:
        os.makedirs(config.data_dir, exist_ok=True)
        broker_id = _broker_id(config.data_dir)
        store: MetadataStore
        if config.clustered:
            store = await open_store(config.cluster.metadata_store, timeout=10.0)
        else:
            store = await EmbeddedStore.open(config.metadata_path)
        tier = cache = None
        try:
            cache = await LocalCache.start(store, (*CACHE_PREFIXES, keys.security_prefix()))
            cluster_placement = ClusterPlacement(config, cache, broker_id) if config.clustered else None
            placement = cluster_placement or LocalPlacement(broker_id)
            tier = await Tier.open(config, store, broker_id)
            topics = await Topics.open(config, store, broker_id, tier, placement)
        except BaseException:
            if tier is not None:
                await tier.close()
            if cache is not None:
                await cache.close()
            await store.close()
            raise
        broker = cls(config, store, topics, cache)
        try:
            await broker._listen()
            # Registered once the listeners are bound (their ports are what the registration says).
            broker.cluster = ClusterNode(config, store, topics, cache, broker.registration(),
                                         cluster_placement)
            broker.cluster.on_loaded = broker._loaded
            await broker.cluster.start()
            assert broker.broker_admin is not None
            broker.broker_admin.rebalancer = broker.cluster.load_manager
            if broker.retention is not None:
                broker.retention.start()
            await broker.tables.publish_location()
            broker.tables.start()
            if broker.stall_dump is not None:
                broker.stall_dump.start()
        except BaseException:
            await broker.stop()
            raise
        return broker

    async def _loaded(self, topic: Topic) -> None:
        """A topic placed here: its schema configuration applies before it serves anyone."""
        await self.schemas.load([topic])

    def url(self) -> str:
        """The client API URL lookups return (a port 0 in the config is replaced by the bound one)."""
        url = self.config.advertised_url
        if url.endswith(":0") and self.listening is not None:
            url = url[:-1] + str(self.listening.client_port)
        return url

    def registration(self) -> BrokerRegistration:
        assert self.listening is not None
        admin = self.config.admin_addr.rpartition(":")[0] + f":{self.listening.admin_port}"
        prom = "" if self.listening.metrics_port is None else \
            self.config.prom_exporter.rpartition(":")[0] + f":{self.listening.metrics_port}"
        scheme = "https://" if self.config.security.tls else "http://"
        return BrokerRegistration(admin_addr=scheme + admin, advertised_addr=self.url().split("//", 1)[1],
                                  broker_addr=self.url(), prom_exporter=prom)

    async def _listen(self) -> None:
        # Topics' schema configurations are in place before any producer can publish.
        await self.schemas.registry.load()
        await self.schemas.load(self.topics.served())
        client, admin = self._client, self._admin
        topics = self.topics
        security = self.config.security
        if security.authenticates:
            privileged = [*security.super_admins, *security.broker_principals]
            self.gate = Gate(security, Authorizer(self.cache, privileged), self._consumer_topic)
        gate = self.gate
        register(pb_grpc.add_ProducerServiceServicer_to_server, ProducerService(topics, self.schemas), client,
                 gate)
        register(pb_grpc.add_ConsumerServiceServicer_to_server, ConsumerService(self.topics), client, gate)
        register(pb_grpc.add_DiscoveryServicer_to_server,
                 DiscoveryService(self.topics, self.topics.placement, self.url), client, gate)
        register(pb_grpc.add_HealthCheckServicer_to_server, HealthService(self.topics), client, gate)
        register(fast_grpc.add_FastProducerServicer_to_server, FastProducerService(self.topics), client, gate)
        register(fast_grpc.add_FastConsumerServicer_to_server, FastConsumerService(self.topics), client, gate)
        register(fast_grpc.add_FastReaderServicer_to_server, FastReaderService(self.topics), client, gate)
        view = ClusterView(self.cache)
        self.broker_admin = BrokerAdmin(view, self.store, self.topics.broker_id, self._forwarder, None)
        register(admin_grpc.add_BrokerAdminServicer_to_server, self.broker_admin, admin, gate)
        register(admin_grpc.add_NamespaceAdminServicer_to_server, ClusterNamespaceAdmin(topics, view), admin,
                 gate)
        register(admin_grpc.add_TopicAdminServicer_to_server,
                 ClusterTopicAdmin(self.topics, self.schemas, view, self.store, self._forwarder), admin, gate)
        register(security_grpc.add_SecurityAdminServicer_to_server,
                 SecurityAdminService(self.store, self.cache), admin, gate)
        register(policy_grpc.add_PolicyAdminServicer_to_server,
                 PolicyAdminService(self.topics, self.store, self.cache), admin, gate)
        register(table_grpc.add_TableAdminServicer_to_server,
                 ClusterTableAdmin(self.topics, self.tables, view, self._forwarder), admin, gate)
        # SchemaRegistry is served on both ports, as v0.7.3 does (docs/WIRE.md A.3, C.1); one servicer.
        registry = SchemaRegistryService(self.topics, self.schemas)
        for server in (client, admin):
            register(schema_grpc.add_SchemaRegistryServicer_to_server, registry, server, gate)
        credentials = server_credentials(security) if security.tls else None
        client_port = self._bind(self._client, self.config.broker_addr, "--broker-addr", credentials)
        admin_port = self._bind(self._admin, self.config.admin_addr, "--admin-addr", credentials)
        await self._client.start()
        await self._admin.start()
        metrics_port = None
        if self._metrics is not None:
            host, _, port = self.config.prom_exporter.rpartition(":")
            try:
                metrics_port = await self._metrics.start(host, int(port), **self._metrics_guard())
            except OSError as e:
                raise StartError(f"cannot serve metrics on {self.config.prom_exporter}: {e}") from e
        self.listening = Listening(client_port, admin_port, metrics_port)

    def _consumer_topic(self, consumer_id: int) -> str | None:
        consumer = self.topics.clients.find_consumer(consumer_id)
        return None if consumer is None else consumer.subscription.topic_name

    def _metrics_guard(self) -> dict[str, Any]:
        """The metrics port follows the security mode unless `metrics_open` says otherwise: HTTPS in the tls
        modes, and a token with the Lookup permission cluster-wide when the broker checks identities."""
        security = self.config.security
        if not security.tls or security.metrics_open:
            return {}
        guard: dict[str, Any] = {"ssl": metrics_ssl_context(security)}
        gate = self.gate
        if gate is not None:
            guard["admit"] = gate.admit_metrics
        return guard

    @staticmethod
    def _bind(server: grpc.aio.Server, addr: str, flag: str,
              credentials: grpc.ServerCredentials | None = None) -> int:
        try:
            port: int = (server.add_secure_port(addr, credentials) if credentials is not None
                         else server.add_insecure_port(addr))
        except RuntimeError as e:
            raise StartError(f"cannot listen on {addr} ({flag}): {e}") from e
        if port == 0:
            raise StartError(f"cannot listen on {addr} ({flag}): address in use or not local")
        return port

    async def stop(self) -> None:
        if self.cluster is not None:
            await self.cluster.drain()
        if self.retention is not None:
            await self.retention.close()
        await self.tables.close()
        if self.stall_dump is not None:
            await self.stall_dump.close()
        self.topics.stop_streams()
        await asyncio.gather(self._client.stop(STOP_GRACE), self._admin.stop(STOP_GRACE))
        await self._forwarder.close()
        if self._metrics is not None:
            await self._metrics.close()
        try:
            if self.cluster is not None:
                await self.cluster.close()
            await self.topics.close()
            await self.topics.tier.close()
            await self.cache.close()
        finally:
            await self.store.close()


def table_catalog(config: BrokerConfig) -> TableCatalog:
    """Where topic tables are committed (docs/TABLES.md): standalone, the settings or a SQLite catalog under
    the data dir; a cluster, the settings or the catalog on the metadata store, files beside the objects."""
    tables = config.tables
    if config.clustered:
        return cluster_catalog(config.object_store, tables.catalog_uri, tables.warehouse)
    return standalone_catalog(config.data_dir, tables.catalog_uri, tables.warehouse)


def raise_open_files_limit() -> int:
    """Lift this process's soft limit on open files to its hard limit, and return it. Every Reliable topic
    holds a descriptor per segment and every client a socket; the usual soft limit of 1024 would stop a
    broker near a thousand topics with EMFILE, while the hard limit (often 2^19) is the administrator's
    real ceiling (Go's runtime lifts it the same way since 1.19)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


async def serve(config: BrokerConfig) -> None:
    """Run until SIGTERM or SIGINT."""
    open_files = raise_open_files_limit()
    if open_files < 16_384:
        log.warning("open files are limited to %d for this process (RLIMIT_NOFILE): each Reliable topic "
                    "holds a descriptor per segment; raise the hard limit for thousands of topics",
                    open_files)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    broker = await Broker.start(config)
    listening = broker.listening
    assert listening is not None
    host = config.broker_addr.rpartition(":")[0]
    admin_host = config.admin_addr.rpartition(":")[0]
    metrics = (f"{config.prom_exporter.rpartition(':')[0]}:{listening.metrics_port}"
               if listening.metrics_port is not None else "off")
    failed = broker.topics.broken()
    broken = f" ({len(failed)} could not be loaded: see above)" if failed else ""
    log.info("broker ready: Danube API on %s:%d (advertised %s), admin on %s:%d, metrics on %s, data in %s, "
             "%d topics%s", host, listening.client_port, broker.url(), admin_host, listening.admin_port,
             metrics, os.path.abspath(config.data_dir), len(broker.topics.names()), broken)
    await stopping.wait()
    log.info("stopping: ending streams, flushing cursors and WALs")
    await broker.stop()
    log.info("stopped")

"""Broker settings: defaults, then a TOML config file, then command-line flags (each overrides the last).

Every setting with its default (tests/unit/test_config_sample.py loads this sample and holds it to the
dataclasses below: a setting added there must be added here). Three memory settings default to "auto": the
dataclass's value, lowered to a share of the memory the broker may use when that is under 4 GiB
(broker/memory.py); a number, in the file, sets them:

```toml
[broker]
mode = "standalone"
data_dir = "./danube-data"
broker_addr = "127.0.0.1:6650"      # the client API (Danube's ProducerService, ConsumerService, ...)
admin_addr = "127.0.0.1:50051"
prom_exporter = "127.0.0.1:9040"   # "" disables the Prometheus endpoint
fast_addr = "auto"                # the native transport's listener (docs/TRANSPORT.md): "auto" = on in
                                  # standalone mode (broker_addr's host, port 6653), off in a cluster;
                                  # "" = off
fast_keepalive_ms = 30000         # its keepalive period: 3 silent periods close a connection
fast_max_connections = 10000      # native connections this broker serves at once
fast_max_connections_per_principal = 1000  # ... of one principal, when the broker checks identities
fast_sendfile = true              # catch-up reads of segment files go out with sendfile() on plaintext
                                  # connections (docs/TRANSPORT.md "Catch-up with sendfile")
fast_inflight_bytes = "auto"      # produce bytes unacknowledged on all native connections together;
                                  # beyond it they stop reading until acks drain; auto = 256 MiB, or 1/16
                                  # of usable memory when smaller (at least 16 MiB)
console_addr = "auto"             # the web console (docs/CONSOLE.md): "auto" = 127.0.0.1:9080 in standalone
                                  # mode, off in a cluster; "" = off
advertised_addr = ""              # what lookups return; defaults to broker_addr
fast_advertised_addr = ""         # the native transport's address told to clients; defaults to
                                  # advertised_addr's host and the port fast_addr bound
admin_advertised_addr = ""        # the admin port's address registered for the other brokers (forwarded
                                  # admin calls, replication); defaults to admin_addr's host and bound port
max_message_size = 10485760       # the gRPC inbound limit is at least twice this (64 MiB minimum)
malloc_keep_bytes = "auto"        # freed memory glibc keeps for reuse before giving it back to the kernel
                                  # (danube_fast/allocator.py); 0 = glibc's defaults; auto = 256 MiB, or
                                  # 1/16 of usable memory when smaller (at least 16 MiB)
retention_check_ms = 60000        # how often the owner applies retention to its topics (docs/RETENTION.md)
stall_dump_ms = 0                 # an event loop stalled this long logs where it is stuck
                                  # (broker/stall_dump.py); 0 = off

[wal]
sync = "always"                   # always | interval(MS) | none   (see storage/config.py)
segment_bytes = 134217728
segment_ms = 0                    # roll a segment this old at its next append; 0 = by size only
index_interval_bytes = 4096       # one sparse index entry per this many bytes of a segment
index_max_bytes = 1048576         # the active segment's index file (sparse: blocks reserved as it fills)
max_group_bytes = 16777216        # one write + fsync covers at most this much
linger_us = 1000                  # with appends waiting, wait this long for more before a small write;
                                  # 0 = off
retain_bytes = 1073741824         # uploaded segments kept locally (newest first) per topic; 0 = none
io_threads = 0                    # threads writing and fsyncing every topic's WAL (storage/io_pool.py);
                                  # 0 = 4 per core (at least 4, at most 32)
idle_release_ms = 300000          # a topic's log unused this long gives back its cache, descriptors and
                                  # index mappings until the next append or read; 0 = never
direct_io = true                  # with sync = always, append with O_DIRECT (half the kernel time per
                                  # fsync'd group; docs/ARCHITECTURE.md "Direct appends")
direct_reads = false              # with direct appends, read with O_DIRECT too: less CPU per byte, but
                                  # readers no longer share cached reads (docs/ARCHITECTURE.md "Direct reads")
cache_bytes = 1073741824          # recent committed records kept in memory for readers, per topic ...
cache_total_bytes = "auto"        # ... and for every topic together, the oldest going first
                                  # (docs/ARCHITECTURE.md "Tail cache"); auto = 1 GiB, or 1/4 of usable
                                  # memory when smaller (at least 16 MiB)

[dispatch]
window = 1000                     # reliable: unacknowledged messages in flight per consumer
ack_timeout_ms = 30000
nack_base_delay_ms = 1000         # redelivery delay after the n-th nack: base * 2^(n-1), capped
nack_max_delay_ms = 60000
max_redeliveries = 5              # then the message goes to the dead-letter topic <topic>-dlq
cursor_flush_acks = 1000
cursor_flush_ms = 5000
buffer = 1000                     # non-reliable: messages buffered per consumer before drops
idle_subscription_ms = 60000      # non-reliable subscriptions without consumers are removed after this
window_bytes = 16777216           # per consumer, both APIs: bytes delivered and not acknowledged (reliable)
                                  # or queued (non-reliable); one message bigger than this still goes, alone.
                                  # A fast-API consumer asking a bigger window_bytes gets this one
broker_bytes = "auto"             # every consumer together: bytes read for delivery and not yet acknowledged
                                  # (non-reliable: queued). Beyond it reliable dispatch leaves the data in the
                                  # WAL for later and non-reliable dispatch drops; a subscription holding
                                  # nothing still gets one read (see broker/dispatch/budget.py); auto =
                                  # 256 MiB, or 1/16 of usable memory when smaller (at least 16 MiB)
max_delivery_delay_ms = 864000000 # a record's danube-deliver-at may lie this far ahead (ten days), no further
delayed_index_records = 1000000   # per subscription: delayed records indexed in memory (16 B each); beyond
                                  # it the latest are read again from the log when their time comes

[cluster]                         # cluster mode (--mode cluster); standalone uses only object_store
name = "danube"
metadata_store = ""               # etcd://host:port[,host:port]; required in cluster mode; etcd over TLS:
                                  # etcd://https://host:port[,...] (docs/SECURITY.md, "The metadata store")
etcd_ca_file = ""                 # the CA that signed etcd's certificate; set, it turns TLS on ("" with an
                                  # https:// endpoint: the system's CAs)
etcd_cert_file = ""               # a client certificate and key for etcd's --client-cert-auth
etcd_key_file = ""
etcd_user = ""                    # etcd's authentication: the user, and its password from etcd_password,
etcd_password = ""                # or the file etcd_password_file names, or else the environment variable
etcd_password_file = ""           # DANUBE_ETCD_PASSWORD (no password in a config file)
object_store = ""                 # s3://bucket/prefix or a folder all brokers share; "" = DATA_DIR/objects
s3_endpoint = ""                  # e.g. http://127.0.0.1:9000 for MinIO or moto; "" = AWS
s3_region = "us-east-1"
s3_access_key = ""                # "" = the usual AWS environment / config chain
s3_secret_key = ""
lease_ttl_s = 10                  # a broker silent this long loses its registration and its topics
load_report_ms = 5000
rebalance_cooldown_ms = 60000     # at most one automatic rebalance per cooldown
rebalance_threshold = 2           # rebalance at this difference in topics between the busiest and idlest
upload_interval_ms = 30000        # committed records reach the object tier at least this often
reserve_offsets = 10000000        # offsets an owner reserves per metadata write (see cluster/handoff.py)
assign_wait_ms = 5000             # a producer creating a topic waits this long for its assignment
gap_wait_ms = 600000              # readers wait this long for a dead owner's offsets to be recovered
producer_gap_wait_ms = 30000      # idempotent producers wait this long for them (broker/sequences.py)
replica_lag_ms = 10000            # a follower not caught up this long leaves the in-sync copies of a
                                  # replicated topic (docs/REPLICATION.md); acks wait for it until then
replica_check_ms = 5000           # how often an owner reads its topics' replicationFactor

[tables]                          # topic tables: Iceberg tables of Reliable topics whose policy sets
lag_ms = 10000                    # tableMode (docs/TABLES.md); a record is in its table about this soon
catalog_uri = ""                  # the Iceberg SQL catalog (SQLAlchemy URI); "" = DATA_DIR/tables/catalog.db
warehouse = ""                    # where table files go; "" = DATA_DIR/tables/warehouse
commit_bytes = "auto"             # record batches per commit, at most; auto = 256 MiB, or 1/16 of usable
                                  # memory when smaller (at least 16 MiB)
row_group_rows = 1048576          # Parquet row group size, in rows
compression = "zstd"              # new tables' Parquet codec: zstd | lz4 | snappy | gzip | uncompressed
fail_on_data_loss = true          # records deleted before the table got them stop it (false: skip them)
policy_check_ms = 5000            # how often the writer reads which topics want a table
maintenance_ms = 60000            # how often each table is compacted, expired and swept
target_file_bytes = 134217728     # compaction joins files under half this into files of about this
compact_min_files = 8             # small files a partition needs before it is compacted
snapshot_keep_ms = 3600000        # snapshots, and the files only they name, kept this long for readers
orphan_grace_ms = 600000          # files no snapshot names (a crashed commit's) are deleted this old
drop_with_topic = false           # a deleted topic's tables are dropped with their files (false: kept)
worker_nice = 10                  # the table worker process runs this much nicer than the broker (0-19)
worker_threads = 1                # the table worker's threads: Arrow's pools, Parquet files encoded at once

[security]                        # TLS, mTLS, JWT and RBAC: docs/SECURITY.md; every setting's meaning is in
mode = "none"                     # danube_fast/security/config.py (none | tls | tls_jwt)
cert_file = ""
key_file = ""
ca_file = ""
verify_client = false
jwt_algorithms = ["HS256"]
jwt_secret_file = ""
jwt_public_key_file = ""
jwt_jwks_file = ""
jwt_issuer = ""
jwt_audience = ""
jwt_leeway_s = 30
super_admins = []
broker_principals = []
metrics_open = false

[policy]                          # the policy a namespace gets when it is created (default and system: at the
max_message_size = 10485760       # first start); 0 = unlimited
max_producers_per_topic = 0
max_consumers_per_topic = 0
max_subscriptions_per_topic = 0
max_consumers_per_subscription = 0
max_publish_rate = 0              # messages per second a topic accepts (producers are slowed); 0 = unlimited
max_subscription_dispatch_rate = 0  # messages per second a subscription is sent; 0 = unlimited
retention_time_minutes = 0        # retentionTimeInMinutes: records older than this go; 0 = keep them
retention_size_mb = 0             # retentionSizeInMB: the oldest objects beyond this many MiB go; 0 = no cap
table_mode = "none"               # tableMode: none | envelope | schema (docs/TABLES.md)
table_partitioning = "hour"       # tablePartitioning: hour | day | month | none, of the publish time (and
                                  # the topic's partition, for a partitioned topic)
table_partition_by = ""           # tablePartitionBy: columns too, e.g. "region, bucket(16, user_id)"
table_retention_minutes = 0       # tableRetentionInMinutes: the table keeps rows this long; 0 = as the topic
table_retention_size_mb = 0       # tableRetentionSizeInMB: the table's oldest whole periods go beyond this
                                  # MiB of files; 0 = as the topic (retention_size_mb)
message_ttl_seconds = 0           # messageTTLInSeconds: records older than this are acknowledged for every
                                  # subscription (docs/SUBSCRIPTIONS.md); 0 = never
replication_factor = 0            # replicationFactor: brokers keeping a Reliable topic's log (cluster mode,
                                  # docs/REPLICATION.md); 0 = 1, this broker alone
min_insync_replicas = 0           # minInSyncReplicas: copies a record is on before its ack; 0 = 1
```
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from danube_fast import deliver_at
from danube_fast.broker import memory
from danube_fast.meta.etcd_access import EtcdAccess, EtcdAccessError
from danube_fast.meta.resources import Policy
from danube_fast.security.config import SecurityConfig, SecurityConfigError
from danube_fast.storage.config import SyncPolicy, WalConfig
from danube_fast.tables.config import TablesConfig

MAX_SEGMENT_BYTES = 1 << 30  # the WAL's limit (_wal.pyx MAX_SEGMENT: positions are u32)
SECTIONS = ("broker", "wal", "dispatch", "policy", "cluster", "security", "tables")
# A memory setting (memory.SHARES) at this value, or left out, is sized from usable memory by `load`. In the
# dataclasses these settings hold their largest default: a config built in code (tests, the bench's own
# processes) is not sized.
AUTO = "auto"

log = logging.getLogger("danube_fast.broker")
# The fields of EtcdAccess as this file calls them, for its messages.
ETCD_SETTINGS = {"ca_file": "[cluster] etcd_ca_file", "cert_file": "[cluster] etcd_cert_file",
                 "key_file": "[cluster] etcd_key_file", "user": "[cluster] etcd_user",
                 "password": "[cluster] etcd_password", "password_file": "[cluster] etcd_password_file"}


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class DispatchConfig:
    window: int = 1000
    ack_timeout_ms: int = 30_000
    nack_base_delay_ms: int = 1000
    nack_max_delay_ms: int = 60_000
    max_redeliveries: int = 5
    cursor_flush_acks: int = 1000
    cursor_flush_ms: int = 5000
    buffer: int = 1000
    idle_subscription_ms: int = 60_000  # non-reliable subscriptions without consumers are reaped after this
    # Memory follows bytes, not message counts: 1,000 messages of 1 MiB per stalled consumer took a broker
    # to 1.5 GiB with two of them.
    window_bytes: int = 16 * 1024 * 1024
    broker_bytes: int = 256 * 1024 * 1024  # the most "auto" gives (memory.SHARES)
    max_delivery_delay_ms: int = deliver_at.DEFAULT_MAX_DELAY_MS
    delayed_index_records: int = 1_000_000  # dispatch/delays.py: what bounds a subscription's delay index


@dataclass(frozen=True)
class ClusterConfig:
    name: str = "danube"
    metadata_store: str = ""
    etcd_ca_file: str = ""
    etcd_cert_file: str = ""
    etcd_key_file: str = ""
    etcd_user: str = ""
    etcd_password: str = field(default="", repr=False)
    etcd_password_file: str = ""
    object_store: str = ""
    s3_endpoint: str = ""
    s3_region: str = "us-east-1"
    s3_access_key: str = ""
    s3_secret_key: str = ""
    lease_ttl_s: int = 10
    load_report_ms: int = 5000
    rebalance_cooldown_ms: int = 60_000
    rebalance_threshold: int = 2
    upload_interval_ms: int = 30_000
    reserve_offsets: int = 10_000_000
    assign_wait_ms: int = 5000
    gap_wait_ms: int = 600_000
    producer_gap_wait_ms: int = 30_000
    replica_lag_ms: int = 10_000
    replica_check_ms: int = 5000

    def etcd_access(self) -> EtcdAccess:
        """How the broker reaches etcd (TLS, a user); its password is resolved when the store opens."""
        return EtcdAccess(self.etcd_ca_file, self.etcd_cert_file, self.etcd_key_file, self.etcd_user,
                          self.etcd_password, self.etcd_password_file)


FAST_PORT = 6653  # the native transport's port when fast_addr is "auto" (standalone)
CONSOLE_AUTO = "127.0.0.1:9080"  # the web console when console_addr is "auto" (standalone): loopback only


@dataclass(frozen=True)
class BrokerConfig:
    mode: str = "standalone"
    data_dir: str = "./danube-data"
    broker_addr: str = "127.0.0.1:6650"
    admin_addr: str = "127.0.0.1:50051"
    prom_exporter: str = "127.0.0.1:9040"
    fast_addr: str = "auto"  # the native transport (docs/TRANSPORT.md); where it listens: `native_addr`
    fast_keepalive_ms: int = 30_000
    fast_max_connections: int = 10_000
    fast_max_connections_per_principal: int = 1000
    fast_sendfile: bool = True
    fast_inflight_bytes: int = 256 * 1024 * 1024  # the most "auto" gives (memory.SHARES)
    console_addr: str = "auto"  # the web console; where it listens: `console_listen`
    advertised_addr: str = ""
    fast_advertised_addr: str = ""
    admin_advertised_addr: str = ""
    max_message_size: int = 10 * 1024 * 1024
    malloc_keep_bytes: int = 256 * 1024 * 1024  # the most "auto" gives (memory.SHARES)
    retention_check_ms: int = 60_000
    stall_dump_ms: int = 0
    wal: WalConfig = field(default_factory=WalConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    policy: Policy = field(default_factory=Policy)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    tables: TablesConfig = field(default_factory=TablesConfig)

    @property
    def clustered(self) -> bool:
        return self.mode == "cluster"

    @property
    def native_addr(self) -> str:
        """Where the native transport listens: `fast_addr`, or for "auto" broker_addr's host at FAST_PORT in
        standalone mode and nowhere ("") in a cluster, whose brokers each need an address set."""
        if self.fast_addr != "auto":
            return self.fast_addr
        return "" if self.clustered else f"{self.broker_addr.rpartition(':')[0]}:{FAST_PORT}"

    @property
    def console_listen(self) -> str:
        """Where the web console listens: `console_addr`, or for "auto" loopback in standalone mode and
        nowhere ("") in a cluster (a console there is set per broker, docs/CONSOLE.md)."""
        if self.console_addr != "auto":
            return self.console_addr
        return "" if self.clustered else CONSOLE_AUTO

    @property
    def object_store(self) -> str:
        return self.cluster.object_store or os.path.join(self.data_dir, "objects")

    @property
    def advertised_url(self) -> str:
        """The URL lookups return: dialable by the client, `http://host:port` (docs/WIRE.md D.2)."""
        scheme = "https://" if self.security.tls else "http://"
        return scheme + (self.advertised_addr or self.broker_addr)

    @property
    def metadata_path(self) -> str:
        return os.path.join(self.data_dir, "metadata.db")

    @property
    def wal_root(self) -> str:
        return os.path.join(self.data_dir, "wal")


def _typed(section: str, data: dict[str, Any], cls: type[Any], base: Any) -> Any:
    known = {f.name: f for f in fields(cls)}
    changes: dict[str, Any] = {}
    for name, value in data.items():
        if name not in known or name == "extra":
            raise ConfigError(f"[{section}] has no setting {name!r}; known: {', '.join(sorted(known))}")
        current = getattr(base, name)
        if isinstance(current, bool):
            wrong = not isinstance(value, bool)
        else:  # a bool is an int to Python, not to the config
            wrong = not isinstance(value, type(current)) or (
                isinstance(current, int) and isinstance(value, bool))
        if wrong:
            raise ConfigError(f"[{section}] {name} must be {type(current).__name__}, got {value!r}")
        if isinstance(value, int) and value < 0:
            raise ConfigError(f"[{section}] {name} must not be negative, got {value}")
        changes[name] = value
    return replace(base, **changes)


def _table(data: dict[str, Any], section: str) -> dict[str, Any]:
    value = data.get(section, {})
    if not isinstance(value, dict):
        raise ConfigError(f"[{section}] must be a table of settings, got {value!r}")
    return value


def load(path: str | None, overrides: dict[str, Any],
         usable: Callable[[], memory.UsableMemory | None] = memory.usable_memory) -> BrokerConfig:
    """Defaults, then the TOML file at `path`, then `overrides` (flag values; None means not given); the
    memory settings neither sets are then sized from `usable()` (memory.SHARES), and logged in one line."""
    config = BrokerConfig()
    auto = set(memory.SHARES)
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read config file {path}: {e}") from e
        unknown = set(data) - set(SECTIONS)
        if unknown:
            raise ConfigError(f"config file {path}: unknown sections {sorted(unknown)}")
        tables = {section: dict(_table(data, section)) for section in SECTIONS}
        for share in memory.SHARES:
            value = tables[share.section].get(share.name, AUTO)
            if value == AUTO:
                tables[share.section].pop(share.name, None)
            elif isinstance(value, str):
                raise ConfigError(f'[{share.section}] {share.name} must be int or "{AUTO}", got {value!r}')
            else:
                auto.discard(share)
        sync = tables["wal"].pop("sync", None)
        wal = _typed("wal", tables["wal"], WalConfig, config.wal)
        if sync is not None:
            try:
                wal = replace(wal, sync=SyncPolicy.parse(str(sync)))
            except ValueError as e:
                raise ConfigError(f"[wal] {e}") from e
        config = replace(_typed("broker", tables["broker"], BrokerConfig, config), wal=wal,
                         dispatch=_typed("dispatch", tables["dispatch"], DispatchConfig, config.dispatch),
                         policy=_typed("policy", tables["policy"], Policy, config.policy),
                         cluster=_typed("cluster", tables["cluster"], ClusterConfig, config.cluster),
                         security=_typed("security", tables["security"], SecurityConfig, config.security),
                         tables=_typed("tables", tables["tables"], TablesConfig, config.tables))
    given = {k: v for k, v in overrides.items() if v is not None}
    cluster_given = {k.removeprefix("cluster."): given.pop(k) for k in list(given)
                     if k.startswith("cluster.")}
    security_given = {k.removeprefix("security."): given.pop(k) for k in list(given)
                      if k.startswith("security.")}
    auto -= {share for share in auto if share.section == "broker" and share.name in given}
    config = replace(config, cluster=replace(config.cluster, **cluster_given),
                     security=replace(config.security, **security_given), **given)
    config, line = _sized(config, auto, usable())
    check(config)
    log.info("%s", line)
    return config


def _sized(config: BrokerConfig, auto: set[memory.Share],
           usable: memory.UsableMemory | None) -> tuple[BrokerConfig, str]:
    """`config` with the settings in `auto` sized from `usable`, and the log line that says so."""
    chosen: dict[str, dict[str, Any]] = {"broker": {}, "wal": {}, "dispatch": {}, "tables": {}}
    sized, given = [], []
    for share in memory.SHARES:
        if share in auto:
            default = getattr(_section(BrokerConfig(), share.section), share.name)
            chosen[share.section][share.name] = share.of(default, usable)
            sized.append((share, chosen[share.section][share.name]))
        else:
            given.append((share, getattr(_section(config, share.section), share.name)))
    config = replace(config, wal=replace(config.wal, **chosen["wal"]),
                     dispatch=replace(config.dispatch, **chosen["dispatch"]),
                     tables=replace(config.tables, **chosen["tables"]), **chosen["broker"])
    return config, memory.describe(usable, sized, given)


def _section(config: BrokerConfig, section: str) -> Any:
    return config if section == "broker" else getattr(config, section)


def check(config: BrokerConfig) -> None:
    if config.mode not in ("standalone", "cluster"):
        raise ConfigError(f"mode must be 'standalone' or 'cluster', not {config.mode!r}")
    if config.clustered and not config.cluster.metadata_store.startswith("etcd://"):
        raise ConfigError("cluster mode needs [cluster] metadata_store = \"etcd://host:port\" (or "
                          "--metadata-store): the brokers of a cluster share one etcd")
    if config.clustered:
        access = config.cluster.etcd_access()
        try:
            access.check(ETCD_SETTINGS)
            access.resolve_password(names=ETCD_SETTINGS)  # a user without a password stops here
        except EtcdAccessError as e:
            raise ConfigError(str(e)) from e
    if config.cluster.lease_ttl_s < 2:
        raise ConfigError("[cluster] lease_ttl_s must be at least 2")
    if config.cluster.reserve_offsets < 1000:
        raise ConfigError("[cluster] reserve_offsets must be at least 1000")
    for name in ("broker_addr", "admin_addr"):
        _host_port(getattr(config, name), name)
    if config.prom_exporter:
        _host_port(config.prom_exporter, "prom_exporter")
    if config.native_addr:
        _host_port(config.native_addr, "fast_addr")
    if config.console_listen:
        _host_port(config.console_listen, "console_addr")
    if config.fast_advertised_addr:
        _host_port(config.fast_advertised_addr, "fast_advertised_addr")
    if config.admin_advertised_addr:
        _host_port(config.admin_advertised_addr, "admin_advertised_addr")
    if config.fast_keepalive_ms < 100:
        raise ConfigError(f"fast_keepalive_ms must be at least 100, not {config.fast_keepalive_ms}")
    if config.fast_inflight_bytes < 1 << 20:
        raise ConfigError(f"fast_inflight_bytes must be at least 1 MiB, not {config.fast_inflight_bytes}")
    if config.fast_max_connections_per_principal < 1:
        raise ConfigError("fast_max_connections_per_principal must be at least 1, not "
                          f"{config.fast_max_connections_per_principal}")
    if config.fast_max_connections < 1:
        raise ConfigError(f"fast_max_connections must be at least 1, not {config.fast_max_connections}")
    for name in ("window", "window_bytes", "broker_bytes", "max_delivery_delay_ms", "delayed_index_records"):
        if getattr(config.dispatch, name) < 1:
            raise ConfigError(f"[dispatch] {name} must be at least 1")
    if not 0 < config.max_message_size <= 1 << 30:
        raise ConfigError("max_message_size must be in 1..1 GiB")
    if config.retention_check_ms < 100:
        raise ConfigError(f"retention_check_ms must be at least 100, not {config.retention_check_ms}")
    if config.stall_dump_ms and config.stall_dump_ms < 100:
        raise ConfigError(f"stall_dump_ms must be 0 (off) or at least 100, not {config.stall_dump_ms}")
    if not 0 <= config.malloc_keep_bytes < 1 << 31:
        raise ConfigError(f"malloc_keep_bytes must be in 0..2 GiB - 1, not {config.malloc_keep_bytes}")
    # The WAL engines refuse these when a topic's log opens, which would fail every topic with INTERNAL.
    if not 0 < config.wal.segment_bytes <= MAX_SEGMENT_BYTES:
        raise ConfigError(f"[wal] segment_bytes must be in 1..{MAX_SEGMENT_BYTES} (1 GiB), "
                          f"not {config.wal.segment_bytes}")
    for name in ("index_interval_bytes", "index_max_bytes", "max_group_bytes"):
        if getattr(config.wal, name) < 1:
            raise ConfigError(f"[wal] {name} must be at least 1")
    for name in ("cache_bytes", "cache_total_bytes"):
        if getattr(config.wal, name) < 0:
            raise ConfigError(f"[wal] {name} must not be negative, not {getattr(config.wal, name)}")
    if config.wal.idle_release_ms < 0:
        raise ConfigError("[wal] idle_release_ms must not be negative (0 = never release)")
    if config.policy.table_mode not in Policy.TABLE_MODES:
        raise ConfigError(f"[policy] table_mode must be one of {', '.join(Policy.TABLE_MODES)}, "
                          f"not {config.policy.table_mode!r}")
    if config.policy.table_partitioning not in Policy.TABLE_PARTITIONINGS:
        choices = ", ".join(Policy.TABLE_PARTITIONINGS)
        raise ConfigError(f"[policy] table_partitioning must be one of {choices}, "
                          f"not {config.policy.table_partitioning!r}")
    try:
        config.tables.check()
    except ValueError as e:
        raise ConfigError(str(e)) from e
    try:
        config.security.check()
    except SecurityConfigError as e:
        raise ConfigError(str(e)) from e
    if config.clustered and config.security.tls and not config.security.ca_file:
        raise ConfigError("[security] cluster mode with TLS needs ca_file: brokers forward admin calls to "
                          "each other over TLS and must trust each other's certificates")


def _host_port(text: str, what: str) -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} {text!r} is not host:port")
    return host, int(port)

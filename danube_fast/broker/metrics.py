"""The Prometheus endpoint: prometheus-client renders, at scrape time, the broker's live state, the latency
histograms of danube_fast/latency.py and the library's process, GC and platform collectors (CPU, memory,
open files, collections). Our own asyncio listener serves it, so that the broker's TLS and bearer-token
checks (docs/SECURITY.md) apply; it answers OpenMetrics to a scraper that asks for it and the text format
0.0.4 otherwise.

The broker's families, per topic: messages and bytes published (counters: rates come from `rate()`),
producers, the committed offset, retention's figures (broker/retention.py), the topic table's
(broker/tables.py: offset, lag, files, bytes, commits, DLQ and skipped records, failing); per subscription:
messages and bytes delivered (by either API), messages redelivered, dead-lettered, dropped (NonReliable, no
room), and the gauges backlog (Reliable: committed offset minus the ack floor; NonReliable: messages
buffered), unacknowledged messages, consumers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from ssl import SSLContext
from typing import Any

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.registry import Collector

from danube_fast import latency
from danube_fast.broker.context import BrokerContext
from danube_fast.broker.retention import Retention
from danube_fast.broker.tables import TableWriter
from danube_fast.errors import DanubeError
from danube_fast.security.tls import common_name

log = logging.getLogger("danube_fast.metrics")

_TOPIC = ("topic",)
_SUBSCRIPTION = ("topic", "subscription")
# name -> (kind, help, labels)
_FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "danube_topic_messages_in_total": ("counter", "Messages published to the topic.", _TOPIC),
    "danube_topic_bytes_in_total": ("counter", "Bytes published: payloads (Danube API), batches (fast API).",
                                    _TOPIC),
    "danube_topic_committed_offset": ("gauge", "Reliable: offset after the last durable message.", _TOPIC),
    "danube_topic_producers": ("gauge", "Producers attached to the topic.", _TOPIC),
    "danube_topic_retained_bytes": ("gauge", "Bytes in the object tier, as the last retention pass saw.",
                                    _TOPIC),
    "danube_topic_retained_records": ("gauge", "Records in the object tier, as the last retention pass saw.",
                                      _TOPIC),
    "danube_topic_oldest_retained_timestamp_seconds": ("gauge", "Publish time of the oldest record kept.",
                                                       _TOPIC),
    "danube_topic_retention_deleted_objects_total": ("counter", "Objects retention deleted (since loaded).",
                                                     _TOPIC),
    "danube_topic_replicas": ("gauge", "Replicated topics: copies the policy asks for (replicationFactor).",
                              _TOPIC),
    "danube_topic_replicas_in_sync": ("gauge", "Replicated topics: copies in sync, the owner's included.",
                                      _TOPIC),
    "danube_topic_under_replicated": ("gauge", "Replicated topics: 1 while fewer copies are in sync than "
                                      "the policy asks for.", _TOPIC),
    "danube_topic_replica_sent_bytes_total": ("counter", "Replicated topics: record bytes the owner's "
                                              "followers fetched, by transport (native, grpc).",
                                              ("topic", "transport")),
    "danube_topic_behind_retention_total": ("counter", "Offsets readers skipped: retention had deleted them.",
                                            _TOPIC),
    "danube_subscription_messages_out_total": ("counter", "Messages handed to the subscription's consumers "
                                               "(both APIs).", _SUBSCRIPTION),
    "danube_subscription_bytes_out_total": ("counter", "Bytes handed to the subscription's consumers: as "
                                            "stored (Reliable, both APIs), payloads (NonReliable).",
                                            _SUBSCRIPTION),
    "danube_subscription_redelivered_total": ("counter", "Deliveries again (nack, ack timeout, loss).",
                                              _SUBSCRIPTION),
    "danube_subscription_dead_lettered_total": ("counter", "Messages moved to the dead-letter topic.",
                                                _SUBSCRIPTION),
    "danube_subscription_expired_total": ("counter", "Records message expiry (messageTTLInSeconds) "
                                          "acknowledged for the subscription (since the topic was loaded).",
                                          _SUBSCRIPTION),
    "danube_subscription_dropped_total": ("counter", "NonReliable messages no consumer took.", _SUBSCRIPTION),
    "danube_subscription_lag": ("gauge", "Messages not acknowledged (Reliable) or buffered (NonReliable).",
                                _SUBSCRIPTION),
    "danube_subscription_unacked": ("gauge", "Reliable: messages delivered or due again, not acknowledged.",
                                    _SUBSCRIPTION),
    "danube_subscription_delayed": ("gauge", "Shared, Key-Shared: records waiting for their deliver-at time.",
                                    _SUBSCRIPTION),
    "danube_subscription_consumers": ("gauge", "Consumers of the subscription with an active stream.",
                                      _SUBSCRIPTION),
    "danube_broker_uptime_seconds": ("gauge", "Seconds since the broker started.", ()),
    "danube_topic_load_failed": ("gauge", "1 for a topic of this broker whose storage could not be loaded.",
                                 _TOPIC),
    "danube_dispatch_held_bytes": ("gauge", "Bytes read for delivery, not yet acknowledged (all consumers).",
                                   ()),
    "danube_topics_idle_released": ("gauge", "Reliable topics whose idle log gave back its cache and files.",
                                    ()),
    "danube_wal_cache_bytes": ("gauge", "Bytes of recent records the tail caches hold (every topic).", ()),
    "danube_table_committed_offset": ("gauge", "Topic tables: the next offset the table lacks.", _TOPIC),
    "danube_table_lag_ms": ("gauge", "Topic tables: how long the table has been behind the topic.", _TOPIC),
    "danube_table_files": ("gauge", "Topic tables: data files of the current snapshot.", _TOPIC),
    "danube_table_bytes": ("gauge", "Topic tables: bytes of those files.", _TOPIC),
    "danube_table_commits_total": ("counter", "Topic tables: commits by this broker (since loaded).", _TOPIC),
    "danube_table_dlq_records_total": ("counter", "Topic tables: records sent to the table's DLQ.", _TOPIC),
    "danube_table_skipped_records_total": ("counter", "Topic tables: records lost before the table got them.",
                                           _TOPIC),
    "danube_table_failing": ("gauge", "Topic tables: 1 while the last pass failed or the table is stopped.",
                             _TOPIC),
}
# What a dispatcher counts (Dispatcher.counters) -> its family.
_SUBSCRIPTION_COUNTERS = {
    "redelivered": "danube_subscription_redelivered_total",
    "dead_lettered": "danube_subscription_dead_lettered_total",
    "dropped": "danube_subscription_dropped_total",
    "unacked": "danube_subscription_unacked",
    "delayed": "danube_subscription_delayed",
}


class BrokerCollector(Collector):
    """The broker's families, read from its topics at each scrape."""

    def __init__(self, ctx: BrokerContext, started: float, retention: Retention | None = None,
                 tables: TableWriter | None = None) -> None:
        self._ctx = ctx
        self._started = started
        self._retention = retention
        self._tables = tables

    def collect(self) -> Iterator[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
            name: (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, text, labels=labels)
            for name, (kind, text, labels) in _FAMILIES.items()}

        def add(name: str, labels: tuple[str, ...], value: float) -> None:
            families[name].add_metric(labels, value)

        ctx = self._ctx
        topics = ctx.topics
        for r in topics.stored():
            tl = (r.full,)
            add("danube_topic_committed_offset", tl, r.wal.committed_offset)
            add("danube_topic_behind_retention_total", tl, r.log.behind_retention)
            if r.replicas is not None:
                add("danube_topic_replicas", tl, r.replicas.wanted)
                add("danube_topic_replicas_in_sync", tl, r.replicas.in_sync)
                add("danube_topic_under_replicated", tl, int(r.replicas.in_sync < r.replicas.wanted))
                for transport, sent in r.replicas.sent_bytes.items():
                    add("danube_topic_replica_sent_bytes_total", (r.full, transport), sent)
            kept = self._retention.state.get(r.full) if self._retention is not None else None
            if kept is not None:
                add("danube_topic_retained_bytes", tl, kept.retained_bytes)
                add("danube_topic_retained_records", tl, kept.retained_records)
                add("danube_topic_retention_deleted_objects_total", tl, kept.deleted_objects)
                if kept.oldest_ms is not None:
                    add("danube_topic_oldest_retained_timestamp_seconds", tl, kept.oldest_ms / 1000)
        for t in topics.served():
            tl = (t.full,)
            add("danube_topic_messages_in_total", tl, t.messages_in)
            add("danube_topic_bytes_in_total", tl, t.bytes_in)
            add("danube_topic_producers", tl, len(t.producers))
            for s in t.subscriptions.values():
                sl = (t.full, s.name)
                d = s.dispatcher
                add("danube_subscription_messages_out_total", sl, s.delivered)
                add("danube_subscription_bytes_out_total", sl, s.delivered_bytes)
                if s.cursor is not None:  # Reliable: only a stored topic's records expire
                    add("danube_subscription_expired_total", sl, s.expired)
                add("danube_subscription_lag", sl, d.backlog)
                add("danube_subscription_consumers", sl, sum(1 for c in s.consumers if c.active))
                for counter, value in d.counters().items():
                    add(_SUBSCRIPTION_COUNTERS[counter], sl, value)
        add("danube_dispatch_held_bytes", (), ctx.budget.held)
        add("danube_topics_idle_released", (), ctx.logs.released())
        add("danube_wal_cache_bytes", (), ctx.logs.cache_budget.nbytes)
        for name in topics.broken():
            add("danube_topic_load_failed", (name,), 1)
        add("danube_broker_uptime_seconds", (), time.monotonic() - self._started)
        if self._tables is not None:
            now = time.time()
            for name, st in self._tables.status.items():
                tl = (name,)
                add("danube_table_committed_offset", tl, st.committed_offset)
                add("danube_table_lag_ms", tl, st.lag_ms(now))
                add("danube_table_files", tl, st.files)
                add("danube_table_bytes", tl, st.bytes)
                add("danube_table_commits_total", tl, st.commits)
                add("danube_table_dlq_records_total", tl, st.dlq_records)
                add("danube_table_skipped_records_total", tl, st.skipped_records)
                add("danube_table_failing", tl, 1 if st.error or st.stopped else 0)
        yield from families.values()


def broker_registry(ctx: BrokerContext, started: float, retention: Retention | None = None,
                    tables: TableWriter | None = None) -> CollectorRegistry:
    """Everything one broker's endpoint exports."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(ctx, started, retention, tables))
    for histogram in latency.HISTOGRAMS:
        registry.register(histogram)
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


def render(ctx: BrokerContext, started: float, retention: Retention | None = None) -> str:
    """The broker's own families alone, in the text format 0.0.4."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(ctx, started, retention))
    return generate_latest(registry).decode()


class MetricsServer:
    """A minimal HTTP/1.1 server: GET /metrics (and /) answers the exposition; anything else 404."""

    def __init__(self, ctx: BrokerContext, retention: Retention | None = None,
                 tables: TableWriter | None = None) -> None:
        self._registry = broker_registry(ctx, time.monotonic(), retention, tables)
        self._server: asyncio.Server | None = None
        self._admit: Callable[[str | None, str | None], None] | None = None

    def register(self, collector: Collector) -> None:
        """Another part's families on this endpoint (the native transport's sendfile counters)."""
        self._registry.register(collector)

    async def bind(self, host: str, port: int, *, ssl: SSLContext | None = None,
                   admit: Callable[[str | None, str | None], None] | None = None) -> int:
        """Bind the port (answered from serve() on) and return it; with `ssl`, HTTPS; with `admit`, each
        request's bearer token and the common name of the client certificate TLS verified (None without
        either) must pass it (it raises an ApiError, answered 401 or 403)."""
        self._admit = admit
        self._server = await asyncio.start_server(self._serve, host, port, ssl=ssl, start_serving=False)
        return int(self._server.sockets[0].getsockname()[1])

    async def serve(self) -> None:
        assert self._server is not None, "bind() first"
        await self._server.start_serving()

    def _refusal(self, request: bytes, peercert: Any) -> tuple[bytes, bytes] | None:
        if self._admit is None:
            return None
        token = None
        text = _header(request, b"authorization")
        if text is not None:
            token = text[7:].strip() if text[:7].lower() == "bearer " else ""
        try:
            self._admit(token, common_name(peercert))
        except DanubeError as e:
            status = b"401 Unauthorized" if e.grpc_code == "UNAUTHENTICATED" else b"403 Forbidden"
            return status, str(e).encode() + b"\n"
        return None

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, path = ([*request.split(b"\r\n", 1)[0].split(b" "), b"", b""])[:2]
            refused = self._refusal(request, writer.get_extra_info("peercert"))
            if refused is not None:
                status, body = refused
                head = b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain\r\nWWW-Authenticate: Bearer\r\n"
            elif method == b"GET" and path.split(b"?")[0] in (b"/metrics", b"/"):
                encoder, content_type = choose_encoder(_header(request, b"accept") or "")
                body = encoder(self._registry)
                head = b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type.encode() + b"\r\n"
            else:
                body = b"not found: try GET /metrics\n"
                head = b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
            writer.write(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()


def _header(request: bytes, wanted: bytes) -> str | None:
    """The value of the request's header `wanted` (lower case), None without one."""
    for line in request.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == wanted:
            return value.strip().decode("latin-1")
    return None

"""The Prometheus endpoint: text exposition format 0.0.4, rendered from live broker state at scrape time.

Counters (rates come from `rate()` over them) per topic: messages and bytes published; per subscription:
messages delivered and redelivered, dead-lettered, dropped (NonReliable, no room); gauges: backlog (Reliable:
committed offset minus the ack floor; NonReliable: messages buffered), unacknowledged messages, consumers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from ssl import SSLContext

from danube_fast.broker.dispatch.live import LiveDispatcher
from danube_fast.broker.topic import ReliableTopic
from danube_fast.broker.topics import Topics
from danube_fast.errors import DanubeError

log = logging.getLogger("danube_fast.metrics")

_HELP = {
    "danube_topic_messages_in_total": ("counter", "Messages published to the topic."),
    "danube_topic_bytes_in_total": ("counter", "Bytes published: payloads (Danube API), batches (fast API)."),
    "danube_topic_committed_offset": ("gauge", "Reliable: offset after the last durable message."),
    "danube_topic_producers": ("gauge", "Producers attached to the topic."),
    "danube_subscription_messages_out_total": ("counter", "Messages handed to the subscription's consumers."),
    "danube_subscription_redelivered_total": ("counter", "Deliveries again (nack, ack timeout, loss)."),
    "danube_subscription_dead_lettered_total": ("counter", "Messages moved to the dead-letter topic."),
    "danube_subscription_dropped_total": ("counter", "NonReliable messages no consumer took."),
    "danube_subscription_lag": ("gauge", "Messages not acknowledged (Reliable) or buffered (NonReliable)."),
    "danube_subscription_unacked": ("gauge", "Reliable: messages delivered or due again, not acknowledged."),
    "danube_subscription_consumers": ("gauge", "Consumers of the subscription with an active stream."),
    "danube_broker_uptime_seconds": ("gauge", "Seconds since the broker started."),
    "danube_topic_load_failed": ("gauge", "1 for a topic of this broker whose storage could not be loaded."),
    "danube_dispatch_held_bytes": ("gauge", "Bytes read for delivery, not yet acknowledged (all consumers)."),
    "danube_topics_idle_released": ("gauge", "Reliable topics whose idle log gave back its cache and files."),
}


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(topics: Topics, started: float) -> str:
    samples: dict[str, list[str]] = {name: [] for name in _HELP}

    def add(name: str, labels: dict[str, str], value: float) -> None:
        text = ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())
        samples[name].append(f"{name}{{{text}}} {value}")

    for t in topics.served():
        tl = {"topic": t.full}
        add("danube_topic_messages_in_total", tl, t.messages_in)
        add("danube_topic_bytes_in_total", tl, t.bytes_in)
        add("danube_topic_producers", tl, len(t.producers))
        if isinstance(t, ReliableTopic):
            add("danube_topic_committed_offset", tl, t.wal.committed_offset)
        for s in t.subscriptions.values():
            sl = {"topic": t.full, "subscription": s.name}
            d = s.dispatcher
            add("danube_subscription_messages_out_total", sl, s.delivered)
            add("danube_subscription_lag", sl, d.backlog)
            add("danube_subscription_consumers", sl, sum(1 for c in s.consumers if c.active))
            if isinstance(d, LiveDispatcher):
                add("danube_subscription_dropped_total", sl, d.dropped)
            else:
                add("danube_subscription_redelivered_total", sl, d.redelivered)
                add("danube_subscription_dead_lettered_total", sl, d.dead_lettered)
                add("danube_subscription_unacked", sl, d.unacked)
    samples["danube_dispatch_held_bytes"].append(f"danube_dispatch_held_bytes {topics.budget.held}")
    samples["danube_topics_idle_released"].append(f"danube_topics_idle_released {topics.released_logs()}")
    for name in topics.broken():
        add("danube_topic_load_failed", {"topic": name}, 1)
    samples["danube_broker_uptime_seconds"].append(
        f"danube_broker_uptime_seconds {time.monotonic() - started:.3f}")

    def lines() -> Iterator[str]:
        for name, (kind, text) in _HELP.items():
            yield f"# HELP {name} {text}"
            yield f"# TYPE {name} {kind}"
            yield from samples[name]

    return "\n".join(lines()) + "\n"


class MetricsServer:
    """A minimal HTTP/1.1 server: GET /metrics (and /) answers the exposition; anything else 404."""

    def __init__(self, topics: Topics) -> None:
        self._topics = topics
        self._started = time.monotonic()
        self._server: asyncio.Server | None = None
        self._admit: Callable[[str | None], None] | None = None

    async def start(self, host: str, port: int, *, ssl: SSLContext | None = None,
                    admit: Callable[[str | None], None] | None = None) -> int:
        """Listen; with `ssl`, HTTPS; with `admit`, each request's bearer token (None without one) must pass
        it (it raises an ApiError, answered 401 or 403)."""
        self._admit = admit
        self._server = await asyncio.start_server(self._serve, host, port, ssl=ssl)
        return int(self._server.sockets[0].getsockname()[1])

    def _refusal(self, request: bytes) -> tuple[bytes, bytes] | None:
        if self._admit is None:
            return None
        token = None
        for line in request.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"authorization":
                text = value.strip().decode("latin-1")
                token = text[7:].strip() if text[:7].lower() == "bearer " else ""
        try:
            self._admit(token)
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
            refused = self._refusal(request)
            if refused is not None:
                status, body = refused
                head = b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain\r\nWWW-Authenticate: Bearer\r\n"
            elif method == b"GET" and path.split(b"?")[0] in (b"/metrics", b"/"):
                body = render(self._topics, self._started).encode()
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            else:
                body = b"not found: try GET /metrics\n"
                head = b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
            writer.write(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

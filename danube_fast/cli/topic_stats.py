"""A topic's live figures for `admin topics describe`, read from its broker's metrics endpoint (the address
the broker registered; docs/SECURITY.md: HTTPS and a token where the cluster asks for them).

The admin API's DescribeTopic answers what v0.7.3 answers (owner, delivery, subscription names, schema);
the figures a person asks next (how far behind is each subscription, is anyone consuming) are the broker's
metrics, so they are read there rather than added to a wire message the official client shares.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

# metric family -> the name it has in the description
TOPIC_FIGURES = {"danube_topic_messages_in": "messages_in", "danube_topic_bytes_in": "bytes_in",
                 "danube_topic_committed_offset": "committed_offset", "danube_topic_producers": "producers"}
SUBSCRIPTION_FIGURES = {"danube_subscription_consumers": "consumers", "danube_subscription_lag": "lag",
                        "danube_subscription_unacked": "unacked",
                        "danube_subscription_messages_out": "delivered",
                        "danube_subscription_redelivered": "redelivered"}


@dataclass
class TopicStats:
    figures: dict[str, int] = field(default_factory=dict)
    subscriptions: dict[str, dict[str, int]] = field(default_factory=dict)


def _url(metrics_addr: str, args: argparse.Namespace) -> str:
    if metrics_addr.startswith(("http://", "https://")):
        base = metrics_addr.rstrip("/")
    else:
        base = ("https://" if args.tls_ca else "http://") + metrics_addr
    return base + "/metrics"


def _fetch(url: str, args: argparse.Namespace) -> str:
    headers = {}
    token = args.token or os.environ.get("DANUBE_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=args.tls_ca)
        if args.tls_cert:
            context.load_cert_chain(args.tls_cert, args.tls_key)
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=args.timeout, context=context) as response:
        text: str = response.read().decode()
    return text


async def topic_stats(args: argparse.Namespace, metrics_addr: str, topic: str) -> TopicStats:
    """The topic's figures from the metrics at `metrics_addr`; OSError (and its URLError) when unreachable."""
    text = await asyncio.to_thread(_fetch, _url(metrics_addr, args), args)
    stats = TopicStats()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("topic") != topic or sample.name.endswith("_created"):
                continue
            name = sample.name.removesuffix("_total")
            if name in TOPIC_FIGURES:
                stats.figures[TOPIC_FIGURES[name]] = int(sample.value)
            elif name in SUBSCRIPTION_FIGURES:
                row = stats.subscriptions.setdefault(sample.labels["subscription"], {})
                row[SUBSCRIPTION_FIGURES[name]] = int(sample.value)
    return stats

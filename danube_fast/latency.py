"""The latency histograms a broker exports: observed where the work happens (the WAL engine, the uploader,
the produce services) and rendered by the broker's metrics endpoint (danube_fast/broker/metrics.py).

They are prometheus-client Histograms registered in no registry: each broker's endpoint registers them in
its own, and a process holds one set (a test process running several brokers shares it). An observation
costs about 0.6 us, so they are observed per fdatasync, per upload, per produce request and per delivery,
never per record of a batch.
"""

from __future__ import annotations

import time

from prometheus_client import Histogram

# 100 us to 10 s: a local fdatasync, a group commit's ack and a publish sit in the low milliseconds.
_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                 2.5, 10.0)
# 10 ms to 2 min: an object of up to 64 MiB to a folder or S3.
_UPLOAD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)

FSYNC_SECONDS = Histogram(
    "danube_wal_fsync_seconds", "fdatasync of a WAL segment: one per group commit (sync=always) or tick.",
    buckets=_FAST_BUCKETS, registry=None)
UPLOAD_SECONDS = Histogram(
    "danube_tier_upload_seconds", "Writing one segment object to the object tier (folder or S3).",
    buckets=_UPLOAD_BUCKETS, registry=None)
PUBLISH_SECONDS = Histogram(
    "danube_publish_ack_seconds", "From a publish request reaching its topic to its acknowledgement: durable "
    "per the topic's sync policy. `api`: danube (one message per SendMessage) or fast (one batch).",
    ["api"], buckets=_FAST_BUCKETS, registry=None)
PUBLISH_DANUBE = PUBLISH_SECONDS.labels(api="danube")
PUBLISH_FAST = PUBLISH_SECONDS.labels(api="fast")
# End to end, as the broker sees it: a caught-up consumer's deliveries are as old as publish-to-delivery
# takes; a consumer behind shows how far behind it reads. Publish times are the producer's clock (Unix ms).
DELIVERY_AGE_SECONDS = Histogram(
    "danube_delivery_age_seconds", "End to end: at each delivery to a consumer stream, now minus the publish "
    "time of its oldest record (the producer's clock). `api`: danube or fast.",
    ["api"], buckets=(*_FAST_BUCKETS, 60.0, 600.0, 3600.0), registry=None)
DELIVERY_DANUBE = DELIVERY_AGE_SECONDS.labels(api="danube")
DELIVERY_FAST = DELIVERY_AGE_SECONDS.labels(api="fast")

HISTOGRAMS = (FSYNC_SECONDS, UPLOAD_SECONDS, PUBLISH_SECONDS, DELIVERY_AGE_SECONDS)


def observe_age(child: Histogram, publish_ms: int) -> None:
    """A delivery of a record published at `publish_ms` (Unix ms), now; a clock ahead of ours counts 0."""
    child.observe(max(0.0, time.time() - publish_ms / 1000))

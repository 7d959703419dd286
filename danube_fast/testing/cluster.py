"""Brokers of one real cluster: `danube-fast broker --mode cluster` subprocesses (broker.ClusterBroker)
sharing one etcd and one object store (a folder or an S3 endpoint), on free loopback ports.

The Cluster owns its brokers: close() kills them all. The etcd and the object store belong to the caller.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from danube_fast.meta import keys
from danube_fast.meta.resources import Unassigned
from danube_fast.meta.store import Compare, Delete, MetadataStore, Put
from danube_fast.testing.broker import ClusterBroker

# Short leases and frequent reports and uploads, so that failure tests run in seconds; no automatic
# rebalancing during a test (an hour of cooldown).
FAST_SETTINGS: dict[str, int | str] = {"lease_ttl_s": 3, "load_report_ms": 1000, "upload_interval_ms": 500,
                                       "rebalance_cooldown_ms": 3_600_000, "assign_wait_ms": 5000}


def cluster_config(settings: Mapping[str, int | str]) -> str:
    """The brokers' TOML: a [cluster] section with `settings`."""
    return "[cluster]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())


class Cluster:
    """Brokers in `root`/brokerN on the etcd at `etcd_url` (etcd://host:port) and `object_store`, each with
    `settings` (FAST_SETTINGS by default) and the ones given to add() over them."""

    def __init__(self, root: Path, etcd_url: str, object_store: str,
                 settings: Mapping[str, int | str] = FAST_SETTINGS, *, metrics: bool = True,
                 die_with_parent: bool = False) -> None:
        self.root = root
        self.etcd_url = etcd_url
        self.object_store = object_store
        self.settings = dict(settings)
        self.metrics = metrics
        self.die_with_parent = die_with_parent
        self.brokers: list[ClusterBroker] = []
        self.extra_config = ""  # TOML added after the [cluster] section (e.g. a [security] section)
        self.native = False  # brokers added from now on serve the native transport too (Broker.fast_port)
        self.console = False  # brokers added from now on serve the web console too (Broker.console_port)

    def add(self, **settings: int | str) -> ClusterBroker:
        """A broker of this cluster, not started yet (set its `env` first, for instance)."""
        workdir = self.root / f"broker{len(self.brokers)}"
        b = ClusterBroker(workdir, self.etcd_url, self.object_store,
                          cluster_config({**self.settings, **settings}) + self.extra_config,
                          metrics=self.metrics, die_with_parent=self.die_with_parent, native=self.native,
                          console=self.console)
        self.brokers.append(b)
        return b

    def start(self, n: int = 1, **settings: int | str) -> list[ClusterBroker]:
        """`n` new brokers, started one after the other."""
        started = [self.add(**settings) for _ in range(n)]
        for b in started:
            b.start()
        return started

    def by_id(self, broker_id: int) -> ClusterBroker:
        return next(b for b in self.brokers if b.broker_id == broker_id)

    def close(self) -> None:
        for b in self.brokers:
            b.close()

    def logs(self) -> str:
        return "\n".join(f"----- broker {b.broker_id} ({b.log_path})\n{b.log_tail()}" for b in self.brokers)


async def owner(store: MetadataStore, topic: str) -> int | None:
    """The id of the broker `topic` is assigned to, None if none."""
    ns, t = keys.split_topic_name(topic)
    for kv in await store.get_prefix(keys.brokers_prefix()):
        try:
            b, ns2, t2 = keys.parse_broker_topic(kv.key)
        except ValueError:
            continue
        if (ns2, t2) == (ns, t):
            return b
    return None


async def wait_for(check: Callable[[], object], what: str, timeout: float = 15.0) -> object:
    """Poll an async or sync `check` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


async def unload(store: MetadataStore, topic: str) -> int:
    """What `danube-fast admin topics unload` does: mark for unload and delete the assignment; the owner it
    took the topic from."""
    ns, t = keys.split_topic_name(topic)
    current = await wait_for(lambda: owner(store, topic), f"an owner of {topic}")
    assert isinstance(current, int)
    key = keys.broker_topic(current, ns, t)
    done = await store.transaction([Compare(key, "version", ">", 0)],
                                   [Put(keys.unassigned(ns, t), Unassigned.unload(current).to_json()),
                                    Delete(key)], [])
    assert done.succeeded
    return current

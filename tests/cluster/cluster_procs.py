"""Brokers of a real cluster for the tests: `danube-fast broker --mode cluster` subprocesses sharing one etcd
and one object store (a local folder or the moto S3 endpoint), on free loopback ports.

The broker process class is the compatibility suite's (tests/compat/compat_support.py), with the cluster
flags added; leases are short (3 s) so that failure tests run in seconds.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat"))

from compat_support import Broker

from danube_fast.meta import keys
from danube_fast.meta.store import MetadataStore

CLUSTER_SETTINGS = {"lease_ttl_s": 3, "load_report_ms": 1000, "upload_interval_ms": 500,
                    "rebalance_cooldown_ms": 3_600_000, "assign_wait_ms": 5000}


def cluster_config(**settings: int | str) -> str:
    """The brokers' TOML: CLUSTER_SETTINGS with `settings` over them."""
    merged = {**CLUSTER_SETTINGS, **settings}
    return "[cluster]\n" + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in merged.items())


class ClusterBroker(Broker):
    def __init__(self, workdir: Path, etcd_url: str, object_store: str, config: str) -> None:
        super().__init__(workdir, config)
        self.etcd_url = etcd_url
        self.object_store = object_store
        self.broker_id: int | None = None

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("standalone")] = "cluster"
        return [*cmd, "--metadata-store", self.etcd_url, "--object-store", self.object_store]

    def start(self) -> None:
        super().start()
        self.broker_id = int((self.data_dir / "broker_id").read_text())


class Cluster:
    """The brokers of one test; `close()` kills them all."""

    def __init__(self, root: Path, etcd_url: str, object_store: str) -> None:
        self.root = root
        self.etcd_url = etcd_url
        self.object_store = object_store
        self.brokers: list[ClusterBroker] = []

    def add(self, **settings: int | str) -> ClusterBroker:
        """A broker of this cluster, not started yet (set its `env` first, for instance)."""
        workdir = self.root / f"broker{len(self.brokers)}"
        b = ClusterBroker(workdir, self.etcd_url, self.object_store, cluster_config(**settings))
        self.brokers.append(b)
        return b

    def start(self, n: int = 1, **settings: int | str) -> list[ClusterBroker]:
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
        return "\n".join(f"----- {b.log_path}\n{b.log_tail()}" for b in self.brokers)


async def owner(store: MetadataStore, topic: str) -> int | None:
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

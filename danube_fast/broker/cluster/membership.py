"""A broker's membership in the cluster: one session lease that carries its registration and its leadership.

The cluster keys (docs/METADATA.md#cluster-keys): `/cluster/register/{id}` (BrokerRegistration) lives under
the lease, so it disappears when the broker stops renewing it; `/cluster/brokers/{id}/state` ({mode,
reason}) does not, so a drained broker stays drained across restarts. The leader election
(danube_fast.meta.election) grants the lease and calls `_register` with each new one, before campaigning:
registration and leadership share one lease and die together. Every few seconds the broker writes its load
report to `/cluster/load/{id}`.

`session` counts leases and `pauses` counts stalls of this process (a ticker that did not run for PAUSE
seconds: SIGSTOP, a VM freeze, a long GC): an owned topic remembers both as of its last validation and reads
its assignment again before acknowledging once either changed, or while the ticker is late right now (the
first request after SIGCONT may run before the ticker). A broker resumed from a pause must not acknowledge
on a belief (docs/METADATA.md#election-and-the-controller-epoch).

An etcd outage is not a pause: the broker keeps running and keeps serving the topics it owns
(docs/METADATA.md#the-local-cache), acknowledging into its offset reservation. If the outage was a partition
of this broker only and the topic went elsewhere meanwhile, the new owner starts past that reservation and
this broker recovers what it acknowledged as an orphan WAL once it reaches etcd again: nothing acknowledged is
lost, no offset reused.

Owner: the broker's event loop; `start()` then `close()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable

from danube_fast.meta import keys
from danube_fast.meta.election import LeaderElection
from danube_fast.meta.resources import (
    NULL,
    BrokerMode,
    BrokerRegistration,
    BrokerState,
    LoadReport,
    ResourceKind,
    SystemLoad,
)
from danube_fast.meta.store import Compare, MetadataError, MetadataStore, Put

log = logging.getLogger("danube_fast.cluster")

TICK = 0.1  # seconds between ticks of the pause detector
PAUSE = 1.0  # a tick this late means the process did not run: owned topics revalidate

SHUTDOWN = "shutdown"  # the reason of a broker's own drain when it stops


class Membership:
    def __init__(self, store: MetadataStore, broker_id: int, cluster: str, registration: BrokerRegistration,
                 ttl: int, report_interval: float, topic_list: Callable[[], list[str]]) -> None:
        self.store = store
        self.broker_id = broker_id
        self._cluster = cluster
        self._registration = registration
        self._report_interval = report_interval
        self._topic_list = topic_list
        self.election = LeaderElection(store, broker_id, ttl, on_lease=self._register)
        self.session = 0  # bumped with each lease this broker registers under
        self.pauses = 0  # bumped when the ticker finds it did not run for PAUSE seconds
        self._last_tick = time.monotonic()
        self._ticker: asyncio.Task[None] | None = None
        self._reporter: asyncio.Task[None] | None = None
        self._cpu = (time.monotonic(), time.process_time())

    @property
    def lease_deadline(self) -> float:
        return self.election.lease_deadline

    async def start(self) -> None:
        await self.store.transaction([Compare(keys.cluster_name(self._cluster), "version", "==", 0)],
                                     [Put(keys.cluster_name(self._cluster), NULL)], [])
        # Active at boot, unless an operator drained the broker (UnloadBroker): that lasts until
        # ActivateBroker. A drain for shutdown (reason "shutdown") ends with the restart.
        state = keys.broker_state(self.broker_id)
        kv = await self.store.get(state)
        if kv is None or BrokerState.from_json(kv.value, key=kv.key).reason == SHUTDOWN:
            await self.store.put(state, BrokerState(BrokerMode.ACTIVE, "boot").to_json())
        await self.election.start()
        self._reporter = asyncio.create_task(self._report_forever(), name="load-report")
        self._ticker = asyncio.create_task(self._tick_forever(), name="pause-detector")

    def paused(self) -> bool:
        """The ticker is late right now: this process may just have resumed from a pause."""
        return time.monotonic() - self._last_tick > PAUSE

    async def _tick_forever(self) -> None:
        cpu_then = time.process_time()
        while True:
            await asyncio.sleep(TICK)
            now, cpu = time.monotonic(), time.process_time()
            if now - self._last_tick > PAUSE:
                self.pauses += 1
                # The process's CPU time over the stall tells a loop blocked by a call (about the stall
                # itself) from a process that did not get to run (SIGSTOP, an overloaded host: near 0).
                log.warning("broker %d did not run for %.1f s (%.1f s of CPU meanwhile): owned topics "
                            "revalidate their assignment", self.broker_id, now - self._last_tick,
                            cpu - cpu_then)
            self._last_tick, cpu_then = now, cpu

    async def close(self) -> None:
        for task in (self._reporter, self._ticker):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._reporter, self._ticker) if t), return_exceptions=True)
        await self.election.close()  # revokes the lease: the registration goes at once

    async def _register(self, lease: int) -> None:
        await self.store.put(keys.broker_register(self.broker_id), self._registration.to_json(), lease=lease)
        self.session += 1
        log.info("broker %d registered (session %d, lease %x)", self.broker_id, self.session, lease)

    def report(self) -> LoadReport:
        now, cpu = time.monotonic(), time.process_time()
        then, cpu_then = self._cpu
        self._cpu = (now, cpu)
        cpu_pct = int(100 * (cpu - cpu_then) / max(now - then, 1e-3))
        mem_pct = 0
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{os.getpid()}/statm", encoding="ascii") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            mem_pct = int(100 * rss / (os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")))
        topics = self._topic_list()
        usage = (SystemLoad(ResourceKind.CPU, cpu_pct), SystemLoad(ResourceKind.MEMORY, mem_pct))
        return LoadReport(usage, tuple(topics), len(topics))

    async def publish_report(self) -> None:
        await self.store.put(keys.load_report(self.broker_id), self.report().to_json())

    async def _report_forever(self) -> None:
        while True:
            try:
                await self.publish_report()
            except MetadataError as e:
                log.info("load report of broker %d not written: %s", self.broker_id, e)
            await asyncio.sleep(self._report_interval)

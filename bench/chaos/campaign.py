"""One campaign: a 3-broker cluster under the workload, the nemesis for a while, every fault healed, a check
that every topic takes writes again, then a final read until every subscription has caught up (or
nothing was read for DRAIN_IDLE, or DRAIN_LIMIT passed), and the checker over the history.

The topics are replicated (`replication` copies, docs/REPLICATION.md; minInSyncReplicas 2 with 2 or more)
and the nemesis wipes brokers too; with one copy it does not, unless told to (`wipes`): a wiped owner
then takes its un-uploaded records with it, the loss window replication closes.

docs/CHAOS.md says what each figure means and how to replay a seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench.chaos import checker, workload
from bench.chaos.history import History, Send, payload
from bench.chaos.nemesis import Nemesis
from bench.chaos.servers import ChaosCluster, chaos_cluster
from bench.common import progress
from danube_fast.client import FastProducer
from danube_fast.meta.backup import backup
from danube_fast.meta.connect import open_store
from danube_fast.proto import PolicyAdmin_pb2 as policy_pb
from danube_fast.proto import PolicyAdmin_pb2_grpc as policy_grpc

RECOVERY_TARGET = 10.0  # seconds after the last heal within which every topic must take writes
RECOVERY_GIVE_UP = 60.0
PROBE_TIMEOUT = 5.0  # seconds one probe write gets before the next try
AFTER_HEAL_SECONDS = 3.0  # the producers keep going this long after the recovery check
DRAIN_IDLE = 30.0  # the final read ends when no subscription read anything for this long...
DRAIN_LIMIT = 300.0  # ...or after this long (a slow catch-up is not a stuck one: docs/CHAOS.md)


@dataclass
class Outcome:
    seed: int
    seconds: float
    verdict: checker.Verdict
    faults: int
    fault_kinds: dict[str, int]
    recovery: dict[str, float]  # topic -> seconds from the last heal to its first acknowledged write
    errors: list[str] = field(default_factory=list)  # the nemesis's (a broker that did not restart)
    tracebacks: int = 0  # in the brokers' logs, through our code
    watchdog_restarts: int = 0  # official consumers restarted by the workload's watchdog
    open_failures: int = 0  # failed attempts to open a client (each retried)
    last_open_error: str = ""
    drain_seconds: float = 0.0  # how long the final read took to catch up (or gave up)
    history_path: str = ""
    logs_path: str = ""  # the brokers' logs
    replication: int = 1  # copies of each topic (replicationFactor)
    native_connections: int = 0  # accepted by the proxies in front of the native listeners (our fast clients)

    @property
    def recovered_in_time(self) -> bool:
        return bool(self.recovery) and max(self.recovery.values()) <= RECOVERY_TARGET

    @property
    def valid(self) -> bool:
        return self.verdict.valid and not self.errors and self.recovered_in_time


def run(scratch: Path, seed: int, seconds: float, out_dir: Path, replication: int = 2,
        wipes: bool | None = None) -> tuple[Outcome, History]:
    """A whole campaign in `scratch` (the servers' data); the history goes to `out_dir`. `wipes`: whether the
    nemesis wipes brokers (default: when the topics are replicated)."""
    # The official client logs every broken stream at WARNING; the history has what matters.
    logging.getLogger("danube").setLevel(logging.CRITICAL)
    with chaos_cluster(scratch) as cluster:
        try:
            import uvloop

            outcome, history = uvloop.run(_campaign(cluster, seed, seconds, replication,
                                                    replication > 1 if wipes is None else wipes, out_dir))
        except asyncio.CancelledError:  # SIGTERM (_campaign): the `with` stops every server on the way out
            raise SystemExit(128 + signal.SIGTERM) from None
        except BaseException:
            print(cluster.logs()[-20_000:])
            raise
        outcome.tracebacks = sum(_our_tracebacks(n.broker.log_text()) for n in cluster.nodes)
        outcome.native_connections = sum(n.native_proxy.accepted for n in cluster.nodes)
        logs = out_dir / f"chaos-logs-{seed}"
        logs.mkdir(exist_ok=True)
        for n in cluster.nodes:  # the scratch directory goes; the logs stay with the history
            shutil.copy(n.broker.log_path, logs / f"{n.name}.log")
        outcome.logs_path = str(logs)
    path = out_dir / f"chaos-history-{seed}.jsonl"
    history.write(path)
    outcome.history_path = str(path)
    return outcome, history


async def _campaign(cluster: ChaosCluster, seed: int, seconds: float, replication: int, wipes: bool,
                    out_dir: Path) -> tuple[Outcome, History]:
    history = History(seed)
    if replication > 1:
        await _replicate(cluster, replication)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
    # SIGTERM cancels the campaign. bench's own handler raises SystemExit inside the loop, and a campaign
    # sent SIGTERM that way ran on for 50 minutes.
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    load = workload.Workload(history, cluster.service_url,
                             f"127.0.0.1:{cluster.nodes[0].broker.admin_port}", seed)
    await load.start()
    progress(f"seed {seed}: clients running; faults for {seconds:.0f} s")
    nemesis = Nemesis(cluster, history, workload.partitions(), seed, wipes)
    try:
        await nemesis.run(seconds)
    finally:
        await nemesis.heal_all()
    progress(f"seed {seed}: {nemesis.started} faults, all healed; {load.sent:,} sends so far")
    for node in cluster.nodes:  # a heal that left a broker down would fail the final read, not the broker
        if not node.broker.running:
            nemesis.errors.append(f"{node.name} is not running after every fault healed")
    recovery = await _recovery(cluster, history)
    await asyncio.sleep(AFTER_HEAL_SECONDS)
    await load.stop_producers()
    drain_started = time.monotonic()
    deadline = drain_started + DRAIN_LIMIT
    last_progress, reads = drain_started, len(history.receives)
    while load.unread() and time.monotonic() < deadline and time.monotonic() - last_progress < DRAIN_IDLE:
        await asyncio.sleep(0.5)
        if len(history.receives) != reads:
            last_progress, reads = time.monotonic(), len(history.receives)
    drain_seconds = time.monotonic() - drain_started
    progress(f"seed {seed}: producers stopped; final read {drain_seconds:.0f} s, {load.unread():,} "
             "acknowledged messages left unread")
    await load.close()
    kinds: dict[str, int] = {}
    for f in history.faults:
        kinds[f.kind] = kinds.get(f.kind, 0) + 1
    await _save_metadata(cluster, out_dir / f"chaos-metadata-{seed}.jsonl", seed)
    verdict = checker.check(history, workload.subscriptions())
    outcome = Outcome(seed, seconds, verdict, len(history.faults), kinds, recovery, list(nemesis.errors),
                      watchdog_restarts=load.watchdog_restarts, open_failures=load.open_failures,
                      last_open_error=load.last_open_error, drain_seconds=drain_seconds,
                      replication=replication)
    return outcome, history


async def _save_metadata(cluster: ChaosCluster, path: Path, seed: int) -> None:
    """The metadata store as the campaign left it (the product's backup format, docs/METADATA.md), beside
    the history: where a record was lost, its descriptors, gaps and copies' keys say why."""
    try:
        store = await open_store(cluster.etcd.url)
        try:
            await backup(store, path)
        finally:
            await store.close()
    except Exception as e:  # the campaign's verdict does not depend on it
        progress(f"seed {seed}: the metadata could not be saved: {e}")


async def _replicate(cluster: ChaosCluster, copies: int) -> None:
    """Every topic of the namespace the workload uses keeps `copies` copies, 2 of them in sync at least."""
    changes = json.dumps({"replicationFactor": copies, "minInSyncReplicas": 2})
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cluster.nodes[0].broker.admin_port}") as channel:
        stub: Any = policy_grpc.PolicyAdminStub(channel)  # type: ignore[no-untyped-call]
        await stub.SetNamespacePolicy(policy_pb.SetNamespacePolicyRequest(
            namespace="default", changes=changes), timeout=30)


def _our_tracebacks(log: str) -> int:
    """Tracebacks through our code. (aiohttp, under aiobotocore, logs one of its own whenever an S3
    connection is reset during an upload: its write task's exception is never retrieved; the upload itself
    fails and is retried.)"""
    parts = log.split("Traceback (most recent call last)")[1:]
    return sum("/danube_fast/" in part[:end.start() if (end := _AFTER_TRACEBACK.search(part)) else 4000]
               for part in parts)


# What follows a traceback: the next log line (a stall dump's stack after it names our code without being an
# error: broker/stall_dump.py).
_AFTER_TRACEBACK = re.compile(r"\n\d{4}-\d\d-\d\d ")


def _dump_tasks() -> None:
    """SIGUSR1: every task's stack on stderr (where is a campaign that seems stuck waiting?)."""
    for task in asyncio.all_tasks():
        try:
            task.print_stack(limit=8, file=sys.stderr)
        except Exception:  # a frame of compiled code (grpc) has no line number
            print(f"{task!r}: no stack", file=sys.stderr)


async def _recovery(cluster: ChaosCluster, history: History) -> dict[str, float]:
    """Seconds from now (every fault healed) until each topic (partition) acknowledges a write. The probe
    records are in the history like any other send, so every subscription must read them too."""
    healed = time.monotonic()
    base = {p: t.name for t in workload.TOPICS for p in workload.partitions() if p.startswith(t.name)}
    return dict(await asyncio.gather(*(_probe(cluster, history, p, base[p], healed) for p in base)))


async def _probe(cluster: ChaosCluster, history: History, topic: str, base: str, healed: float
                 ) -> tuple[str, float]:
    name = "probe" + topic.rsplit("-", 1)[-1]
    attempt = 0
    while time.monotonic() - healed < RECOVERY_GIVE_UP:
        invoked = history.now()
        target = cluster.nodes[attempt % len(cluster.nodes)].proxy.target
        opened: list[FastProducer] = []
        try:
            first = await asyncio.wait_for(_write_one(target, topic, name, attempt, opened), PROBE_TIMEOUT)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
            failed = Send(name, attempt, base, invoked, history.now(), "info", None, error)
            history.sends.append(failed)
            attempt += 1
            await asyncio.sleep(0.2)
            continue
        finally:
            for producer in opened:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(producer.close(), 5)
        history.sends.append(Send(name, attempt, base, invoked, history.now(), "ok",
                                  first if topic == base else None))
        return topic, time.monotonic() - healed
    return topic, float("inf")


async def _write_one(target: str, topic: str, name: str, n: int, opened: list[FastProducer]) -> int:
    """One record from a new producer; the offset it was stored at."""
    producer = await FastProducer.connect(target, topic, name, reconnect_tries=3)
    opened.append(producer)
    first, _ = await (await producer.send_batch([payload(name, n)]))
    return first

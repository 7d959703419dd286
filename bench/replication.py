"""`python -m bench replication`: what copies cost a producer, and how long a topic is unavailable when its
owner dies, on a real 3-broker cluster (etcd, moto S3; bench/cluster/servers.py), docs/REPLICATION.md.

Per run, in one cluster:
- `produce_rf{1,2,3}`: our FastProducer sends COUNT batches of 1,000 records of 256 B at full speed to a
  fresh Reliable topic with that replicationFactor (minInSyncReplicas 2 from 2 copies on), every copy in
  sync before the first send: records/s and the publish-ack p50/p99 (from send_batch to its ack), the
  factor-1 figures of the same run the baseline. Targets: factor 2 at >= 0.7x factor 1's throughput and
  <= 2x its ack p99. Each starts once the machine is quiet (the earlier topics' uploads to moto, which
  shares the 2 cores, done), and odd runs take the factors from the highest down, so that no factor
  always runs behind another's uploads. `brokers_cpu_per_mb_rf*`: the CPU the three brokers used over
  that phase per MB produced (the copies' cost; moto's own is not counted).
- `paced_ack_*_rf{1,2}`: the same at a fixed PACED_RATE (a load every factor carries here), from when each
  batch was due: the latency a copy adds when nothing queues. It too starts once the machine is quiet:
  right after the full-speed phase, whose segments were still being uploaded to moto, its p99 was 144-225
  ms at every factor (p50 2-7 ms).
- `failover_unavailable`: a producer paced at FAILOVER_RATE to a factor-2 topic; its owner is killed
  (SIGKILL); the longest stretch without an acknowledgement around the kill, lease expiry included (the
  brokers' lease is LEASE_S), KILLS times per run (the killed broker starts again between kills). Target:
  p99 <= 2 s. And `failover_lost`: acknowledged records the new owner does not hold (must be 0).
- `move_unavailable_rf{1,2}`: a producer paced at FAILOVER_RATE while its topic is unloaded MOVES times
  (bench/cluster/moves.py: unload, wait for an ack from the next owner, pause); per move the longest
  stretch without an acknowledgement. With factor 1 the old owner uploads the tail first; with factor 2
  it hands the topic to its in-sync follower (docs/REPLICATION.md, "A planned move"). Target for factor
  2: p99 <= 100 ms. `move_ack_errors`: acknowledgements lost, failed or out of sequence over both (0).

The brokers serve the native transport (docs/TRANSPORT.md): FastProducer sends over it, and followers
fetch their copies over it (docs/REPLICATION.md, "Fetches"). The 2-core machine runs the producer and all
three brokers: copies cost CPU there that a real cluster spreads over machines.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import uvloop

from bench.broker import machine_cpu, percentile
from bench.cluster.moves import PAUSE, fast_sender, moves_under_traffic
from bench.cluster.servers import RunningCluster, running_cluster
from bench.common import Options, Result, Target, median, paired_ratio, process_cpu, progress
from danube_fast.client import FastProducer
from danube_fast.client.reader import TopicReader
from danube_fast.codec import frames
from danube_fast.meta import keys
from danube_fast.meta.etcd import EtcdStore
from danube_fast.meta.resources import TopicReplicas
from danube_fast.meta.store import MetadataStore
from danube_fast.proto import DanubeAdmin_pb2 as admin_pb
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.proto import PolicyAdmin_pb2 as policy_pb
from danube_fast.proto import PolicyAdmin_pb2_grpc as policy_grpc
from danube_fast.testing.cluster import owner, wait_for

BATCH_RECORDS = 1000
RECORD_BYTES = 256
COUNT, QUICK_COUNT = 2000, 200  # batches per factor at full speed
PACED_RATE = 50_000  # records/s
PACED_S, QUICK_PACED_S = 8.0, 2.0
FAILOVER_RATE = 20_000  # records/s, in batches of FAILOVER_BATCH
FAILOVER_BATCH = 100
KILLS, QUICK_KILLS = 3, 1
MOVES, QUICK_MOVES = 10, 3
LEASE_S = 2
FACTORS = (1, 2, 3)
QUIET_WINDOW, QUIET_BUSY, QUIET_LIMIT = 1.0, 0.3, 90.0
SETTINGS: dict[str, int | str] = {"lease_ttl_s": LEASE_S, "replica_lag_ms": 2000, "replica_check_ms": 500,
                                  "load_report_ms": 1000}
THROUGHPUT_TARGET = Target(">= 0.7x factor 1", ">=", 0.7, of="ratio")
P99_TARGET = Target("<= 2x factor 1", "<=", 2.0, of="ratio")
FAILOVER_TARGET = Target("<= 2 s", "<=", 2.0)
MOVE_TARGET = Target("<= 100 ms", "<=", 100.0)


def load_line(quick: bool) -> str:
    count = QUICK_COUNT if quick else COUNT
    return (f"- Load: 3 brokers (`--mode cluster`, lease {LEASE_S} s, replica_lag_ms 2000, the native "
            f"transport served: producers and followers use it), one etcd, moto "
            f"S3; per factor {count * BATCH_RECORDS:,} records of {RECORD_BYTES} B in batches of "
            f"{BATCH_RECORDS} through FastProducer at full speed, then {PACED_RATE:,} records/s paced; the "
            f"failover: {FAILOVER_RATE:,} records/s in batches of {FAILOVER_BATCH} to a factor-2 topic, its "
            f"owner killed {QUICK_KILLS if quick else KILLS} times per run; the moves: the same rate in "
            f"batches of 100, the topic unloaded {QUICK_MOVES if quick else MOVES} times per run and factor")


def run_replication(options: Options) -> list[Result]:
    scratch = Path(tempfile.mkdtemp(prefix="danube-bench-replication-", dir=options.parent_dir))
    runs: list[dict[str, Any]] = []
    try:
        with running_cluster(scratch, settings=SETTINGS, native=True) as cluster:
            for r in range(options.runs):
                progress(f"run {r + 1}/{options.runs}")
                runs.append(uvloop.run(_run(cluster, r, options.quick)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _summarise(runs)


async def _run(cluster: RunningCluster, r: int, quick: bool) -> dict[str, Any]:
    store = await EtcdStore.connect([cluster.etcd.endpoint])
    got: dict[str, Any] = {}
    try:
        # Odd runs go from the highest factor down: neither factor always follows another's uploads.
        for factor in FACTORS if r % 2 == 0 else tuple(reversed(FACTORS)):
            topic = f"/default/bench-rf{factor}-{r}"
            await _replicated_topic(cluster, store, topic, factor)
            await _quiet()
            count = QUICK_COUNT if quick else COUNT
            cpu = _brokers_cpu(cluster)
            got[f"full{factor}"] = await _produce(cluster, topic, count, None)
            got[f"cpu{factor}"] = (_brokers_cpu(cluster) - cpu) / (count * BATCH_RECORDS * RECORD_BYTES / 1e6)
            paced = int((QUICK_PACED_S if quick else PACED_S) * PACED_RATE / BATCH_RECORDS)
            await _quiet()
            got[f"paced{factor}"] = await _produce(cluster, topic, paced, PACED_RATE)
            progress(f"  factor {factor}: {got[f'full{factor}'][0]:,.0f} records/s")
        for factor in (1, 2):
            got[f"moves{factor}"] = await _moves(cluster, store, f"/default/bench-moves-rf{factor}-{r}",
                                                 factor, QUICK_MOVES if quick else MOVES)
        got["failover"] = [await _failover(cluster, store, f"/default/bench-failover-{r}-{k}")
                           for k in range(QUICK_KILLS if quick else KILLS)]
    finally:
        await store.close()
    return got


async def _quiet() -> None:
    """Until the machine is idle (QUIET_BUSY of a core over QUIET_WINDOW s, at most QUIET_LIMIT s): the
    earlier topics' uploads to moto, which shares these 2 cores, are done before the next measurement."""
    deadline = time.monotonic() + QUIET_LIMIT
    while time.monotonic() < deadline:
        before = machine_cpu()
        await asyncio.sleep(QUIET_WINDOW)
        if machine_cpu() - before < QUIET_BUSY * QUIET_WINDOW:
            return
    progress(f"  the machine did not go quiet within {QUIET_LIMIT:.0f} s")


def _brokers_cpu(cluster: RunningCluster) -> float:
    """CPU seconds the three brokers have used."""
    return sum(process_cpu(b.pid) for b in cluster.brokers)


async def _admin(cluster: RunningCluster) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"127.0.0.1:{cluster.brokers[0].admin_port}")


async def _replicated_topic(cluster: RunningCluster, store: MetadataStore, topic: str, factor: int) -> None:
    """A Reliable topic with `factor` copies, each in sync."""
    async with await _admin(cluster) as channel:
        topics: Any = admin_grpc.TopicAdminStub(channel)  # type: ignore[no-untyped-call]
        await topics.CreateTopic(admin_pb.NewTopicRequest(name=topic, dispatch_strategy=admin_pb.Reliable),
                                 timeout=30)
        if factor > 1:
            policies: Any = policy_grpc.PolicyAdminStub(channel)  # type: ignore[no-untyped-call]
            changes = json.dumps({"replicationFactor": factor, "minInSyncReplicas": 2})
            await policies.SetTopicPolicy(policy_pb.SetTopicPolicyRequest(topic=topic, changes=changes),
                                          timeout=30)
    if factor > 1:
        await wait_for(lambda: _in_sync(store, topic, factor), f"{factor} copies of {topic} in sync", 60.0)


async def _in_sync(store: MetadataStore, topic: str, factor: int) -> bool | None:
    kv = await store.get(keys.replicas(*keys.split_topic_name(topic)))
    return True if kv is not None and len(TopicReplicas.from_json(kv.value).isr) >= factor else None


async def _produce(cluster: RunningCluster, topic: str, count: int, rate: float | None
                   ) -> tuple[float, list[float]]:
    """(records/s, ack latencies in s): `count` batches, at full speed or offered at `rate` records/s."""
    producer = await FastProducer.connect(cluster.brokers[0].target, topic, "bench",
                                          max_inflight_bytes=64 << 20)
    payloads = [b"r" * RECORD_BYTES] * BATCH_RECORDS
    acks: list[float] = []
    try:
        start = time.perf_counter()
        for i in range(count):
            due = time.perf_counter()
            if rate is not None:
                due = start + i * BATCH_RECORDS / rate
                if (wait := due - time.perf_counter()) > 0:
                    await asyncio.sleep(wait)
            future = await producer.send_batch(payloads)
            future.add_done_callback(_timer(acks, due))
        await producer.flush()
        elapsed = time.perf_counter() - start
    finally:
        await producer.close()
    return count * BATCH_RECORDS / elapsed, sorted(acks)


def _timer(acks: list[float], due: float) -> Callable[[object], None]:
    """A done-callback that records the seconds since `due`."""
    def record(_: object) -> None:
        acks.append(time.perf_counter() - due)
    return record


async def _moves(cluster: RunningCluster, store: MetadataStore, topic: str, factor: int, n: int
                 ) -> tuple[list[float], int]:
    """(ms without an ack per move, acknowledgements lost, failed or out of sequence)."""
    await _replicated_topic(cluster, store, topic, factor)
    moves, acks, _ = await moves_under_traffic(store, topic, n, PAUSE, fast_sender(
        cluster.brokers[0].target, topic, FAILOVER_RATE), progress)
    check = acks.check()
    progress(f"  factor {factor} moves: {check}")
    return [m.gap_ms for m in moves], sum(check[k] for k in ("failed", "unresolved", "holes", "overlaps"))


async def _failover(cluster: RunningCluster, store: MetadataStore, topic: str) -> tuple[float, int]:
    """(seconds without an ack around the owner's kill, acknowledged records the topic lost)."""
    await _replicated_topic(cluster, store, topic, 2)
    dead = await owner(store, topic)
    victim = next(b for b in cluster.brokers if b.broker_id == dead)
    entry = next(b for b in cluster.brokers if b is not victim)
    producer = await FastProducer.connect(entry.target, topic, "failover", reconnect_tries=1000)
    payloads = [b"f" * RECORD_BYTES] * FAILOVER_BATCH
    acked: list[tuple[float, int]] = []  # (when, the batch's last offset)
    stop = asyncio.Event()

    async def send() -> None:
        start = time.perf_counter()
        i = 0
        while not stop.is_set():
            due = start + i * FAILOVER_BATCH / FAILOVER_RATE
            if (wait := due - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            future = await producer.send_batch(payloads)
            future.add_done_callback(lambda f: acked.append((time.perf_counter(), f.result()[1]))
                                     if not f.cancelled() and f.exception() is None else None)
            i += 1

    sender = asyncio.create_task(send())
    try:
        await asyncio.sleep(2.0)
        killed = time.perf_counter()
        victim.kill()
        await asyncio.sleep(LEASE_S + 6.0)
        stop.set()
        await sender
        await producer.flush()
    finally:
        await producer.close()
    victim.start()  # the cluster has three brokers again for what comes next
    times = [at for at, _ in acked]
    before = max((t for t in times if t < killed), default=killed)
    after = min((t for t in times if t > killed), default=float("inf"))
    held: set[int] = set()
    async with TopicReader(entry.target) as reader:
        async for data, _, _ in reader.read(topic, 0, 0):
            held.update(h.base_offset + h.record_count - 1 for h in frames.scan_batches(bytes(data)))
    lost = sum(1 for _, last in acked if last not in held)  # a batch's last offset ends a stored batch
    return after - before, lost


def _summarise(runs: list[dict[str, Any]]) -> list[Result]:
    n = len(runs)
    out: list[Result] = []
    rate1 = [r["full1"][0] for r in runs]
    p99_1 = [percentile(r["full1"][1], 0.99) * 1e3 for r in runs]
    for f in FACTORS:
        rate = [r[f"full{f}"][0] for r in runs]
        p50 = [percentile(r[f"full{f}"][1], 0.5) * 1e3 for r in runs]
        p99 = [percentile(r[f"full{f}"][1], 0.99) * 1e3 for r in runs]
        base = f > 1
        out += [
            Result(f"produce_rf{f}", "records/s", median(rate), n, median(rate1) if base else None,
                   paired_ratio(rate, rate1) if base else None, THROUGHPUT_TARGET if f == 2 else None),
            Result(f"ack_p50_rf{f}", "ms", median(p50), n),
            Result(f"brokers_cpu_per_mb_rf{f}", "ms/MB", median([r[f"cpu{f}"] * 1e3 for r in runs]), n),
            Result(f"ack_p99_rf{f}", "ms", median(p99), n, median(p99_1) if base else None,
                   paired_ratio(p99, p99_1) if base else None, P99_TARGET if f == 2 else None),
        ]
    for f in FACTORS:
        p50 = [percentile(r[f"paced{f}"][1], 0.5) * 1e3 for r in runs]
        p99 = [percentile(r[f"paced{f}"][1], 0.99) * 1e3 for r in runs]
        out += [Result(f"paced_ack_p50_rf{f}", "ms", median(p50), n),
                Result(f"paced_ack_p99_rf{f}", "ms", median(p99), n)]
    for f in (1, 2):
        moved = sorted(g for r in runs for g in r[f"moves{f}"][0])
        out += [Result(f"move_unavailable_p50_rf{f}", "ms", percentile(moved, 0.5), len(moved)),
                Result(f"move_unavailable_p99_rf{f}", "ms", percentile(moved, 0.99), len(moved),
                       target=MOVE_TARGET if f == 2 else None)]
    out.append(Result("move_ack_errors", "acks", float(sum(r[f"moves{f}"][1] for r in runs for f in (1, 2))),
                      n, target=Target("0", "<=", 0.0)))
    gaps = sorted(g for r in runs for g, _ in r["failover"])
    out += [Result("failover_unavailable_p50", "s", percentile(gaps, 0.5), len(gaps)),
            Result("failover_unavailable_p99", "s", percentile(gaps, 0.99), len(gaps),
                   target=FAILOVER_TARGET),
            Result("failover_lost", "records", float(sum(lost for r in runs for _, lost in r["failover"])),
                   len(gaps), target=Target("0", "<=", 0.0))]
    return out

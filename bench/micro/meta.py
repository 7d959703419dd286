"""`python -m bench meta`: the metadata figures, each the median over `runs` runs.

The suite starts its own etcd (danube_fast.testing.etcd) and an EmbeddedStore, both with their data in
one scratch directory, so both fsync to the same file system. Every EtcdStore figure is paired with the same
operation made by a bare `aetcd.Client` against the same etcd, back to back in the same run (the order
alternates between runs); the ratio (ours / raw) is the median of the per-pair ratios, so it shows what
EtcdStore adds (request checks, deadline, the "hasleader" metadata, response conversion) rather than how fast
this disk is today. Everything runs on uvloop, the broker's loop. The retention pass over 10,000 objects is
bench/micro/retention.py's.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aetcd
import uvloop

from bench.common import Options, Result, Target, median, no_gc, paired_ratio, progress, time_calls
from bench.micro.retention import retention_figures
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.etcd import EtcdStore
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.store import MAX_TXN_OPS, Compare, MetadataStore, Put
from danube_fast.testing.etcd import EtcdServer, start_etcd

VALUE = b"v" * 128  # about the size of the JSON values the broker writes
PUT_KEYS = 1000  # puts cycle over this many keys, so the key space stays the same size
CONCURRENCY = 64
WARMUP_OPS = 8
CACHE_KEYS = 10_000
CACHE_READS = 1000  # keys read per timed call: the loop's own cost is spread over them
PREFIX = "/bench/"
CACHE_TARGET = Target("< 2 µs", "<=", math.nextafter(2.0, 0.0))

Op = Callable[[int], Awaitable[object]]
Kind = Literal["put", "txn"]



@dataclass(frozen=True)
class Workload:
    kind: Kind
    concurrency: int

    @property
    def name(self) -> str:
        return self.kind if self.concurrency == 1 else f"{self.kind}_c{self.concurrency}"


WORKLOADS = tuple(Workload(kind, n) for kind in ("put", "txn") for n in (1, CONCURRENCY))


def budget_seconds(quick: bool) -> float:
    """Per figure and run: long enough for some hundreds of fsynced writes even with a single writer."""
    return 0.25 if quick else 2.0


def run_meta(options: Options) -> tuple[list[Result], str]:
    """The figures, and the version of the etcd they were measured against."""
    scratch = Path(tempfile.mkdtemp(prefix="danube-bench-meta-", dir=options.parent_dir))
    server: EtcdServer | None = None
    try:
        server = start_etcd(scratch / "etcd" / "data", name="bench")
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            found = runner.run(_measure_all(server.endpoint, scratch, options))
        return found, server.version()
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


async def _measure_all(endpoint: str, scratch: Path, options: Options) -> list[Result]:
    seconds = budget_seconds(options.quick)
    embedded = await EmbeddedStore.open(scratch / "meta.db")
    etcd = await EtcdStore.connect([endpoint])
    host, _, port = endpoint.rpartition(":")
    raw = aetcd.Client(host, int(port))
    await raw.connect()
    try:
        results = [await cache_figure(embedded, options.runs, seconds)]
        results += await embedded_figures(embedded, options.runs, seconds)
        results += await etcd_figures(etcd, raw, options.runs, seconds)
        for name, store in (("embedded", embedded), ("etcd", etcd)):
            results += await retention_figures(name, store, scratch, options.runs, options.quick)
    finally:
        await raw.close()
        await etcd.close()
        await embedded.close()
    return results


# -- LocalCache -----------------------------------------------------------------------------------------


async def cache_figure(store: MetadataStore, runs: int, seconds: float) -> Result:
    """µs per `LocalCache.get` of a present key, from a cache of CACHE_KEYS keys (Python loop included)."""
    prefix = f"{PREFIX}cache/"
    names = [f"{prefix}{i:05d}" for i in range(CACHE_KEYS)]
    for start in range(0, len(names), MAX_TXN_OPS):
        await store.transaction((), [Put(k, VALUE) for k in names[start:start + MAX_TXN_OPS]])
    cache = await LocalCache.start(store, [prefix])
    try:
        picked = random.Random(7).choices(names, k=CACHE_READS)
        if any(cache.get(k) is None for k in picked):
            raise RuntimeError("the LocalCache misses keys it was loaded with")
        get = cache.get

        def reads() -> None:
            for k in picked:
                get(k)

        per_call: list[float] = []
        for run in range(runs):
            calls, elapsed = time_calls(reads, seconds)
            per_call.append(elapsed / (calls * len(picked)) * 1e6)
            progress(f"run {run + 1}/{runs} cache_get: {per_call[-1]:.3f} µs")
    finally:
        await cache.close()
        await store.delete_prefix(prefix)
    return Result("cache_get", "µs", median(per_call), runs, target=CACHE_TARGET)


# -- store operations -----------------------------------------------------------------------------------


def _put_key(i: int) -> str:
    return f"{PREFIX}put/{i % PUT_KEYS:04d}"


def _txn_key(tag: str, i: int) -> str:
    return f"{PREFIX}txn/{tag}/{i}"


def store_op(store: MetadataStore, kind: Kind, tag: str) -> Op:
    """A put, or a create-if-absent transaction (compare version == 0, then put) of a fresh key."""
    if kind == "put":
        return lambda i: store.put(_put_key(i), VALUE)

    async def txn(i: int) -> None:
        key = _txn_key(tag, i)
        if not (await store.transaction([Compare(key, "version", "==", 0)], [Put(key, VALUE)])).succeeded:
            raise RuntimeError(f"the transaction creating {key} failed its compare")

    return txn


def raw_op(client: Any, kind: Kind, tag: str) -> Op:
    """The same operation through aetcd's own `Client.put` and `Client.transaction`."""
    if kind == "put":
        return lambda i: client.put(_put_key(i).encode(), VALUE)

    async def txn(i: int) -> None:
        key = _txn_key(tag, i).encode()
        succeeded, _ = await client.transaction(compare=[client.transactions.version(key) == 0],
                                                success=[client.transactions.put(key, VALUE)], failure=[])
        if not succeeded:
            raise RuntimeError(f"the transaction creating {key!r} failed its compare")

    return txn


async def rate(op: Op, concurrency: int, seconds: float) -> float:
    """Operations per second: `concurrency` tasks each awaiting `op` in turn until `seconds` have passed."""
    counter = itertools.count()
    for _ in range(WARMUP_OPS):
        await op(next(counter))
    done = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await op(next(counter))
            done += 1

    with no_gc():
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return done / elapsed


async def embedded_figures(store: EmbeddedStore, runs: int, seconds: float) -> list[Result]:
    values: dict[str, list[float]] = {w.name: [] for w in WORKLOADS}
    for run in range(runs):
        for w in WORKLOADS:
            values[w.name].append(await rate(store_op(store, w.kind, f"e{run}"), w.concurrency, seconds))
            await store.delete_prefix(f"{PREFIX}txn/")
            progress(f"run {run + 1}/{runs} embedded_{w.name}: {values[w.name][-1]:,.0f} ops/s")
    return [Result(f"embedded_{w.name}", "ops/s", median(values[w.name]), runs) for w in WORKLOADS]


async def etcd_figures(store: EtcdStore, client: Any, runs: int, seconds: float) -> list[Result]:
    ours: dict[str, list[float]] = {w.name: [] for w in WORKLOADS}
    base: dict[str, list[float]] = {w.name: [] for w in WORKLOADS}
    await store.delete_prefix(PREFIX)
    for run in range(runs):
        for w in WORKLOADS:
            pair = [(ours, store_op(store, w.kind, f"o{run}")), (base, raw_op(client, w.kind, f"r{run}"))]
            for sink, op in pair if run % 2 else reversed(pair):  # raw first on even runs
                sink[w.name].append(await rate(op, w.concurrency, seconds))
                await store.delete_prefix(f"{PREFIX}txn/")
            mine, raw = ours[w.name][-1], base[w.name][-1]
            progress(f"run {run + 1}/{runs} etcd_{w.name}: {mine:,.0f} ops/s, raw aetcd {raw:,.0f} ops/s, "
                     f"ratio {mine / raw:.2f}")
    await store.delete_prefix(PREFIX)
    return [Result(f"etcd_{w.name}", "ops/s", median(ours[w.name]), runs, median(base[w.name]),
                   paired_ratio(ours[w.name], base[w.name])) for w in WORKLOADS]


def etcd_version_line(version: str) -> str:
    return f"- etcd: {version}, one member on loopback, data dir in the scratch directory under --dir"


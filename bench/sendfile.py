"""`python -m bench sendfile`: a consumer catching up from the segment files over the native transport, its
batches sent by sendfile() against the same read into memory and written (docs/TRANSPORT.md, "Catch-up
with sendfile"), in the same run.

Per run, two fresh standalone brokers in turn (which goes first alternates between runs), both with
`[wal] cache_bytes = 0` and every segment kept locally after its upload, so every read of the topic goes to
its segment files (as a consumer's behind the tail cache, within `retain_bytes`, does): `on` ([broker]
fast_sendfile = true, the default) and `off` (false). Each gets
COUNT batches of LARGE_BATCH records of LARGE_BYTES (1 MiB batches, bench/fast.py's 64 KiB shape)
produced durably, and once its CPU has gone quiet, a FastConsumer over the native transport subscribes at
the earliest offset and reads them back with cumulative acks. The WAL's direct appends leave what they
wrote out of the page cache, so the reads come from the device.
Figures: `catchup_{on,off}` MB/s of payload; `broker_cpu_per_mb_{on,off}`: the broker's CPU (every
thread) per MB read; `sendfile_share`: the part of the bytes read that went by sendfile (the broker's
counters), nearly all when the consumer keeps up; `span_share`: the part read as spans at all (by
sendfile, or through the transport after a socket stayed full: a busy machine's client reading late).
The `objects_*` figures are the same with every uploaded segment deleted from the WAL (`retain_bytes = 0`,
segments of OBJECT_SEGMENT_BYTES): the catch-up reads the folder object store's files (standalone's
default tier), but for the active segment; `objects_read_share` is the part of the records that were only
in the objects when the consumer started.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.broker import metered
from bench.common import Options, Result, median, paired_ratio, progress
from bench.fast import LARGE_BATCH, LARGE_BYTES, quiet
from danube_fast.client import FastConsumer, FastProducer
from danube_fast.testing.broker import Broker

COUNT = 2000  # batches of 1 MiB per run: 2 GiB, beyond what the device's own cache would hold
QUICK_COUNT = 50
OBJECT_SEGMENT_BYTES = 16 * 1024 * 1024
# No tail cache: every read goes to the files. `wal`: every segment kept after its upload, so the WAL's
# files serve the whole catch-up; `objects`: none kept, so the folder store's objects serve it.
CONFIGS = {
    "wal": "[wal]\ncache_bytes = 0\nretain_bytes = 8589934592\n[broker]\nfast_sendfile = {}\n",
    "objects": f"[wal]\ncache_bytes = 0\nretain_bytes = 0\nsegment_bytes = {OBJECT_SEGMENT_BYTES}\n"
               "[cluster]\nupload_interval_ms = 100\n[broker]\nfast_sendfile = {}\n",
}


def _spanned(broker: Broker) -> tuple[float, float]:
    """(bytes sent by sendfile, bytes of spans written through the transport instead) (native_sendfile.py)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics", timeout=10) as r:
        found = {name: float(value) for name, _, value in (line.partition(" ") for line in
                                                           r.read().decode().splitlines())
                 if name.startswith("danube_native_sendfile")}
    return found.get("danube_native_sendfile_bytes_total", 0.0), \
        found.get("danube_native_sendfile_copied_bytes_total", 0.0)


def _segments(broker: Broker, topic: str) -> list[int]:
    """The base offsets of the topic's WAL segments on disk (below the first: only in the objects)."""
    ns, short = topic.strip("/").split("/")
    files = (broker.data_dir / "wal" / ns / short).glob("*.log")
    return sorted(int(p.name.removesuffix(".log")) for p in files)


async def _uploaded(broker: Broker, topic: str, timeout: float = 120.0) -> None:
    """Until the WAL keeps only its active segment (with retain_bytes 0, every sealed one is uploaded and
    deleted), then until the broker is quiet again."""
    deadline = time.monotonic() + timeout
    while len(_segments(broker, topic)) > 1:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic}: sealed segments still in the WAL after {timeout:.0f} s")
        await asyncio.sleep(0.1)
    await quiet(broker.pid)


async def _catch_up(broker: Broker, topic: str, count: int, uploads: bool) -> tuple[float, float, float]:
    """`count` batches produced durably; once the broker is quiet (uploads done), a new subscription at the
    earliest offset reads them all with cumulative acks. (MB/s of payload, broker CPU ms per MB, the part of
    the records only in the object tier when it started)."""
    payloads = [b"r" * LARGE_BYTES] * LARGE_BATCH
    producer = await FastProducer.connect(broker.target, topic, "bench", reliable=True)
    try:
        for _ in range(count):
            await producer.send_batch(payloads)
        await producer.flush()
        # The tail cache keeps its newest group even at cache_bytes = 0: a last record of its own makes it
        # that group, not the end of the batches above (a busy machine's group commits take in many).
        await (await producer.send_batch([b"end"]))
    finally:
        await producer.close()
    await quiet(broker.pid)
    if uploads:
        await _uploaded(broker, topic)
    total = count * LARGE_BATCH
    in_objects = min(_segments(broker, topic)[0], total) / total
    consumer = await FastConsumer.connect(broker.target, topic, "catch-up", "bench", transport="native",
                                          initial_position="earliest")
    try:
        got = 0
        with metered(broker.pid) as usage:
            async for delivery in consumer.batches():
                got += delivery.last_offset - delivery.first_offset + 1
                await consumer.ack_cumulative(delivery.last_offset)
                if got >= total:
                    break
    finally:
        await consumer.close()
    mb = got * LARGE_BYTES / 1e6
    return mb / usage.wall, usage.server * 1e3 / mb, in_objects


def run_sendfile(options: Options) -> list[Result]:
    count = QUICK_COUNT if options.quick else COUNT
    scratch = Path(tempfile.mkdtemp(prefix="danube-bench-sendfile-", dir=options.parent_dir))
    results: list[Result] = []
    try:
        for source in CONFIGS:
            results += _run_source(options, source, count, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def _run_source(options: Options, source: str, count: int, scratch: Path) -> list[Result]:
    """Pairs of brokers with sendfile on and off reading from `source` ("wal" or "objects")."""
    rate: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    share: list[float] = []  # of the bytes read, sent by sendfile
    spanned: list[float] = []  # of the bytes read, read as spans (sendfile, or the rest of a full socket's)
    in_objects: list[float] = []
    for r in range(options.runs):
        for on in ((True, False) if r % 2 == 0 else (False, True)):
            progress(f"{source}, run {r + 1}/{options.runs}: sendfile {'on' if on else 'off'}")
            workdir = scratch / f"{source}-run{r}-{'on' if on else 'off'}"
            broker = Broker(workdir, CONFIGS[source].replace("{}", str(on).lower()), native=True,
                            die_with_parent=True)
            broker.start()
            try:
                mb_s, ms_per_mb, objects = asyncio.run(_catch_up(broker, f"/default/sendfile-{r}", count,
                                                                 source == "objects"))
                rate[on].append(mb_s)
                cpu[on].append(ms_per_mb)
                in_objects.append(objects)
                if on:
                    sent, copied = _spanned(broker)
                    share.append(sent / (count * LARGE_BATCH * LARGE_BYTES))
                    spanned.append((sent + copied) / (count * LARGE_BATCH * LARGE_BYTES))
            finally:
                broker.stop()
                shutil.rmtree(workdir, ignore_errors=True)
    runs = options.runs
    prefix = "" if source == "wal" else f"{source}_"
    results = [
        Result(f"{prefix}catchup_off", "MB/s", median(rate[False]), runs),
        Result(f"{prefix}catchup_on", "MB/s", median(rate[True]), runs, median(rate[False]),
               paired_ratio(rate[True], rate[False])),
        Result(f"{prefix}broker_cpu_per_mb_off", "ms/MB", median(cpu[False]), runs),
        Result(f"{prefix}broker_cpu_per_mb_on", "ms/MB", median(cpu[True]), runs, median(cpu[False]),
               paired_ratio(cpu[True], cpu[False])),
        Result(f"{prefix}sendfile_share", "of bytes", median(share), runs),
        Result(f"{prefix}span_share", "of bytes", median(spanned), runs),
    ]
    if source == "objects":
        results.append(Result("objects_read_share", "of records", median(in_objects), runs))
    return results


def load_line(count: int) -> str:
    return (f"- Load: {count:,} batches of {LARGE_BATCH} records of {LARGE_BYTES // 1024} KiB produced "
            "durably to a Reliable topic of a fresh standalone broker per figure pair ([wal] cache_bytes = "
            "0, retain_bytes 8 GiB: every read from the WAL's segment files; direct appends leave them out "
            "of the page cache), then read back from the earliest offset by a new FastConsumer over the "
            "native transport with cumulative acks; on: [broker] fast_sendfile = true, off: false; "
            f"objects_*: the same with retain_bytes 0 and segments of {OBJECT_SEGMENT_BYTES >> 20} MiB, "
            "read from the folder object store's files")

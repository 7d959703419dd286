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
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import urllib.request
from pathlib import Path

from bench.broker import metered
from bench.common import Options, Result, median, paired_ratio, progress
from bench.fast import LARGE_BATCH, LARGE_BYTES, quiet
from danube_fast.client import FastConsumer, FastProducer
from danube_fast.testing.broker import Broker

COUNT = 2000  # batches of 1 MiB per run: 2 GiB, beyond what the device's own cache would hold
QUICK_COUNT = 50
# No tail cache: every read goes to the files; every segment kept after its upload: the WAL's files, not
# the object tier's, serve the whole catch-up (objects are read into memory, docs/TRANSPORT.md).
CONFIG = "[wal]\ncache_bytes = 0\nretain_bytes = 8589934592\n[broker]\nfast_sendfile = {}\n"


def _spanned(broker: Broker) -> tuple[float, float]:
    """(bytes sent by sendfile, bytes of spans written through the transport instead) (native_sendfile.py)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics", timeout=10) as r:
        found = {name: float(value) for name, _, value in (line.partition(" ") for line in
                                                           r.read().decode().splitlines())
                 if name.startswith("danube_native_sendfile")}
    return found.get("danube_native_sendfile_bytes_total", 0.0), \
        found.get("danube_native_sendfile_copied_bytes_total", 0.0)


async def _catch_up(broker: Broker, topic: str, count: int) -> tuple[float, float]:
    """`count` batches produced durably; once the broker is quiet (uploads done), a new subscription at the
    earliest offset reads them all with cumulative acks. (MB/s of payload, broker CPU ms per MB)."""
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
    total = count * LARGE_BATCH
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
    return mb / usage.wall, usage.server * 1e3 / mb


def run_sendfile(options: Options) -> list[Result]:
    count = QUICK_COUNT if options.quick else COUNT
    scratch = Path(tempfile.mkdtemp(prefix="danube-bench-sendfile-", dir=options.parent_dir))
    rate: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    share: list[float] = []  # of the bytes read, sent by sendfile
    spanned: list[float] = []  # of the bytes read, read as spans (sendfile, or the rest of a full socket's)
    try:
        for r in range(options.runs):
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                progress(f"run {r + 1}/{options.runs}: sendfile {'on' if on else 'off'}")
                workdir = scratch / f"run{r}-{'on' if on else 'off'}"
                broker = Broker(workdir, CONFIG.format(str(on).lower()), native=True, die_with_parent=True)
                broker.start()
                try:
                    mb_s, ms_per_mb = asyncio.run(_catch_up(broker, f"/default/sendfile-{r}", count))
                    rate[on].append(mb_s)
                    cpu[on].append(ms_per_mb)
                    if on:
                        sent, copied = _spanned(broker)
                        share.append(sent / (count * LARGE_BATCH * LARGE_BYTES))
                        spanned.append((sent + copied) / (count * LARGE_BATCH * LARGE_BYTES))
                finally:
                    broker.stop()
                    shutil.rmtree(workdir, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    runs = options.runs
    return [
        Result("catchup_off", "MB/s", median(rate[False]), runs),
        Result("catchup_on", "MB/s", median(rate[True]), runs, median(rate[False]),
               paired_ratio(rate[True], rate[False])),
        Result("broker_cpu_per_mb_off", "ms/MB", median(cpu[False]), runs),
        Result("broker_cpu_per_mb_on", "ms/MB", median(cpu[True]), runs, median(cpu[False]),
               paired_ratio(cpu[True], cpu[False])),
        Result("sendfile_share", "of bytes", median(share), runs),
        Result("span_share", "of bytes", median(spanned), runs),
    ]


def load_line(count: int) -> str:
    return (f"- Load: {count:,} batches of {LARGE_BATCH} records of {LARGE_BYTES // 1024} KiB produced "
            "durably to a Reliable topic of a fresh standalone broker per figure pair ([wal] cache_bytes = "
            "0, retain_bytes 8 GiB: every read from the WAL's segment files; direct appends leave them out "
            "of the page cache), then read back from the earliest offset by a new FastConsumer over the "
            "native transport with cumulative acks; on: [broker] fast_sendfile = true, off: false")

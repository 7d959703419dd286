"""Power loss, simulated at the file level: a broker subprocess writes a ledger of what each fdatasync made
durable (danube_fast/storage/sync_ledger.py), is killed with SIGKILL while a producer has batches in flight,
and every WAL segment is then cut to what its ledger says was durable (a segment never made durable is
deleted, its index with it), as a machine that lost power at that moment would have kept the files. The
broker restarts on what is left.

- sync = always: every acknowledged record is read back, with its payload, at its offset.
- sync = interval(50): what was acknowledged before the last interval is read back.
- sync = none: acknowledged records are lost (the simulation bites: nothing was fsynced before the acks).

The metadata store (SQLite) keeps its own durability and is not cut.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from danube_fast.client import FastProducer
from danube_fast.client.reader import TopicReader
from danube_fast.codec.frames import iter_records
from danube_fast.storage._wal_common import INDEX_SUFFIX, LOG_SUFFIX
from danube_fast.testing.broker import Broker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOPIC = "/default/power"
BATCHES = 400  # acknowledged before the kill
RECORDS = 50  # per batch
IN_FLIGHT = 16


def payload(batch: int, i: int) -> bytes:
    return b"b%05d-r%03d" % (batch, i)


ACKED_AT: dict[int, float] = {}  # offset -> time.monotonic() of its acknowledgement, in the last run
KILLED_AT: list[float] = []


async def produce_then_kill(broker: Broker) -> dict[int, bytes]:
    """Offset -> payload of every acknowledged record; the broker is killed with batches still in flight."""
    producer = await FastProducer.connect(broker.target, TOPIC, "p", reconnect_tries=1)
    acked: dict[int, bytes] = {}
    ACKED_AT.clear()
    KILLED_AT.clear()
    slots = asyncio.Semaphore(IN_FLIGHT)
    sent = 0
    try:
        while len(acked) < BATCHES * RECORDS:
            await slots.acquire()
            batch = [payload(sent, i) for i in range(RECORDS)]
            future = await producer.send_batch(batch)

            def done(f: asyncio.Future[tuple[int, int]], batch: list[bytes] = batch) -> None:
                slots.release()
                if not f.cancelled() and f.exception() is None:
                    first, last = f.result()
                    assert last - first + 1 == len(batch)
                    acked.update(zip(range(first, last + 1), batch, strict=True))
                    ACKED_AT.update(dict.fromkeys(range(first, last + 1), time.monotonic()))

            future.add_done_callback(done)
            sent += 1
        broker.kill()  # SIGKILL, IN_FLIGHT batches still unanswered
        KILLED_AT.append(time.monotonic())
    finally:
        # The unanswered batches fail once its one reconnect is refused; close() waits for that.
        await asyncio.gather(asyncio.wait_for(producer.close(), 60), return_exceptions=True)
    return dict(acked)


def cut_to_ledger(data_dir: Path, ledger: Path) -> tuple[int, int]:
    """Cut every segment to its durable size (delete the never-durable ones); (segments cut, deleted)."""
    durable: dict[str, int] = {}
    for line in ledger.read_text().splitlines():
        size, path = line.split(" ", 1)
        durable[path] = max(durable.get(path, 0), int(size))
    cut = deleted = 0
    for log in data_dir.rglob("*" + LOG_SUFFIX):
        keep = durable.get(str(log))
        if keep is None:
            log.unlink()
            log.with_suffix(INDEX_SUFFIX).unlink(missing_ok=True)
            deleted += 1
        elif log.stat().st_size > keep:
            os.truncate(log, keep)
            cut += 1
    return cut, deleted


async def read_back(broker: Broker) -> dict[int, bytes]:
    stored: dict[int, bytes] = {}
    async with TopicReader(broker.target) as reader:
        start, end = await reader.offsets(TOPIC)
        if end > start:
            async for data, _, _ in reader.read(TOPIC, start, end):
                stored.update((r.offset, r.payload) for r in iter_records(data))
    return stored


def run(tmp_path: Path, sync: str) -> tuple[dict[int, bytes], dict[int, bytes], tuple[int, int]]:
    ledger = tmp_path / "ledger"
    broker = Broker(tmp_path / "broker", f'[wal]\nsync = "{sync}"\n', metrics=False)
    broker.env["DANUBE_FAST_SYNC_LEDGER"] = str(ledger)
    ledger.touch()
    broker.start()
    try:
        acked = asyncio.run(produce_then_kill(broker))
        assert not broker.running
        changed = cut_to_ledger(broker.data_dir, ledger)
        broker.env.pop("DANUBE_FAST_SYNC_LEDGER")
        broker.start()
        stored = asyncio.run(read_back(broker))
    finally:
        broker.close()
    return acked, stored, changed


def test_sync_always_keeps_every_acknowledged_record(tmp_path: Path) -> None:
    acked, stored, (cut, deleted) = run(tmp_path, "always")
    assert len(acked) >= BATCHES * RECORDS
    lost = sorted(o for o, p in acked.items() if stored.get(o) != p)
    assert not lost, f"{len(lost)} acknowledged records lost, first {lost[:5]} (cut {cut}, deleted {deleted})"


def test_sync_interval_loses_only_the_last_interval(tmp_path: Path) -> None:
    """interval(ms): what was acknowledged more than the interval (plus scheduling slack) before the power
    went is durable."""
    acked, stored, _ = run(tmp_path, "interval(50)")
    deadline = KILLED_AT[0] - 0.050 - 0.25
    old_lost = sorted(o for o, p in acked.items() if stored.get(o) != p and ACKED_AT[o] < deadline)
    assert len(acked) >= BATCHES * RECORDS and not old_lost, old_lost[:5]


def test_sync_none_loses_acknowledged_records(tmp_path: Path) -> None:
    """What the test above would catch: acknowledgements that no fdatasync covered do not survive."""
    acked, stored, (cut, deleted) = run(tmp_path, "none")
    lost = [o for o, p in acked.items() if stored.get(o) != p]
    assert cut + deleted >= 1 and len(lost) > 0.9 * len(acked), (cut, deleted, len(lost), len(acked))

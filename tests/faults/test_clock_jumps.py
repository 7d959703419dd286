"""The wall clock jumps under a running broker (libfaketime, Debian `faketime`: CLOCK_REALTIME moved by an
offset the test rewrites, CLOCK_MONOTONIC untouched, as an NTP step or an operator's `date -s` does).

Leases, the pause detector, timers and uptime run on the monotonic clock (docs/ARCHITECTURE.md); the wall
clock only stamps what is written (created_at, publish times chosen by producers). So after a jump of two
hours forward and then three back, the broker keeps its registration and leadership, acknowledges and
delivers every record in order, and its uptime does not jump. The delivery-age histogram, the one figure
made of wall-clock differences, shows the jump (two hours of age) and counts the negative ages after the
jump back as 0.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from danube_fast.client import FastConsumer, FastProducer
from danube_fast.codec.frames import iter_records
from danube_fast.testing.broker import Broker

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120),
              pytest.mark.skipif(not FAKETIME.exists(), reason="libfaketime is not installed (faketime)")]

TOPIC = "/default/clock"
BATCHES = 30  # per clock setting
RECORDS = 100


def metrics(broker: Broker) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {s.name + str(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


async def traffic(broker: Broker, offsets: list[str], offset_file: Path) -> list[bytes]:
    """Produce BATCHES batches under each clock offset in turn, reading them back as they come."""
    producer = await FastProducer.connect(broker.target, TOPIC, "p")
    consumer = await FastConsumer.connect(broker.target, TOPIC, "s", "c")
    received: list[bytes] = []
    total = len(offsets) * BATCHES * RECORDS

    async def read() -> None:
        async for delivery in consumer.batches():
            received.extend(r.payload for r in iter_records(delivery.data)
                            if r.offset >= consumer.start_offset)
            await consumer.ack_cumulative(delivery.last_offset)
            if len(received) >= total:
                return

    reader = asyncio.create_task(read())
    try:
        for n, offset in enumerate(offsets):
            offset_file.write_text(offset + "\n")  # read by the broker at its next clock_gettime
            for b in range(BATCHES):
                first, last = await (await producer.send_batch(
                    [b"%d-%03d-%03d" % (n, b, i) for i in range(RECORDS)]))
                assert last - first + 1 == RECORDS
        await asyncio.wait_for(reader, 30)
    finally:
        reader.cancel()
        await consumer.close()
        await producer.close()
    return received


def test_wall_clock_jumps_change_nothing_but_stamps(tmp_path: Path) -> None:
    offset_file = tmp_path / "clock"
    offset_file.write_text("+0\n")
    broker = Broker(tmp_path / "broker")
    broker.env.update({"LD_PRELOAD": str(FAKETIME), "FAKETIME_TIMESTAMP_FILE": str(offset_file),
                       "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
    broker.start()
    try:
        offsets = ["+0", "+2h", "-1h"]
        received = asyncio.run(traffic(broker, offsets, offset_file))
        expected = [b"%d-%03d-%03d" % (n, b, i) for n in range(len(offsets)) for b in range(BATCHES)
                    for i in range(RECORDS)]
        assert received == expected
        m = metrics(broker)
        assert m["danube_broker_uptime_seconds[]"] < 60  # monotonic: no jump of hours
        # The one figure made of wall-clock differences shows the jump reached the broker: deliveries two
        # hours ahead of the producer's clock, and none below 0 when it went back.
        assert m["danube_delivery_age_seconds_sum[('api', 'fast')]"] > 7000
        assert m["danube_delivery_age_seconds_bucket[('api', 'fast'), ('le', '0.0001')]"] >= 1
        log = broker.log_path.read_text()
        # One registration, one election, nothing worse than INFO: no lease lost, no pause, no step-down.
        assert log.count(" registered (session ") == 1 and log.count(" is the leader of epoch ") == 1, log
        # From when it served on: a busy machine may hold the starting broker back long enough for the
        # pause detector to say so, before any clock has moved.
        served = log[log.index("broker ready"):]
        assert not re.search(r" (WARNING|ERROR|CRITICAL) ", served), log[-3000:]
    finally:
        broker.close()

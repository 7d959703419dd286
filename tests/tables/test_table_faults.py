"""The table writer's faults on a real standalone broker (docs/TABLES.md, "Faults"): records it can no longer
read (an object deleted or corrupted after the WAL let go of it) stop the table by default, naming them,
and are skipped and counted with `[tables] fail_on_data_loss = false`; a full disk under the warehouse (a
real tmpfs) and a catalog another process holds locked fail commits with their cause in the status while
the broker goes on serving, leave nothing half-written in the table, and the writer resumes by itself once
they are gone."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from danube_fast.client import FastProducer
from danube_fast.meta.resources_storage import TableCatalog
from danube_fast.storage.objects.format import HEADER_SIZE
from danube_fast.tables.catalog import file_io, open_catalog
from danube_fast.testing.broker import Broker, BrokerFactory
from danube_fast.testing.moto import ACCESS_KEY, REGION, SECRET_KEY, MotoServer
from danube_fast.testing.proxy import Proxy
from tests.compat.compat_support import scrape
from tests.tables.test_table_broker import CLI, CONFIG, admin, catalog_of, caught_up, table_rows, until

# The WAL lets go of uploaded segments at once (retain_bytes 0): their records are then in objects only.
TIERED = CONFIG.replace("segment_bytes = 65536\n", "segment_bytes = 65536\nretain_bytes = 0\n")


def value(offset: int, size: int) -> bytes:
    """The record at `offset`: its number, then `size` bytes that do not compress (seeded by the offset)."""
    return b"record-%d:" % offset + random.Random(offset).randbytes(size)


def produce(broker: Broker, topic: str, first: int, count: int, size: int = 200) -> None:
    async def run() -> None:
        producer = await FastProducer.connect(broker.target, topic, "p", linger_ms=1)
        for low in range(first, first + count, 100):
            await producer.send_batch([value(i, size) for i in range(low, min(low + 100, first + count))])
        await producer.flush()
        await producer.close()

    asyncio.run(run())


def expected(offsets: Any, size: int = 200) -> list[tuple[int, bytes]]:
    return [(i, value(i, size)) for i in offsets]


def status(broker: Broker, topic: str) -> dict[str, Any] | None:
    got = subprocess.run([*CLI, "admin", "tables", "status", topic, "--admin-addr",
                          f"127.0.0.1:{broker.admin_port}", "--output", "json"], capture_output=True,
                         timeout=60, check=False)
    return dict(json.loads(got.stdout)["tables"][0]) if got.returncode == 0 else None


def object_out_of_the_wal(broker: Broker, topic: str) -> Path | None:
    """The object holding offset 0, once the WAL no longer holds its records (so only the object has them)."""
    ns, short = topic.strip("/").split("/")
    objects = list((broker.data_dir / "objects" / ns / short).glob("data-0-*.dnb1"))
    wal = [int(p.name.removesuffix(".log")) for p in (broker.data_dir / "wal" / ns / short).glob("*.log")]
    if not objects or not wal:
        return None
    return objects[0] if min(wal) > span(objects[0])[1] else None


def span(obj: Path) -> tuple[int, int]:
    first, last = (int(x) for x in obj.stem.split("-")[1:3])
    return first, last


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_records_the_table_cannot_read_stop_it_by_default_and_are_skipped_and_counted_when_told(
        broker_factory: BrokerFactory, damage: str) -> None:
    broker = broker_factory.start(TIERED)
    topic = "/default/damaged"
    admin(broker, "topics", "create", topic, "--reliable")
    produce(broker, topic, 0, 3000)  # 600 KB: several segments, the first ones uploaded and out of the WAL
    victim = until("the first object out of the WAL", lambda: object_out_of_the_wal(broker, topic))
    first, last = span(victim)
    if damage == "missing":
        victim.unlink()
    else:
        data = bytearray(victim.read_bytes())
        data[HEADER_SIZE + 200] ^= 0xFF  # inside the first batch's records: its CRC fails
        victim.write_bytes(bytes(data))
    admin(broker, "policies", "set", topic, "--table", "envelope")
    row = until("the stop", lambda: (lambda s: s if s and s["stopped"] else None)(status(broker, topic)))
    assert "offset 0 cannot be read" in row["stopped"] and row["committed_offset"] == 0, row
    assert scrape(broker)[f'danube_table_failing{{topic="{topic}"}}'] == 1
    produce(broker, topic, 3000, 100)  # the broker goes on serving the topic
    assert table_rows(broker, "default.damaged") == []  # nothing was committed past the loss

    assert broker.config_file is not None
    broker.config_file.write_text(TIERED + "fail_on_data_loss = false\n")  # an operator's decision
    broker.restart()
    until("the table past the loss", lambda: caught_up(broker, topic, 3100))
    row = status(broker, topic)
    assert row is not None and row["stopped"] == "" and row["skipped_records"] == last - first + 1, row
    kept = [o for o in range(3100) if not first <= o <= last]
    assert table_rows(broker, "default.damaged") == expected(kept)


def test_a_full_disk_under_the_warehouse_fails_commits_until_there_is_room_then_the_table_catches_up(
        broker_factory: BrokerFactory, small_tmpfs: Path) -> None:
    broker = broker_factory.start(CONFIG + f'warehouse = "file://{small_tmpfs}"\n')
    topic = "/default/full"
    admin(broker, "topics", "create", topic, "--reliable")
    admin(broker, "policies", "set", topic, "--table", "envelope")
    produce(broker, topic, 0, 3000, size=1000)  # 3 MB that zstd cannot shrink, into a 1 MiB file system
    row = until("the full disk in the status", lambda: (
        lambda s: s if s and "No space left on device" in s["error"] else None)(status(broker, topic)))
    held = row["committed_offset"]
    assert held < 3000 and row["stopped"] == "", row
    produce(broker, topic, 3000, 100, size=1000)  # the broker goes on serving the topic
    assert table_rows(broker, "default.full") == expected(range(held), 1000)  # nothing half-written
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_tmpfs)], check=True)
    until("the table after the disk has room", lambda: caught_up(broker, topic, 3100))
    assert table_rows(broker, "default.full") == expected(range(3100), 1000)
    assert status(broker, topic)["error"] == ""  # type: ignore[index]


LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
db.execute("ROLLBACK")
"""


def test_a_catalog_another_process_holds_locked_fails_commits_until_it_lets_go(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(CONFIG)
    topic = "/default/locked"
    admin(broker, "topics", "create", topic, "--reliable")
    admin(broker, "policies", "set", topic, "--table", "envelope")
    produce(broker, topic, 0, 500)
    until("the first records", lambda: caught_up(broker, topic, 500))
    catalog = catalog_of(broker).uri.removeprefix("sqlite:///")
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, catalog], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        produce(broker, topic, 500, 500)  # the broker goes on serving the topic
        row = until("the locked catalog in the status", lambda: (
            lambda s: s if s and "database is locked" in s["error"] else None)(status(broker, topic)))
        assert row["committed_offset"] == 500 and row["stopped"] == "", row
    finally:
        assert locker.stdin is not None and locker.stdout is not None
        locker.stdin.close()
        locker.wait(30)
        locker.stdout.close()
    until("the table after the catalog is free", lambda: caught_up(broker, topic, 1000))
    assert table_rows(broker, "default.locked") == expected(range(1000))
    with sqlite3.connect(catalog) as db:  # the catalog names one table, with the current metadata
        assert db.execute("SELECT count(*) FROM iceberg_tables").fetchone() == (1,)


def test_an_s3_warehouse_cut_off_fails_commits_until_it_is_back(broker_factory: BrokerFactory,
                                                                 moto_server: MotoServer) -> None:
    """The table's files on S3 (moto) through the fault-injecting proxy: the object store unreachable."""
    bucket = moto_server.create_bucket()
    with Proxy(moto_server.endpoint.removeprefix("http://")) as proxy:
        s3 = (f'[cluster]\ns3_endpoint = "http://{proxy.target}"\ns3_region = "{REGION}"\n'
              f's3_access_key = "{ACCESS_KEY}"\ns3_secret_key = "{SECRET_KEY}"\n')
        broker = broker_factory.start(CONFIG.replace("[cluster]\n", s3) + f'warehouse = "s3://{bucket}/tables"\n')
        topic = "/default/on_s3"
        admin(broker, "topics", "create", topic, "--reliable")
        admin(broker, "policies", "set", topic, "--table", "envelope")
        produce(broker, topic, 0, 500)
        until("the first records", lambda: caught_up(broker, topic, 500))
        proxy.cut()
        produce(broker, topic, 500, 500)  # the broker goes on serving the topic (its objects are local)
        row = until("the object store's failure in the status", lambda: (
            lambda s: s if s and s["error"] else None)(status(broker, topic)))
        assert row["committed_offset"] == 500 and row["stopped"] == "", row
        assert "AWS Error NETWORK_CONNECTION" in row["error"], row  # pyarrow's S3 client, through the cut

        def rows() -> list[tuple[int, bytes]]:  # read from moto itself, not through the proxy
            location = TableCatalog(uri=catalog_of(broker).uri, warehouse=f"s3://{bucket}/tables", kind="sql")
            io = file_io(moto_server.endpoint, REGION, ACCESS_KEY, SECRET_KEY)
            got = open_catalog(location, read_only=True, io=io).load_table(("default", "on_s3")).scan(
                selected_fields=("offset", "value")).to_arrow()
            return sorted(zip(got.column("offset").to_pylist(), got.column("value").to_pylist(), strict=True))

        assert rows() == expected(range(500))  # nothing half-written
        proxy.pass_through()
        until("the table after the store is back", lambda: caught_up(broker, topic, 1000))
        assert rows() == expected(range(1000))

"""Topic tables on a real standalone broker (docs/TABLES.md): a topic that already holds records (in objects
and in its WAL) turns its table on through the CLI and is backfilled, later records follow within the lag,
the broker killed between writing Parquet and committing (and killed with -9 under load) resumes with every
offset in the table exactly once; pyiceberg and DuckDB read the same rows; the status command and the
metrics say what the table holds; bad requests get a clear refusal."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import duckdb
import pytest

from danube_fast.broker import crashpoints
from danube_fast.client import FastProducer
from danube_fast.meta.resources_storage import TableCatalog
from danube_fast.tables.catalog import open_catalog
from danube_fast.testing.broker import Broker, BrokerFactory
from tests.compat.compat_support import scrape

CLI = [sys.executable, "-m", "danube_fast.cli.main"]
CONFIG = ("[wal]\nsegment_bytes = 65536\n[cluster]\nupload_interval_ms = 300\n"
          "[tables]\nlag_ms = 500\npolicy_check_ms = 200\n")
WAIT = 60.0


def admin(broker: Broker, *args: str, code: int = 0) -> Any:
    done = subprocess.run([*CLI, "admin", *args, "--admin-addr", f"127.0.0.1:{broker.admin_port}",
                           "--output", "json"], capture_output=True, timeout=60, check=False)
    assert done.returncode == code, f"{args}: exit {done.returncode}\n{done.stdout!r}\n{done.stderr.decode()}"
    return json.loads(done.stdout) if code == 0 else done.stderr.decode()


def until(what: str, check: Any, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.2)


def produce(broker: Broker, topic: str, first: int, count: int, per_batch: int = 100) -> None:
    async def run() -> None:
        producer = await FastProducer.connect(broker.target, topic, "p", linger_ms=1)
        for low in range(first, first + count, per_batch):
            await producer.send_batch([b"record-%d" % i for i in range(low, min(low + per_batch,
                                                                                 first + count))])
        await producer.flush()
        await producer.close()

    asyncio.run(run())


def caught_up(broker: Broker, topic: str, offset: int) -> dict[str, Any] | None:
    got = subprocess.run([*CLI, "admin", "tables", "status", topic, "--admin-addr",
                          f"127.0.0.1:{broker.admin_port}", "--output", "json"], capture_output=True,
                         timeout=60, check=False)
    if got.returncode != 0:
        return None
    status: dict[str, Any] = json.loads(got.stdout)
    return status if status["tables"][0]["committed_offset"] >= offset else None


def table_rows(broker: Broker, table: str) -> list[tuple[int, bytes]]:
    """(offset, value) of every row of the table's current snapshot, read through pyiceberg."""
    cat = open_catalog(catalog_of(broker), read_only=True)
    got = cat.load_table(tuple(table.split("."))).scan(selected_fields=("offset", "value")).to_arrow()
    return sorted(zip(got.column("offset").to_pylist(), got.column("value").to_pylist(), strict=True))


def catalog_of(broker: Broker) -> TableCatalog:
    root = broker.data_dir.resolve() / "tables"
    return TableCatalog(uri=f"sqlite:///{root / 'catalog.db'}", warehouse=f"file://{root / 'warehouse'}")


def expected(first: int, count: int) -> list[tuple[int, bytes]]:
    return [(i, b"record-%d" % i) for i in range(first, first + count)]


def duckdb_count(metadata_location: str) -> tuple[int, int, int, int]:
    # The iceberg and avro extensions from PyPI (duckdb-ext-*): DuckDB downloads nothing.
    folder = os.path.join(os.path.dirname(os.path.dirname(duckdb.__file__)), "duckdb_ext", "extensions")
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "extension_directory": folder})
    row = con.execute(f"""SELECT count(*), count(DISTINCT "offset"), min("offset"), max("offset")
                          FROM iceberg_scan('{metadata_location}')""").fetchone()
    assert row is not None
    return row


def test_a_topic_with_records_is_backfilled_then_followed_and_every_reader_sees_each_offset_once(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(CONFIG)
    topic = "/default/orders"
    produce(broker, topic, 0, 3000)  # several segments: some records in objects, some in the WAL
    objects = broker.data_dir / "objects" / "default" / "orders"
    until("objects uploaded", lambda: list(objects.glob("*.dnb1")))
    admin(broker, "tables", "status", topic, code=1)  # no table yet: FAILED_PRECONDITION
    shown = admin(broker, "policies", "set", topic, "--table", "envelope")
    assert shown["tableMode"] == "envelope"
    status = until("the backfill", lambda: caught_up(broker, topic, 3000))
    row = status["tables"][0]
    assert row["table"] == "default.orders" and row["mode"] == "envelope" and row["files"] >= 1
    assert row["bytes"] > 0 and row["error"] == "" and row["stopped"] == ""
    assert table_rows(broker, "default.orders") == expected(0, 3000)
    produce(broker, topic, 3000, 500)
    started = time.monotonic()
    status = until("the new records", lambda: caught_up(broker, topic, 3500))
    assert time.monotonic() - started < 20  # lag_ms 500 on a busy machine: well under this
    assert table_rows(broker, "default.orders") == expected(0, 3500)
    assert duckdb_count(status["metadata_location"]) == (3500, 3500, 0, 3499)
    assert status["tables"][0]["lag_ms"] == 0
    listed = admin(broker, "tables", "snapshots", topic)  # what read_table's time travel picks from
    assert listed["table"] == "default.orders" and len(listed["snapshots"]) >= 2
    held = [snapshot["offsets"][topic] for snapshot in listed["snapshots"]]
    assert held == sorted(held) and held[-1] == 3500 and listed["snapshots"][-1]["records"] == 3500
    assert {snapshot["operation"] for snapshot in listed["snapshots"]} == {"append"}
    metrics = scrape(broker)
    assert metrics[f'danube_table_committed_offset{{topic="{topic}"}}'] == 3500
    assert metrics[f'danube_table_failing{{topic="{topic}"}}'] == 0


def test_killed_between_parquet_and_commit_then_killed_under_load_the_table_holds_each_offset_once(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.add(CONFIG + "[policy]\ntable_mode = \"envelope\"\n")
    broker.env[crashpoints.ENV] = crashpoints.TABLE_BEFORE_COMMIT
    broker.start()
    topic = "/default/crashy"
    produce(broker, topic, 0, 1000)
    until("the crash point", lambda: not broker.running)
    assert "crash point table_before_commit" in broker.log_tail()
    del broker.env[crashpoints.ENV]
    broker.start()
    until("the table after the crash", lambda: caught_up(broker, topic, 1000))
    assert table_rows(broker, "default.crashy") == expected(0, 1000)
    warehouse = broker.data_dir / "tables" / "warehouse" / "default" / "crashy" / "data"
    assert len(list(warehouse.rglob("*.parquet"))) > caught_up(broker, topic, 1000)["tables"][0]["files"]
    # kill -9 while records and commits flow, then again on restart
    for round_ in range(2):
        first = 1000 + round_ * 2000
        produce(broker, topic, first, 2000, per_batch=50)
        time.sleep(0.3 * (round_ + 1))
        broker.kill()
        broker.start()
    until("the table after the kills", lambda: caught_up(broker, topic, 5000))
    assert table_rows(broker, "default.crashy") == expected(0, 5000)


def table_workers(broker: Broker) -> list[int]:
    """The pids of the broker's table worker processes (its children running tables/worker.py)."""
    assert broker.process is not None
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"danube_fast.tables.worker" in argv and str(broker.process.pid).encode() in argv:
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b")")[-1].split()[0] != b"Z"
    except OSError:
        return False


def test_a_killed_table_worker_is_started_again_and_dies_with_its_broker(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(CONFIG + "[policy]\ntable_mode = \"envelope\"\n")
    topic = "/default/worked"
    produce(broker, topic, 0, 1000)
    until("the first commits", lambda: caught_up(broker, topic, 1000))
    (first,) = until("the table worker", lambda: table_workers(broker))
    os.kill(first, signal.SIGKILL)
    produce(broker, topic, 1000, 1000)
    until("the table after the worker's death", lambda: caught_up(broker, topic, 2000))
    assert table_rows(broker, "default.worked") == expected(0, 2000)
    (second,) = table_workers(broker)
    assert second != first and "table worker started" in broker.log_tail()
    broker.kill()
    until("the worker's end with its broker", lambda: not alive(second), timeout=10)


def test_bad_requests_get_a_clear_refusal(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(CONFIG)
    produce(broker, "/default/plain", 0, 10)
    assert "NOT_FOUND" in admin(broker, "tables", "status", "/default/missing", code=1)
    assert "has no table" in admin(broker, "tables", "status", "/default/plain", code=1)
    assert "NOT_FOUND" in admin(broker, "tables", "snapshots", "/default/missing", code=1)
    assert "has no table yet" in admin(broker, "tables", "snapshots", "/default/plain", code=1)
    kept = admin(broker, "policies", "set", "/default/plain", "--table-retention-minutes", "1440",
                 "--table-retention-mb", "512")
    assert kept["tableRetentionInMinutes"] == 1440 and kept["tableRetentionSizeInMB"] == 512
    assert kept.get("tableMode") is None
    bad = subprocess.run([*CLI, "admin", "policies", "set", "/default/plain", "--table", "parquet"],
                         capture_output=True, timeout=60, check=False)
    assert bad.returncode == 2 and b"invalid choice" in bad.stderr


@pytest.mark.parametrize("setting, message", [("lag_ms = 10", "lag_ms must be at least 100"),
                                              ("row_group_rows = 5", "row_group_rows must be at least"),
                                              ('compression = "brotli"', "compression must be one of")])
def test_a_bad_tables_setting_stops_the_start_with_its_name(broker_factory: BrokerFactory, setting: str,
                                                            message: str) -> None:
    broker = broker_factory.add(f"[tables]\n{setting}\n")
    done = subprocess.run(broker.command(), capture_output=True, timeout=60, check=False)
    assert done.returncode != 0 and message in done.stderr.decode()


def test_small_commits_are_compacted_and_old_files_swept_keeping_every_row(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(CONFIG + "maintenance_ms = 300\ncompact_min_files = 4\n"
                                  "snapshot_keep_ms = 0\n[policy]\ntable_mode = \"envelope\"\n")
    topic = "/default/compacted"
    for round_ in range(8):  # a commit each: eight small files in the current hour
        produce(broker, topic, round_ * 100, 100)
        until(f"commit {round_}", lambda r=round_: caught_up(broker, topic, (r + 1) * 100))
    status = until("the compaction", lambda: (lambda s: s if s and s["tables"][0]["compacted_files"] >= 4
                                              else None)(caught_up(broker, topic, 800)))
    assert status["tables"][0]["files"] < 8
    assert table_rows(broker, "default.compacted") == expected(0, 800)
    assert duckdb_count(status["metadata_location"])[:2] == (800, 800)


def test_a_topic_deleted_and_created_again_stops_its_old_table_instead_of_mixing_records(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(CONFIG + '[policy]\ntable_mode = "envelope"\n')
    topic = "/default/reborn"
    produce(broker, topic, 0, 500)
    until("the table", lambda: caught_up(broker, topic, 500))
    admin(broker, "topics", "delete", topic)
    produce(broker, topic, 0, 10)  # the new topic's offsets start at 0 again

    def stopped() -> str | None:
        got = subprocess.run([*CLI, "admin", "tables", "status", topic, "--admin-addr",
                              f"127.0.0.1:{broker.admin_port}", "--output", "json"], capture_output=True,
                             timeout=60, check=False)
        row = json.loads(got.stdout)["tables"][0] if got.returncode == 0 else {}
        return row.get("stopped") or None

    assert "deleted and created again" in until("the stop", stopped)
    assert table_rows(broker, "default.reborn") == expected(0, 500)  # the old records, untouched


def test_with_drop_with_topic_a_deleted_topics_table_goes_with_its_files_and_the_others_stay(
        broker_factory: BrokerFactory) -> None:
    dropping = CONFIG.replace("[tables]\n", "[tables]\ndrop_with_topic = true\nmaintenance_ms = 500\n")
    broker = broker_factory.start(dropping + '[policy]\ntable_mode = "envelope"\n')
    gone, kept = "/default/dropped", "/default/kept"
    produce(broker, gone, 0, 300)
    produce(broker, kept, 0, 200)
    until("both tables", lambda: caught_up(broker, gone, 300) and caught_up(broker, kept, 200))
    folder = broker.data_dir / "tables" / "warehouse" / "default"
    assert sorted(p.name for p in folder.iterdir()) == ["dropped", "kept"]
    admin(broker, "topics", "delete", gone)
    until("the deleted topic's table gone", lambda: not (folder / "dropped").exists())
    cat = open_catalog(catalog_of(broker), read_only=True)
    assert cat.list_tables("default") == [("default", "kept")]
    assert table_rows(broker, "default.kept") == expected(0, 200)
    produce(broker, gone, 0, 10)  # created again: a new table, from offset 0
    until("the new topic's table", lambda: caught_up(broker, gone, 10))
    assert table_rows(broker, "default.dropped") == expected(0, 10)


def test_a_partitioned_topic_gets_its_table_from_its_base_name(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(CONFIG)
    admin(broker, "topics", "create", "/default/parted", "--partitions", "2", "--reliable")
    shown = admin(broker, "policies", "set", "/default/parted", "--table", "envelope")
    assert shown["tableMode"] == "envelope"
    for part in (0, 1):  # every partition got the change
        assert admin(broker, "policies", "show", f"/default/parted-part-{part}")["tableMode"] == "envelope"
    produce(broker, "/default/parted-part-0", 0, 300)
    produce(broker, "/default/parted-part-1", 0, 200)

    def both() -> dict[str, Any] | None:
        got = subprocess.run([*CLI, "admin", "tables", "status", "/default/parted", "--admin-addr",
                              f"127.0.0.1:{broker.admin_port}", "--output", "json"], capture_output=True,
                             timeout=60, check=False)
        if got.returncode != 0:
            return None
        rows = {t["stored_topic"]: t["committed_offset"] for t in json.loads(got.stdout)["tables"]}
        return rows if rows == {"/default/parted-part-0": 300, "/default/parted-part-1": 200} else None

    until("both partitions in the table", both)
    cat = open_catalog(catalog_of(broker), read_only=True)
    got = cat.load_table(("default", "parted")).scan(selected_fields=("partition", "offset")).to_arrow()
    pairs = sorted(zip(got.column("partition").to_pylist(), got.column("offset").to_pylist(), strict=True))
    assert pairs == [(0, i) for i in range(300)] + [(1, i) for i in range(200)]
    cleared = admin(broker, "policies", "clear", "/default/parted")
    assert cleared["source"] == "its namespace's" and "tableMode" not in cleared


def test_a_topics_table_partitioning_is_its_policys_and_a_change_evolves_the_table(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(CONFIG)
    topic = "/default/daily"
    admin(broker, "topics", "create", topic, "--reliable")
    shown = admin(broker, "policies", "set", topic, "--table", "envelope", "--table-partitioning", "day")
    assert shown["tablePartitioning"] == "day"
    produce(broker, topic, 0, 300)
    status = until("the first records", lambda: caught_up(broker, topic, 300))
    assert status["tables"][0]["partitioning"] == "day"
    cat = open_catalog(catalog_of(broker), read_only=True)
    assert [f.name for f in cat.load_table(("default", "daily")).spec().fields] == ["timestamp_day"]
    shown = admin(broker, "policies", "set", topic, "--table-partitioning", "hour")
    assert "tablePartitioning" not in shown  # hour is the default: not written
    until("the evolved table", lambda: caught_up(broker, topic, 300)["tables"][0]["partitioning"] == "hour")
    assert [f.name for f in cat.load_table(("default", "daily")).spec().fields] == ["timestamp_hour"]
    produce(broker, topic, 300, 200)
    until("the records after the change", lambda: caught_up(broker, topic, 500))
    table = cat.load_table(("default", "daily"))
    assert {t.file.spec_id for t in table.scan().plan_files()} == {0, 1}  # the day files stay; new: by hour
    assert table_rows(broker, "default.daily") == expected(0, 500)
    assert duckdb_count(caught_up(broker, topic, 500)["metadata_location"]) == (500, 500, 0, 499)
    bad = subprocess.run([*CLI, "admin", "policies", "set", topic, "--table-partitioning", "week"],
                         capture_output=True, timeout=60, check=False)
    assert bad.returncode == 2 and b"invalid choice" in bad.stderr

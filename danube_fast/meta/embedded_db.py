"""The SQLite half of EmbeddedStore: etcd's data model (revisions, history, leases) in three tables.

State has one owner: an `EmbeddedDb` is created, used and closed by the store's single worker thread, so
writes are serialized and never run on the event loop. Every write is one SQLite transaction (WAL journal,
synchronous=FULL: a committed write survives a power cut), and one transaction that changes keys is one
revision, as in etcd; a write that changes nothing (deleting a missing key) does not take a revision.

A write that fails (a full disk, say) is rolled back whole: the store stays usable and holds what was
committed before. `store_error` tells the caller what a sqlite3 error means for the store.
"""

from __future__ import annotations

import operator
import os
import secrets
import sqlite3
from collections.abc import Sequence

from danube_fast.meta.store import (
    Compacted,
    Compare,
    Delete,
    Get,
    InvalidRevision,
    KeyValue,
    LeaseNotFound,
    MetadataCorrupt,
    MetadataError,
    MetadataReadOnly,
    MetadataStoreFull,
    MetadataUnavailable,
    Op,
    Put,
    TxnResult,
    WatchEvent,
    prefix_range_end,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL, create_revision INTEGER NOT NULL,
    mod_revision INTEGER NOT NULL, version INTEGER NOT NULL, lease INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS kv_by_lease ON kv (lease) WHERE lease != 0;
CREATE TABLE IF NOT EXISTS history (revision INTEGER NOT NULL, seq INTEGER NOT NULL, key BLOB NOT NULL,
    deleted INTEGER NOT NULL, value BLOB NOT NULL, prev_value BLOB,
    create_revision INTEGER NOT NULL DEFAULT 0, version INTEGER NOT NULL DEFAULT 0,
    lease INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (revision, seq));
CREATE TABLE IF NOT EXISTS lease (id INTEGER PRIMARY KEY, ttl INTEGER NOT NULL, deadline REAL NOT NULL);
"""
KV_COLUMNS = "key, value, create_revision, mod_revision, version, lease"
Txn = tuple[Sequence[Compare], Sequence[Op], Sequence[Op]]
_OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt}
_TARGETS = {"version": 2, "create_revision": 3, "mod_revision": 4}  # column of _compare's select


def store_error(e: sqlite3.Error, path: str, unclassified: str) -> MetadataError:
    """What `e`, raised by SQLite for the store at `path`, means to the store's callers, by its result code
    (https://www.sqlite.org/rescode.html; an extended code's low byte is its primary code); the caller chains
    `e` as the cause. A full, read-only, locked or failing disk is MetadataUnavailable (retriable: the same
    store works again once the operator fixed the disk), a damaged file is MetadataCorrupt, anything else a
    MetadataError whose message starts with `unclassified`. Call it on the store's worker thread: it may ask
    the file system whether it is mounted read-only, which SQLite reports as a failure to open or write."""
    code = getattr(e, "sqlite_errorcode", None)  # None for errors of the sqlite3 module itself
    name = getattr(e, "sqlite_errorname", None)
    primary = -1 if code is None else code & 0xFF
    if primary == sqlite3.SQLITE_FULL:
        return MetadataStoreFull(f"the embedded metadata store's disk is full ({path}, {name}): nothing of "
                                 "the write was kept; free space on that disk")
    if primary == sqlite3.SQLITE_READONLY or (
            primary in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_IOERR) and _on_read_only_file_system(path)):
        return MetadataReadOnly(f"the embedded metadata store at {path} is read-only ({name}): remount its "
                                "file system read-write (or make the file writable)")
    if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return MetadataUnavailable(f"the embedded metadata store at {path} is locked ({name}): another "
                                   "connection or process holds its lock")
    if primary == sqlite3.SQLITE_IOERR:
        return MetadataUnavailable(f"the embedded metadata store at {path} had an I/O error ({name})")
    if primary in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return MetadataCorrupt(f"the embedded metadata store file {path} is damaged or not a SQLite database "
                               f"({name}): restore it from a backup")
    return MetadataError(f"{unclassified}: {e}")


def _on_read_only_file_system(path: str) -> bool:
    try:
        return bool(os.statvfs(os.path.dirname(os.path.abspath(path))).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class EmbeddedDb:
    def __init__(self, path: str, history_retention: int) -> None:
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)
            self._add_missing_history_columns()
            self._retention = history_retention
            self.revision = self._meta("revision")
            self.compact_revision = self._meta("compact_revision")
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    def _add_missing_history_columns(self) -> None:
        """Files written before watch events carried a key's create_revision, version and lease."""
        have = {row[1] for row in self._db.execute("PRAGMA table_info(history)")}
        for column in ("create_revision", "version", "lease"):
            if column not in have:
                self._db.execute(f"ALTER TABLE history ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")

    def _meta(self, name: str) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def _set_meta(self, name: str, value: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (name, value))

    # reads -------------------------------------------------------------------------------------------------

    def range(self, key: bytes, prefix: bool) -> list[KeyValue]:
        if prefix:
            rows = self._db.execute(f"SELECT {KV_COLUMNS} FROM kv WHERE key >= ? AND key < ? ORDER BY key",
                                    (key, prefix_range_end(key))).fetchall()
        else:
            rows = self._db.execute(f"SELECT {KV_COLUMNS} FROM kv WHERE key = ?", (key,)).fetchall()
        return [KeyValue(bytes(r[0]).decode(), bytes(r[1]), *r[2:]) for r in rows]

    def history(self, prefix: bytes, start: int) -> tuple[list[WatchEvent], int]:
        """Changes under prefix at revision >= start, and the revision they run up to."""
        if start < self.compact_revision:
            raise Compacted(f"revision {start} is compacted; history starts at {self.compact_revision}",
                            self.compact_revision)
        rows = self._db.execute(
            "SELECT revision, key, deleted, value, prev_value, create_revision, version, lease FROM history "
            "WHERE revision >= ? AND key >= ? AND key < ? ORDER BY revision, seq",
            (start, prefix, prefix_range_end(prefix))).fetchall()
        events = [WatchEvent("delete" if r[2] else "put", bytes(r[1]).decode(), bytes(r[3]), r[0],
                             None if r[4] is None else bytes(r[4]), r[5], r[6], r[7]) for r in rows]
        return events, self.revision

    # writes ------------------------------------------------------------------------------------------------

    def txn(self, compare: Sequence[Compare], success: Sequence[Op],
            failure: Sequence[Op]) -> tuple[TxnResult, list[WatchEvent]]:
        results, changes = self.txn_group([(compare, success, failure)])
        if isinstance(results[0], Exception):
            raise results[0]
        return results[0], changes

    def txn_group(self, txns: Sequence[Txn]) -> tuple[list[TxnResult | MetadataError], list[WatchEvent]]:
        """Group commit: several transactions in one SQLite transaction, so one COMMIT (one fsync) covers
        them all. Each runs in order under its own SAVEPOINT and gets its own revision, exactly as if
        committed one by one; one that fails (LeaseNotFound) is rolled back alone and its error returned
        in its place. If the COMMIT fails, nothing of the group happened and the error is raised."""
        self._db.execute("BEGIN IMMEDIATE")
        results: list[TxnResult | MetadataError] = []
        changes: list[WatchEvent] = []
        revision = self.revision
        try:
            for compare, success, failure in txns:
                self._db.execute("SAVEPOINT txn")
                mine: list[WatchEvent] = []
                try:
                    succeeded = all(self._compare(c) for c in compare)
                    ops = success if succeeded else failure
                    responses = [self._apply(op, mine, revision + 1) for op in ops]
                except MetadataError as e:
                    self._db.execute("ROLLBACK TO txn")
                    self._db.execute("RELEASE txn")
                    results.append(e)
                    continue
                self._db.execute("RELEASE txn")
                if mine:
                    revision += 1
                    changes += mine
                results.append(TxnResult(succeeded, revision, responses))
            self._commit(changes, revision)
        except BaseException:
            self._rollback()
            raise
        return results, changes

    def _compare(self, c: Compare) -> bool:
        key = c.key.encode()
        columns = "SELECT value, 0, version, create_revision, mod_revision FROM kv "
        if c.prefix:
            cursor = self._db.execute(columns + "WHERE key >= ? AND key < ?", (key, prefix_range_end(key)))
        else:
            cursor = self._db.execute(columns + "WHERE key = ?", (key,))
        rows = cursor.fetchall()
        if not rows:
            # etcd: a value compare on a missing key is false, whatever the operator; other targets are 0
            return c.target != "value" and bool(_OPS[c.op](0, c.value))
        if c.target == "value":
            return all(_OPS[c.op](bytes(row[0]), c.value) for row in rows)
        return all(_OPS[c.op](row[_TARGETS[c.target]], c.value) for row in rows)

    def _apply(self, op: Op, changes: list[WatchEvent], revision: int) -> list[KeyValue] | int | None:
        """Apply one op as part of the change that will get `revision`."""
        key = op.key.encode()
        if isinstance(op, Get):
            return self.range(key, op.prefix)
        if isinstance(op, Put):
            if op.lease and not self._db.execute("SELECT 1 FROM lease WHERE id = ?", (op.lease,)).fetchone():
                raise LeaseNotFound(f"lease {op.lease:x} expired or was revoked")
            old = self._db.execute("SELECT value, create_revision, version FROM kv WHERE key = ?",
                                   (key,)).fetchone()
            create, version = (old[1], old[2] + 1) if old else (revision, 1)
            self._db.execute(f"INSERT OR REPLACE INTO kv ({KV_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                             (key, op.value, create, revision, version, op.lease))
            changes.append(WatchEvent("put", op.key, op.value, revision, bytes(old[0]) if old else None,
                                      create, version, op.lease))
            return None
        assert isinstance(op, Delete)
        gone = self.range(key, op.prefix)
        for kv in gone:
            self._db.execute("DELETE FROM kv WHERE key = ?", (kv.key.encode(),))
            changes.append(WatchEvent("delete", kv.key, b"", revision, kv.value))
        return len(gone)

    def _commit(self, changes: list[WatchEvent], revision: int) -> None:
        """Commit the open transaction, whose changes bring the store to `revision`; the revision moves only
        once SQLite has committed it."""
        compact_revision = self.compact_revision
        if changes:
            self._set_meta("revision", revision)
            self._db.executemany(
                "INSERT INTO history (revision, seq, key, deleted, value, prev_value, create_revision, "
                "version, lease) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(e.revision, i, e.key.encode(), e.type == "delete", e.value, e.prev_value, e.create_revision,
                  e.version, e.lease) for i, e in enumerate(changes)])
            # keep `retention` revisions, compacting once the history has grown a tenth past that
            if revision - compact_revision > self._retention + max(1, self._retention // 10):
                compact_revision = revision - self._retention + 1
                self._compact(compact_revision)
        self._db.execute("COMMIT")
        self.revision, self.compact_revision = revision, compact_revision

    def _rollback(self) -> None:
        # a COMMIT that failed with SQLITE_FULL rolled back already (tests/faults/test_meta_store_faults.py)
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def compact(self, revision: int) -> None:
        if revision > self.revision or revision < 1:
            raise InvalidRevision(f"cannot compact to revision {revision}: the store is at {self.revision}")
        if revision > self.compact_revision:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._compact(revision)
                self._db.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
            self.compact_revision = revision

    def _compact(self, revision: int) -> None:
        self._db.execute("DELETE FROM history WHERE revision < ?", (revision,))
        self._set_meta("compact_revision", revision)

    # leases: `deadline` is wall-clock time, so that a restart expires what ran out while the store was down

    def leases(self) -> list[tuple[int, int, float]]:
        return [(r[0], r[1], r[2]) for r in self._db.execute("SELECT id, ttl, deadline FROM lease")]

    def grant(self, ttl: int, deadline: float) -> int:
        while True:
            lease = secrets.randbits(62) + 1  # random like etcd's, so ids are not reused across restarts
            if not self._db.execute("SELECT 1 FROM lease WHERE id = ?", (lease,)).fetchone():
                break
        self._db.execute("INSERT INTO lease (id, ttl, deadline) VALUES (?, ?, ?)", (lease, ttl, deadline))
        return lease

    def refresh(self, lease: int, deadline: float) -> int:
        row = self._db.execute("UPDATE lease SET deadline = ? WHERE id = ? RETURNING ttl",
                               (deadline, lease)).fetchone()
        if row is None:
            raise LeaseNotFound(f"lease {lease:x} expired or was revoked")
        return int(row[0])

    def revoke(self, lease: int) -> list[WatchEvent]:
        """Delete the lease and its keys, in key order, as one revision (etcd's order)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if self._db.execute("DELETE FROM lease WHERE id = ?", (lease,)).rowcount == 0:
                raise LeaseNotFound(f"lease {lease:x} expired or was revoked")
            changes: list[WatchEvent] = []
            keys = self._db.execute("SELECT key FROM kv WHERE lease = ? ORDER BY key", (lease,)).fetchall()
            for (key,) in keys:
                self._apply(Delete(bytes(key).decode()), changes, self.revision + 1)
            self._commit(changes, self.revision + 1 if changes else self.revision)
        except BaseException:
            self._rollback()
            raise
        return changes

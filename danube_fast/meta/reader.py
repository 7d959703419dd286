"""Read-only access to a metadata store, for readers outside the broker (the Spark data source, tools).

An EmbeddedStore has one owner, the broker, and must not be opened a second time: it creates tables, expires
leases and writes. `EmbeddedReader` instead opens the same SQLite file read-only (`mode=ro`: SQLite refuses
any write through it) and reads the committed state, safely next to a running broker (the store's WAL journal
lets readers see the last committed transaction while the broker writes). An etcd store is shared by design,
so `open_reader` opens a normal EtcdStore for it; nothing here ever calls a write method.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from typing import Protocol
from urllib.parse import quote

from danube_fast.meta.connect import StoreNotFound, check_access, parse_store_url
from danube_fast.meta.embedded_db import KV_COLUMNS, store_error
from danube_fast.meta.etcd_access import NO_ACCESS, EtcdAccess
from danube_fast.meta.store import KeyValue, prefix_range_end


class MetadataReader(Protocol):
    """The reads of MetadataStore, and nothing else."""

    async def get(self, key: str) -> KeyValue | None: ...

    async def get_prefix(self, prefix: str) -> list[KeyValue]: ...

    async def close(self) -> None: ...


class EmbeddedReader:
    """The embedded store's file, read-only. Each call is one SQLite read transaction on a worker thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, check_same_thread=False)
            self._db.execute("SELECT 1 FROM kv LIMIT 1").fetchall()  # a file that is not a store fails here
        except sqlite3.Error as e:
            raise store_error(e, path, f"cannot read the embedded metadata store at {path}") from e
        self._lock = asyncio.Lock()

    async def get(self, key: str) -> KeyValue | None:
        rows = await self._query(f"SELECT {KV_COLUMNS} FROM kv WHERE key = ?", (key.encode(),))
        return rows[0] if rows else None

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        start = prefix.encode()
        return await self._query(f"SELECT {KV_COLUMNS} FROM kv WHERE key >= ? AND key < ? ORDER BY key",
                                 (start, prefix_range_end(start)))

    async def _query(self, sql: str, args: tuple[bytes, ...]) -> list[KeyValue]:
        def run() -> list[KeyValue]:
            try:
                rows = self._db.execute(sql, args).fetchall()
            except sqlite3.Error as e:
                raise store_error(e, self.path, f"reading the embedded metadata store at {self.path}") from e
            return [KeyValue(bytes(k).decode(), bytes(v), c, m, ver, lease)
                    for k, v, c, m, ver, lease in rows]

        async with self._lock:  # one connection: one query at a time
            return await asyncio.to_thread(run)

    async def close(self) -> None:
        self._db.close()


async def open_reader(url: str, *, access: EtcdAccess = NO_ACCESS, timeout: float = 5.0) -> MetadataReader:
    """A reader of the store `url` names (connect.URL_FORMS), an etcd one reached with `access` (TLS, a
    user). StoreNotFound when an embedded store's file does not exist (reading never creates one);
    StoreUrlError for a malformed URL; MetadataUnavailable when etcd does not answer within `timeout`;
    MetadataRefused when it refuses the TLS handshake or the user."""
    parsed = parse_store_url(url)
    check_access(parsed, access)
    if parsed.kind == "embedded":
        if not os.path.isfile(parsed.path):
            raise StoreNotFound(f"there is no embedded metadata store at {parsed.path}")
        return await asyncio.to_thread(EmbeddedReader, parsed.path)
    from danube_fast.meta.etcd import EtcdStore

    return await EtcdStore.connect(parsed.endpoints, access=access, timeout=timeout)

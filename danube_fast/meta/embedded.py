"""EmbeddedStore: the MetadataStore of standalone mode, on SQLite (stdlib), durable across restarts.

Owners: the SQLite connection (an `EmbeddedDb`) belongs to one worker thread, which runs every read and write
in submission order, so the event loop never waits on the disk. Watch subscribers, lease deadlines and the
expiry task belong to the event loop. A committed write hands its events to the loop from the worker thread
(call_soon_threadsafe, FIFO) before its caller resumes, so subscribers see changes in revision order and a
writer that awaited a put finds it already published.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from danube_fast.meta.embedded_db import EmbeddedDb, Txn, store_error
from danube_fast.meta.store import (
    Compare,
    Delete,
    InvalidRevision,
    KeyValue,
    LeaseNotFound,
    MetadataError,
    MetadataUnavailable,
    Op,
    Put,
    TxnResult,
    WatchEvent,
    check_key,
    check_txn,
)

T = TypeVar("T")
log = logging.getLogger(__name__)
EXPIRY_RETRY_SECONDS = 1.0  # after the expiry task failed to revoke a lease (disk error)
GROUP_MAX = 1024  # transactions per group commit: bounds one SQLite transaction's size and latency


def _classified(path: str, unclassified: str, fn: Callable[..., T], *args: object) -> T:  # on the worker
    try:
        return fn(*args)
    except sqlite3.Error as e:
        raise store_error(e, path, unclassified) from e


@dataclass(eq=False)
class _Subscriber:
    prefix: str
    events: collections.deque[WatchEvent] = field(default_factory=collections.deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Lease:
    ttl: int
    deadline: float  # time.monotonic()


class EmbeddedStore:
    """Open with `await EmbeddedStore.open(path)`; close with `await store.close()`."""

    def __init__(self, db: EmbeddedDb, executor: ThreadPoolExecutor, wall_clock: Callable[[], float]) -> None:
        self._db = db
        self._executor = executor
        self._wall_clock = wall_clock
        self._loop = asyncio.get_running_loop()
        self._revision = db.revision  # the last revision published to subscribers
        self._subscribers: set[_Subscriber] = set()
        self._leases: dict[int, _Lease] = {}
        self._lease_changed = asyncio.Event()
        self._expiry: asyncio.Task[None] | None = None
        self._closed = False
        # Group commit: transactions queue here; one drainer hands all that queued to the worker at once.
        self._queued: list[tuple[Txn, asyncio.Future[TxnResult]]] = []
        self._drainer: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, path: str | os.PathLike[str], *, history_retention: int = 10_000,
                   wall_clock: Callable[[], float] = time.time) -> EmbeddedStore:
        """`history_retention`: how many revisions of history watches can resume from. `wall_clock` dates
        lease deadlines on disk, so that leases that ran out while the store was closed expire on open."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="danube-meta")
        file = os.fspath(path)
        try:
            db = await asyncio.get_running_loop().run_in_executor(
                executor, _classified, file, f"cannot open the embedded metadata store at {file}", EmbeddedDb,
                file, history_retention)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        store = cls(db, executor, wall_clock)
        try:
            now, wall = time.monotonic(), wall_clock()
            for lease, ttl, deadline in await store._call(db.leases):
                store._leases[lease] = _Lease(ttl, now + deadline - wall)
            for lease in list(store._leases):
                await store._expire(lease)  # those that ran out while the store was closed
        except BaseException:
            await store.close()
            raise
        store._expiry = asyncio.create_task(store._expire_forever())
        return store

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._drainer is not None:  # let queued transactions finish: their callers were promised an answer
            await asyncio.gather(self._drainer, return_exceptions=True)
        if self._expiry is not None:
            self._expiry.cancel()
            await asyncio.gather(self._expiry, return_exceptions=True)
        for sub in self._subscribers:
            sub.wakeup.set()
        await self._loop.run_in_executor(self._executor, self._db.close)
        self._executor.shutdown(wait=True)  # the worker is idle now: this joins it at once

    # running on the worker thread -------------------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        if self._closed:
            raise MetadataUnavailable("the embedded metadata store is closed")
        return await self._loop.run_in_executor(self._executor, self._guarded, fn, *args)

    async def _write(self, fn: Callable[..., tuple[T, list[WatchEvent]]], *args: object) -> T:
        if self._closed:
            raise MetadataUnavailable("the embedded metadata store is closed")
        return await self._loop.run_in_executor(self._executor, self._publishing, fn, *args)

    def _guarded(self, fn: Callable[..., T], *args: object) -> T:  # on the worker thread
        return _classified(self._db.path, "the embedded metadata store failed", fn, *args)

    def _publishing(self, fn: Callable[..., tuple[T, list[WatchEvent]]], *args: object) -> T:  # on the worker
        value, events = self._guarded(fn, *args)
        if events:
            self._loop.call_soon_threadsafe(self._publish, events)
        return value

    def _publish(self, events: list[WatchEvent]) -> None:
        self._revision = events[-1].revision
        for sub in self._subscribers:
            matching = [e for e in events if e.key.startswith(sub.prefix)]
            if matching:
                sub.events.extend(matching)
                sub.wakeup.set()

    # keys -------------------------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        found = await self._call(self._db.range, check_key(key), False)
        return found[0] if found else None

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        return await self._call(self._db.range, check_key(prefix), True)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        return (await self.transaction((), [Put(key, value, lease)])).revision

    async def delete(self, key: str) -> bool:
        return (await self.transaction((), [Delete(key)])).responses[0] == 1

    async def delete_prefix(self, prefix: str) -> int:
        deleted = (await self.transaction((), [Delete(prefix, prefix=True)])).responses[0]
        assert isinstance(deleted, int)
        return deleted

    async def transaction(self, compare: Sequence[Compare], success: Sequence[Op],
                          failure: Sequence[Op] = ()) -> TxnResult:
        check_txn(compare, success, failure)
        if self._closed:
            raise MetadataUnavailable("the embedded metadata store is closed")
        done: asyncio.Future[TxnResult] = self._loop.create_future()
        self._queued.append(((tuple(compare), tuple(success), tuple(failure)), done))
        if self._drainer is None:
            self._drainer = asyncio.create_task(self._drain())
        return await done

    async def _drain(self) -> None:
        """Commit what queued while the previous group was committing, as one group: concurrent writers
        share one fsync (measured: bench/RESULTS.md, embedded_put_c64)."""
        try:
            while self._queued:
                group, self._queued = self._queued[:GROUP_MAX], self._queued[GROUP_MAX:]
                try:
                    results, events = await self._loop.run_in_executor(
                        self._executor, self._guarded, self._db.txn_group, [txn for txn, _ in group])
                except MetadataError as e:
                    for _, done in group:
                        if not done.done():
                            done.set_exception(e)
                    continue
                if events:
                    self._publish(events)
                for (_, done), result in zip(group, results, strict=True):
                    if done.done():
                        continue
                    if isinstance(result, Exception):
                        done.set_exception(result)
                    else:
                        done.set_result(result)
        finally:
            self._drainer = None

    async def current_revision(self) -> int:
        return self._revision

    async def compact(self, revision: int) -> None:
        await self._call(self._db.compact, revision)

    # watches ----------------------------------------------------------------------------------------------

    def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        """The start is fixed by this call, not by the first iteration: with start_revision 0, every change
        published after the call is delivered, even one made before iteration begins."""
        key = check_key(prefix)
        if start_revision < 0:
            raise InvalidRevision(f"a watch cannot start at revision {start_revision}")
        return self._watch(prefix, key, start_revision or self._revision + 1)

    async def _watch(self, prefix: str, key: bytes, start: int) -> AsyncIterator[WatchEvent]:
        sub = _Subscriber(prefix)
        self._subscribers.add(sub)  # before reading history: what commits after the read is queued here
        try:
            history, upto = await self._call(self._db.history, key, start)
            for event in history:
                yield event
            after = max(upto, start - 1)  # queued events up to here came with the history: skip them
            while True:
                while not sub.events:
                    if self._closed:
                        raise MetadataUnavailable("the embedded metadata store was closed under a watch")
                    sub.wakeup.clear()
                    await sub.wakeup.wait()
                event = sub.events.popleft()
                if event.revision > after:
                    yield event
        finally:
            self._subscribers.discard(sub)

    # leases -----------------------------------------------------------------------------------------------

    async def grant_lease(self, ttl_seconds: int) -> int:
        ttl = max(1, int(ttl_seconds))
        lease = await self._call(self._db.grant, ttl, self._wall_clock() + ttl)
        self._leases[lease] = _Lease(ttl, time.monotonic() + ttl)
        self._lease_changed.set()
        return lease

    async def keep_alive(self, lease: int) -> int:
        entry = self._leases.get(lease)
        if entry is None or entry.deadline <= time.monotonic():
            self._lease_changed.set()  # an overdue lease: let the expiry task revoke it now
            raise LeaseNotFound(f"lease {lease:x} expired or was revoked")
        entry.deadline = time.monotonic() + entry.ttl  # first, so that the expiry task cannot race this
        try:
            await self._call(self._db.refresh, lease, self._wall_clock() + entry.ttl)
        except LeaseNotFound:
            self._leases.pop(lease, None)
            raise
        return entry.ttl

    async def revoke_lease(self, lease: int) -> None:
        self._leases.pop(lease, None)
        await self._write(self._revoke, lease)

    def _revoke(self, lease: int) -> tuple[None, list[WatchEvent]]:
        return None, self._db.revoke(lease)

    async def _expire(self, lease: int) -> None:
        entry = self._leases.get(lease)
        if entry is None or entry.deadline > time.monotonic():
            return
        del self._leases[lease]
        try:
            await self._write(self._revoke, lease)
        except LeaseNotFound:
            pass
        except MetadataError:
            self._leases[lease] = entry  # still on disk: try again later
            raise

    async def _expire_forever(self) -> None:
        while True:
            try:
                for lease in [k for k, v in self._leases.items() if v.deadline <= time.monotonic()]:
                    await self._expire(lease)
            except MetadataError:
                log.exception("cannot expire a lease of the embedded metadata store; retrying")
                await asyncio.sleep(EXPIRY_RETRY_SECONDS)
                continue
            deadline = min((v.deadline for v in self._leases.values()), default=None)
            self._lease_changed.clear()
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lease_changed.wait(), timeout)

"""LocalCache: a watch-fed, in-memory mirror of the metadata prefixes a broker needs
(docs/METADATA.md#the-local-cache).

Reads on the request path are synchronous dictionary and bisect lookups; they never reach the store, so
they keep answering, from the last known state, while etcd is down. `stale_since` tells how long that
state has not been confirmed. Writes do not go through the cache: callers write to the store (which fails
fast with MetadataUnavailable when etcd is unreachable), then `wait_for_revision` to read their own write.

Owner: the event loop the cache was started on. The mirror (keys, values, per-prefix revisions) is changed
only by the cache's own tasks: one follower task per prefix, which applies its watch's events and the
differences of a resync, and one probe task, which checks that the store is reachable. Every change is one
synchronous step, so a reader never sees half of one.

Without progress reports from the store's watches, a quiet prefix cannot tell "nothing changed" from "the
watch is behind"; where that matters (leaving the stale state, `wait_for_revision` on a quiet prefix), the
cache compares its content with a consistent read of the prefix (a transaction of Gets, which has a revision).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from danube_fast.meta.store import (
    MAX_TXN_OPS,
    Compacted,
    Get,
    KeyValue,
    MetadataError,
    MetadataStore,
    WatchEvent,
    check_key,
)

log = logging.getLogger(__name__)
RETRY_FIRST_DELAY, RETRY_MAX_DELAY = 0.05, 2.0  # seconds between attempts to watch again after a failure
CHECK_AFTER_SECONDS = 0.1  # wait_for_revision: how long a prefix may lag before its content is compared


class NotCached(MetadataError, LookupError):
    """A read or subscription outside the prefixes the cache mirrors: a programming error, not a missing
    key."""


@dataclass(eq=False)
class _Prefix:
    prefix: str
    revision: int = 0  # every change under the prefix up to this revision is applied
    snapshot: int = 0  # the revision of the last full read: watch events up to it are already in the mirror
    watching: bool = False  # the follower is iterating a watch (not backing off, not resyncing)
    current: bool = True  # shown current since the last failure (by an event, a resync or a content check)
    task: asyncio.Task[None] | None = None


class EventFeed:
    """The events applied under `prefix` after `LocalCache.subscribe`, in revision order (the synthetic
    differences of a resync included). The cache has applied an event before it is delivered. Unbounded: a
    consumer that stops reading must `close()` it. Iteration ends when it or the cache is closed."""

    def __init__(self, cache: LocalCache, prefix: str) -> None:
        self.prefix = prefix
        self._cache = cache
        self._events: collections.deque[WatchEvent] = collections.deque()
        self._wakeup = asyncio.Event()
        self._closed = False

    def __aiter__(self) -> EventFeed:
        return self

    async def __anext__(self) -> WatchEvent:
        while not self._events:
            if self._closed:
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._events.popleft()

    def close(self) -> None:
        self._closed = True
        self._cache._subscribers.discard(self)
        self._wakeup.set()

    def _push(self, event: WatchEvent) -> None:
        self._events.append(event)
        self._wakeup.set()


class LocalCache:
    """Start with `await LocalCache.start(store, prefixes)`, stop with `await cache.close()` (the store stays
    open). Overlapping prefixes are merged: "/a/" covers "/a/b/".

    The mirror's KeyValues are the store's: create_revision, mod_revision, version and lease come with each
    watch event.
    """

    def __init__(self, store: MetadataStore, prefixes: list[str], probe_interval: float) -> None:
        self._store = store
        self._prefixes = [_Prefix(p) for p in prefixes]
        self._probe_interval = probe_interval
        self._keys: list[str] = []  # sorted, for prefix reads in O(log n + k)
        self._kvs: dict[str, KeyValue] = {}
        self._subscribers: set[EventFeed] = set()
        self._progress: asyncio.Event | None = None  # set, then dropped, when a revision advances
        self._reachable = True  # the last probe reached the store
        self._stale_since: float | None = None
        self._probe: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, store: MetadataStore, prefixes: Iterable[str], *,
                    probe_interval: float = 1.0) -> LocalCache:
        """Load every prefix (consistent reads, each at a known revision), then follow each with a watch from
        the next revision, so that no change between the load and the watch is lost. `probe_interval`: how
        often the store's reachability is checked (a watch may retry a lost connection silently)."""
        kept: list[str] = []
        for prefix in sorted(set(prefixes)):
            check_key(prefix)
            if not any(prefix.startswith(k) for k in kept):
                kept.append(prefix)
        if not kept:
            raise ValueError("a LocalCache needs at least one prefix")
        cache = cls(store, kept, probe_interval)
        for p, revision, kvs in await cache._read(cache._prefixes):
            cache._replace(p, kvs, revision)
        for p in cache._prefixes:
            p.task = asyncio.create_task(cache._follow(p), name=f"LocalCache follower {p.prefix}")
        cache._probe = asyncio.create_task(cache._probe_forever(), name="LocalCache probe")
        return cache

    async def close(self) -> None:
        """Stop the tasks and end the subscriptions. Reads keep answering from the last known state."""
        tasks = [t for t in [self._probe, *(p.task for p in self._prefixes)] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sub in list(self._subscribers):
            sub.close()

    # reads: synchronous, from memory --------------------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        self._covering(key)
        return self._kvs.get(key)

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        """Sorted by key (the store's order: UTF-8 byte order is code point order)."""
        self._covering(prefix)
        lo, hi = self._range(prefix)
        return [self._kvs[k] for k in self._keys[lo:hi]]

    @property
    def revision(self) -> int:
        """The last revision applied, by any prefix's watch or full read."""
        return max(p.revision for p in self._prefixes)

    @property
    def stale_since(self) -> float | None:
        """time.monotonic() when the cache lost the store (a watch failed, the store did not answer, a resync
        was needed); None while it is known to follow the store."""
        return self._stale_since

    @property
    def is_synced(self) -> bool:
        return self._stale_since is None

    def subscribe(self, prefix: str) -> EventFeed:
        """Events under `prefix`, which must lie inside one cached prefix (order holds within a watch). To see
        the whole picture, subscribe and then read get_prefix in the same step: no event falls between."""
        self._covering(prefix)
        sub = EventFeed(self, prefix)
        self._subscribers.add(sub)
        return sub

    async def wait_for_revision(self, revision: int, timeout: float, *, key: str | None = None) -> None:
        """Return once the mirror holds every change up to `revision` under the cached prefix of `key` (under
        every cached prefix without one): read-your-writes after a write to the store. A prefix that lags
        longer than CHECK_AFTER_SECONDS (a quiet one, whose watch delivers nothing at this revision) is
        compared with a read of the store. Raises TimeoutError after `timeout` seconds."""
        prefixes = self._prefixes if key is None else [self._covering(key)]
        loop = asyncio.get_running_loop()
        deadline, check_after = loop.time() + timeout, CHECK_AFTER_SECONDS
        while behind := [p for p in prefixes if p.revision < revision]:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"the metadata cache did not reach revision {revision} within {timeout} s "
                                   f"under {', '.join(p.prefix for p in behind)}")
            if self._progress is None:
                self._progress = asyncio.Event()
            try:
                await asyncio.wait_for(self._progress.wait(), min(remaining, check_after))
            except TimeoutError:
                check_after *= 2
                with contextlib.suppress(MetadataError):  # unreachable: keep waiting for the watch
                    await self._check_current(behind)

    # applying changes -------------------------------------------------------------------------------------

    def _covering(self, key: str) -> _Prefix:
        for p in self._prefixes:  # a handful of prefixes: a scan beats a search
            if key.startswith(p.prefix):
                return p
        raise NotCached(f"{key!r} is outside the prefixes this metadata cache mirrors "
                        f"({', '.join(p.prefix for p in self._prefixes)})")

    def _range(self, prefix: str) -> tuple[int, int]:
        lo = bisect.bisect_left(self._keys, prefix)
        stem = prefix.rstrip("\U0010ffff")
        if not stem:
            return lo, len(self._keys)
        return lo, bisect.bisect_left(self._keys, stem[:-1] + chr(ord(stem[-1]) + 1), lo)

    def _apply(self, p: _Prefix, event: WatchEvent) -> None:
        if event.revision <= p.snapshot:
            return  # a full read already holds it
        key, before = event.key, self._kvs.get(event.key)
        if event.type == "put":
            if before is None:
                bisect.insort(self._keys, key)
            self._kvs[key] = KeyValue(key, event.value, event.create_revision, event.revision, event.version,
                                      event.lease)
        elif before is not None:
            del self._kvs[key]
            del self._keys[bisect.bisect_left(self._keys, key)]
        p.revision = event.revision
        if not p.current and self._reachable:
            p.current = True  # the watch delivers again
            self._update_stale()
        self._publish([event])

    def _replace(self, p: _Prefix, kvs: Sequence[KeyValue], revision: int) -> None:
        """Make the prefix's mirror the store's content at `revision`, publishing the differences."""
        lo, hi = self._range(p.prefix)
        old = {k: self._kvs[k] for k in self._keys[lo:hi]}
        events: list[WatchEvent] = []
        publish = bool(self._subscribers)  # not at the initial load
        for kv in kvs:
            before = old.pop(kv.key, None)
            if before is None or before.mod_revision != kv.mod_revision:
                self._kvs[kv.key] = kv
                if publish:
                    events.append(WatchEvent("put", kv.key, kv.value, kv.mod_revision,
                                             None if before is None else before.value, kv.create_revision,
                                             kv.version, kv.lease))
        for key, before in old.items():
            del self._kvs[key]
            if publish:
                events.append(WatchEvent("delete", key, b"", revision, before.value))
        self._keys[lo:hi] = [kv.key for kv in kvs]  # the store returns a prefix sorted by key
        p.revision = p.snapshot = revision
        events.sort(key=lambda e: e.revision)  # changed keys at their mod_revision, deletions at `revision`
        self._publish(events)

    def _publish(self, events: list[WatchEvent]) -> None:
        self._advanced()
        for sub in self._subscribers:
            for event in events:
                if event.key.startswith(sub.prefix):
                    sub._push(event)

    def _advanced(self) -> None:
        """Wake the wait_for_revision callers: a prefix's revision moved."""
        if self._progress is not None:
            self._progress.set()
            self._progress = None

    def _update_stale(self) -> None:
        live = self._reachable and all(p.current for p in self._prefixes)
        if live and self._stale_since is not None:
            log.info("metadata cache follows the store again after %.1f s",
                     time.monotonic() - self._stale_since)
            self._stale_since = None
        elif not live and self._stale_since is None:
            log.warning("metadata cache lost the store: serving the last known state")
            self._stale_since = time.monotonic()

    def _lost(self, p: _Prefix) -> None:
        p.current = False
        self._update_stale()

    # reading the store ----------------------------------------------------------------------------------

    async def _read(self, prefixes: Sequence[_Prefix]) -> list[tuple[_Prefix, int, list[KeyValue]]]:
        """Each prefix's content and the revision it is at: one transaction of Gets per MAX_TXN_OPS."""
        found: list[tuple[_Prefix, int, list[KeyValue]]] = []
        for i in range(0, len(prefixes), MAX_TXN_OPS):
            chunk = prefixes[i:i + MAX_TXN_OPS]
            result = await self._store.transaction((), [Get(p.prefix, prefix=True) for p in chunk])
            for p, kvs in zip(chunk, result.responses, strict=True):
                assert isinstance(kvs, list)
                found.append((p, result.revision, kvs))
        return found

    async def _check_current(self, prefixes: Sequence[_Prefix]) -> None:
        """Mark current each prefix whose mirror is at least as new as a read of the store made now."""
        for p, revision, kvs in await self._read(prefixes):
            if p.revision < revision:
                lo, hi = self._range(p.prefix)
                mine = [(k, self._kvs[k].mod_revision) for k in self._keys[lo:hi]]
                if mine != [(kv.key, kv.mod_revision) for kv in kvs]:
                    continue  # the watch is still catching up
                p.revision = p.snapshot = revision  # the content is the store's at `revision`
                self._advanced()
            if p.watching:
                p.current = True
        self._update_stale()

    async def _follow(self, p: _Prefix) -> None:
        """The follower task of one prefix: watch from the next revision, resync when the history is gone,
        retry with backoff after any other failure."""
        delay, resync = RETRY_FIRST_DELAY, False
        while True:
            try:
                if resync:
                    [(_, revision, kvs)] = await self._read([p])
                    if revision > p.revision:  # else a content check has brought the prefix this far
                        self._replace(p, kvs, revision)
                    resync = False
                    p.current = True
                    self._update_stale()
                watch = self._store.watch_prefix(p.prefix, start_revision=p.revision + 1)
                p.watching = True
                try:
                    async for event in watch:
                        self._apply(p, event)
                        delay = RETRY_FIRST_DELAY
                finally:
                    p.watching = False
                    aclose = getattr(watch, "aclose", None)  # both stores return async generators
                    if aclose is not None:
                        await aclose()
                raise MetadataError(f"the store ended the watch of {p.prefix!r}")  # the protocol's never end
            except Compacted as e:
                log.warning("metadata cache: the history after revision %d of %r is compacted (to %d): "
                            "resyncing", p.revision, p.prefix, e.compact_revision)
                resync = True
                self._lost(p)
            except Exception as e:  # any failure: the follower outlives it
                log.warning("metadata cache: the watch of %r failed, retrying in %.2f s: %s", p.prefix,
                            delay, e)
                self._lost(p)
                await asyncio.sleep(delay)
                delay = min(2 * delay, RETRY_MAX_DELAY)

    async def _probe_forever(self) -> None:
        """A watch may retry a lost connection inside the store without raising: ask the store directly."""
        while True:
            try:
                await self._store.current_revision()
                self._reachable = True
                unconfirmed = [p for p in self._prefixes if not p.current and p.watching]
                if unconfirmed:
                    await self._check_current(unconfirmed)
                self._update_stale()
            except Exception as e:  # any failure counts as unreachable
                if self._reachable:
                    log.warning("metadata cache: the store is unreachable: %s", e)
                self._reachable = False
                for p in self._prefixes:
                    p.current = False  # the watch may have missed changes: confirm each once back
                self._update_stale()
            await asyncio.sleep(self._probe_interval)

    async def _pause_watches(self) -> None:
        """Test hook: stop following the store (the mirror and its revisions stay), so that a test can change
        and compact the store behind the cache's back. `_resume_watches` then follows again from the last
        applied revision, as after a reconnect."""
        tasks = [p.task for p in self._prefixes if p.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in self._prefixes:
            p.task = None
            self._lost(p)

    def _resume_watches(self) -> None:
        for p in self._prefixes:
            if p.task is None:
                p.task = asyncio.create_task(self._follow(p), name=f"LocalCache follower {p.prefix}")

"""The copies this broker keeps of other brokers' replicated topics (docs/REPLICATION.md).

For every `/cluster/replicas/{ns}/{topic}` key that names this broker among the followers, one task
fetches from the topic's owner (fetch_client.py: its native transport, or the Replication service on its
admin port) and appends what it gets to
a WAL of its own, with this broker's sync policy, at the owner's offsets; its next fetch, from the end of
what it holds, tells the owner that all of it is durable here. The copy lives in
`{data_dir}/replicas/{ns}/{topic}/`: `log/` (the WAL) and `copy.json` (`{owner, epoch}`: whose term of
the topic it copies). A copy of another term is dropped and fetched again from the start the owner names
(the first offset its objects lack); segments the objects hold are deleted as the owner reports them
uploaded. A key that no longer names this broker drops the copy.

When the load manager gives this broker a topic it follows (its owner died, or handed the topic over), the
reconciler `take`s the copy: the task stops and the reconciler decides whether the copy becomes the topic's
WAL.

An owner that hands a topic over in a planned move keeps its own WAL here as a *handed* copy (`copy.json`
names this broker as owner and the brokers it was handed to): when the next owner (one of those) names this
broker among its followers, the copy goes on as a copy of the new term from its end, since the new owner's
log continues this one; otherwise, once the new term has two copies in sync (or is not replicated), it is
retired like any copy of a term that is over.

Owner: the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from danube_fast.broker.cluster.handoff import read_state, state_gaps
from danube_fast.broker.cluster.orphans import Orphans
from danube_fast.broker.cluster.replication.dead_owner import DeadOwners
from danube_fast.broker.cluster.replication.fetch_client import OwnerFetch, broker_credentials
from danube_fast.broker.cluster.view import ClusterView
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.services.forward import Forwarder
from danube_fast.errors import ApiError, DanubeError
from danube_fast.meta import keys
from danube_fast.meta.local_cache import EventFeed, LocalCache
from danube_fast.meta.resources import TermSuccessors, TopicReplicas
from danube_fast.meta.store import BadValue, InvalidKey, MetadataStore
from danube_fast.names import TopicName
from danube_fast.proto import Replication_pb2 as pb
from danube_fast.storage.io_pool import IoPool
from danube_fast.storage.tail_cache import CacheBudget
from danube_fast.storage.wal import Wal

log = logging.getLogger("danube_fast.replication")

WAIT_MS = 1000  # a fetch at the owner's end waits this long for a record
FETCH_BYTES = 8 * 1024 * 1024  # records per fetch, at most (at least one batch)
MAX_PENDING = 4  # appends of fetched records being made durable at once
RETRY = 0.2  # seconds before a fetch is tried again after a failure
ADOPT_POLL = 0.005  # seconds between looks at whether a handed copy's next owner has written where it starts
WRITE_RETRY = 1.0  # seconds before a copy that could not be written is opened again
GAP_WAIT = 30.0  # seconds a retired copy waits for the next owner to record its term's gap
TRIM_EVERY = 1.0  # seconds between deletions of segments the objects hold
CACHE_BYTES = 16 * 1024 * 1024  # what every copy's tail cache holds together: copies are written, not read
META = "copy.json"


@dataclass(frozen=True)
class TakenCopy:
    """A copy handed to the reconciler: its WAL directory, whose term it copied, and the offset after its
    last record."""

    log_dir: str
    owner: int
    epoch: int
    end: int


class Copies:
    def __init__(self, config: BrokerConfig, store: MetadataStore, cache: LocalCache, view: ClusterView,
                 forwarder: Forwarder, orphans: Orphans) -> None:
        """`orphans`: how a retired copy's records reach the object tier."""
        self._config = config
        self._store = store
        self._orphans = orphans
        broker_id = orphans.broker_id
        self._cache = cache
        self._view = view
        self._owners = OwnerFetch(forwarder, broker_credentials(config.security))
        self.me = broker_id
        self.root = os.path.join(config.data_dir, "replicas")
        self._pool = IoPool.shared(config.wal.io_threads)
        self._budget = CacheBudget(CACHE_BYTES)
        self._fetchers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._taken: set[tuple[str, str]] = set()  # handed to the reconciler: not fetched again here
        self._handed: dict[tuple[str, str], int] = {}  # this broker's own logs it handed over, by term
        self._ends: dict[tuple[str, str], int] = {}  # where a copy closed by its task ended
        self._drops: set[asyncio.Task[None]] = set()  # copies being deleted
        # One user of a copy's directory at a time: its fetch task for as long as it copies, a retirement,
        # a take. Two would open its WAL twice (storage/open_logs.py), or delete it under an open one.
        self._dir_locks: dict[tuple[str, str], asyncio.Lock] = {}
        # Retirements waiting for the next owner to record where it starts (_gap_known), by copy: a take of
        # that copy cancels its wait, since this broker is the next owner (a move's load waited 0.2-0.25 s
        # for it in bench replication).
        self._gap_waits: dict[tuple[str, str], asyncio.Task[Any]] = {}
        self._follower: asyncio.Task[None] | None = None
        self._dead = DeadOwners(store)  # owners whose process is gone, told before their lease runs out

    # -- life ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        feed = self._cache.subscribe(keys.replicas_prefix())
        self._reconcile()
        await self._drop_strays()
        self._follower = asyncio.create_task(self._follow(feed), name="replica-copies")

    async def close(self) -> None:
        tasks = [*self._fetchers.values(), *self._drops, *(t for t in [self._follower] if t is not None)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fetchers.clear()
        await self._owners.close()

    async def _follow(self, feed: EventFeed) -> None:
        async for _ in feed:
            self._reconcile()

    def _wanted(self) -> dict[tuple[str, str], TopicReplicas]:
        found = {}
        for kv in self._cache.get_prefix(keys.replicas_prefix()):
            with contextlib.suppress(BadValue, InvalidKey):
                r = TopicReplicas.from_json(kv.value, key=kv.key)
                if self.me in r.followers and r.owner != self.me:
                    found[keys.parse_replicas(kv.key)] = r
        return found

    def _reconcile(self) -> None:
        wanted = self._wanted()
        for topic, epoch in list(self._handed.items()):
            if topic in wanted:  # copied on as a follower of the next term (_copy adopts it, or starts anew)
                del self._handed[topic]
            elif self._term_over(topic, epoch):
                del self._handed[topic]
                self._later(self._retire(*topic))
        for topic in list(self._taken):
            if topic not in wanted:  # the copies' key moved on (this broker owns it now, or it went)
                self._taken.discard(topic)
        for topic in wanted:
            if topic not in self._fetchers and topic not in self._taken:
                self._fetchers[topic] = asyncio.create_task(self._fetch(*topic), name=f"copy {topic}")
        for topic, task in list(self._fetchers.items()):
            if topic not in wanted:
                del self._fetchers[topic]
                task.cancel()
                owned = self._view.owner(*topic) == self.me
                if not owned:  # this broker owns it now: the reconciler takes the copy, not deletes it
                    self._later(self._drop_after(task, *topic))

    def _term_over(self, topic: tuple[str, str], epoch: int) -> bool:
        """A handed copy of this broker's term `epoch` is no longer needed: the topic's copies' key is gone
        (not replicated any more), or names a later term with two copies in sync (which hold the tail)."""
        r = self._view.replicas(*topic)
        return r is None or ((r.owner, r.epoch) != (self.me, epoch) and len(r.isr) >= 2)

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    async def _drop_after(self, task: asyncio.Task[None], ns: str, t: str) -> None:
        await asyncio.gather(task, return_exceptions=True)
        if (ns, t) not in self._fetchers and (ns, t) not in self._taken:
            await self._retire(ns, t)

    async def _drop_strays(self) -> None:
        """Copies on disk that no key names any more (the topic went on while this broker was down)."""
        if not os.path.isdir(self.root):
            return
        wanted = self._wanted()
        for ns in sorted(os.listdir(self.root)):
            for t in sorted(os.listdir(os.path.join(self.root, ns))):
                meta = self._meta(ns, t)
                if meta is not None and meta[0] == self.me and not self._term_over((ns, t), meta[1]):
                    self._handed[ns, t] = meta[1]  # handed over before a restart; the next term decides
                elif (ns, t) not in wanted and self._view.owner(ns, t) != self.me:
                    self._later(self._retire(ns, t))

    async def _retire(self, ns: str, t: str) -> None:
        """The copy's term is over: its records fill what the dead owner left missing, if anything, then it
        goes. A failure (the object store away) keeps it, for the next start or term change to try again."""
        async with self._dir_lock(ns, t):
            await self._retire_held(ns, t)

    async def _retire_held(self, ns: str, t: str) -> None:
        """`_retire`, its directory's lock held."""
        meta = self._meta(ns, t)
        log_dir = os.path.join(self._dir(ns, t), "log")
        if meta is not None and os.path.isdir(log_dir):
            owner, epoch = meta
            if owner != self.me and not await self._gap_wait(ns, t, owner):
                log.warning("%s: the next owner after broker %d has not written where it started; the copy "
                            "is kept for the next start", keys.topic_name(ns, t), owner)
                return
            complete = owner == self.me  # this broker's own log, handed over: it holds all of its term
            kv = None if complete else await self._store.get(keys.term_successors(ns, t, owner))
            if kv is not None:
                record = TermSuccessors.from_json(kv.value, key=kv.key)
                complete = record.epoch == epoch and self.me in record.brokers
            try:
                await self._orphans.recover_copy(TopicName(ns, t), log_dir, owner, complete)
            except Exception as e:
                log.warning("%s: the copy of broker %d's term could not fill its gap (%s); kept",
                            keys.topic_name(ns, t), owner, e)
                return
        await self._remove_held(ns, t)

    async def _gap_wait(self, ns: str, t: str, owner: int) -> bool:
        """`_gap_known`, cancelled by a take of the copy meanwhile."""
        task = asyncio.current_task()
        assert task is not None
        self._gap_waits[ns, t] = task
        try:
            return await self._gap_known(ns, t, owner)
        finally:
            self._gap_waits.pop((ns, t), None)

    async def _gap_known(self, ns: str, t: str, owner: int) -> bool:
        """Whether the state key says what `owner`'s term left missing, for a copy of it to fill: False
        while it is still that owner's reservation though the topic is no longer that owner's (the next
        owner writes its own, with the gap, before it appends: moments later), after waiting GAP_WAIT
        for it. A copy never fills a reservation its owner still holds (orphans.py)."""
        deadline = time.monotonic() + GAP_WAIT
        while True:
            state = await read_state(self._store, ns, t)
            pending = state is not None and not state.sealed and state.broker_id == owner and \
                self._view.owner(ns, t) != owner
            if not pending:
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(RETRY)

    # -- one copy --------------------------------------------------------------------------------------

    def _dir(self, ns: str, t: str) -> str:
        return os.path.join(self.root, ns, t)

    def _dir_lock(self, ns: str, t: str) -> asyncio.Lock:
        return self._dir_locks.setdefault((ns, t), asyncio.Lock())

    def _read_meta(self, ns: str, t: str) -> Any:
        """copy.json as written (`_write_meta`), None when missing or unreadable."""
        try:
            with open(os.path.join(self._dir(ns, t), META), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _meta(self, ns: str, t: str) -> tuple[int, int] | None:
        meta = self._read_meta(ns, t)
        try:
            return int(meta["owner"]), int(meta["epoch"])
        except (KeyError, TypeError, ValueError):
            return None

    def _handed_to(self, ns: str, t: str) -> list[int]:
        """The brokers this broker handed its own log (kept as this copy) to; [] for a copy of another's."""
        meta = self._read_meta(ns, t)
        try:
            return [int(b) for b in meta.get("handed_to", [])]
        except (AttributeError, TypeError, ValueError):
            return []

    def _write_meta(self, ns: str, t: str, owner: int, epoch: int, handed_to: Sequence[int] = ()) -> None:
        path = os.path.join(self._dir(ns, t), META)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            meta: dict[str, object] = {"owner": owner, "epoch": epoch}
            if handed_to:
                meta["handed_to"] = list(handed_to)
            json.dump(meta, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)

    async def _remove_held(self, ns: str, t: str) -> None:
        """Delete the copy, its directory's lock held."""
        self._ends.pop((ns, t), None)
        directory = self._dir(ns, t)
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: shutil.rmtree(directory, ignore_errors=True))

    async def _open(self, ns: str, t: str, start: int) -> Wal:
        self._ends.pop((ns, t), None)  # written again when this one closes
        return await Wal.open(os.path.join(self._dir(ns, t), "log"), self._config.wal, initial_offset=start,
                              pool=self._pool, cache_budget=self._budget)

    async def _fetch(self, ns: str, t: str) -> None:
        """Copy the topic for as long as this broker follows it. A failure of this broker's own (its disk
        full, a write error) closes the copy and tries again after a pause: the owner takes the copy out of
        the in-sync set meanwhile, and it catches up once it can write again."""
        while True:
            try:
                async with self._dir_lock(ns, t):
                    await self._copy(ns, t)
                return
            except (DanubeError, OSError) as e:
                log.warning("%s: the copy cannot be written (%s); trying again in %.0f s",
                            keys.topic_name(ns, t), e, WRITE_RETRY)
                await asyncio.sleep(WRITE_RETRY)

    async def _copy(self, ns: str, t: str) -> None:
        """Fetch and append, pipelined: the next fetch goes out while earlier appends are being made
        durable (each fetch says how far it has appended, to read on from, and how far that is durable, for
        the owner's acknowledgements); at most MAX_PENDING appends wait, and a fetch that finds nothing new
        waits for them rather than for the owner (which waits for this copy to acknowledge)."""
        topic = keys.topic_name(ns, t)
        wal: Wal | None = None
        pending: deque[tuple[asyncio.Future[tuple[int, int]], int]] = deque()  # (append, its first offset)
        appended = 0  # the offset after the last record handed to the WAL
        trimmed = 0.0

        async def settle(keep: int) -> bool:
            """Check the finished appends, waiting for the oldest until at most `keep` wait; False when one
            landed at another offset than the owner's."""
            while pending and (len(pending) > keep or pending[0][0].done()):
                future, expected = pending.popleft()
                first, _ = await future
                if first != expected:
                    log.warning("%s: the copy took offset %d where the owner sent %d; starting it again",
                                topic, first, expected)
                    return False
            return True

        async def drop(retire: bool) -> None:
            nonlocal wal
            await asyncio.gather(*(f for f, _ in pending), return_exceptions=True)
            pending.clear()
            if wal is not None:
                await wal.close()
                wal = None
            await (self._retire_held(ns, t) if retire else self._remove_held(ns, t))

        try:
            while True:
                r = self._wanted().get((ns, t))
                if r is None:
                    return
                meta = self._meta(ns, t)
                if meta is not None and meta != (r.owner, r.epoch):
                    adopt = await self._adopts(ns, t, meta, r)
                    if adopt is None:  # the next owner is still loading: ask again (it writes in ms)
                        await asyncio.sleep(ADOPT_POLL)
                        continue
                    if adopt:
                        self._write_meta(ns, t, r.owner, r.epoch)
                        meta = (r.owner, r.epoch)
                        log.info("%s: this broker's log, handed to broker %d, goes on as its copy", topic,
                                 r.owner)
                if meta is not None and meta != (r.owner, r.epoch):
                    await drop(retire=True)
                    meta = None
                registration = self._view.registration(r.owner)
                if registration is None:
                    await asyncio.sleep(RETRY)
                    continue
                if wal is None and meta is not None:
                    wal = await self._open(ns, t, 0)  # this term's copy, from an earlier run
                    appended = wal.committed_offset
                if not await settle(keep=MAX_PENDING - 1):
                    await drop(retire=False)
                    continue
                request = pb.FetchRequest(topic=topic, follower_id=self.me, epoch=r.epoch,
                                          from_offset=-1 if wal is None else appended,
                                          durable_offset=-1 if wal is None else wal.committed_offset,
                                          max_bytes=FETCH_BYTES,
                                          wait_ms=0 if wal is None or pending else WAIT_MS)
                served_under = self._cache.get(keys.broker_register(r.owner))
                try:
                    got = await self._owners.fetch(registration, request)  # its records a view, not a copy
                except ApiError as e:
                    log.debug("%s: fetching from broker %d: %s", topic, r.owner, e)
                    if e.grpc_code == "UNAVAILABLE":
                        await self._dead.failed(r.owner, registration.admin_addr)
                    await asyncio.sleep(RETRY)
                    continue
                if served_under is not None:
                    self._dead.served(r.owner, served_under.mod_revision)
                if wal is None:
                    os.makedirs(self._dir(ns, t), exist_ok=True)
                    wal = await self._open(ns, t, got.start_offset)
                    appended = wal.committed_offset
                    self._write_meta(ns, t, r.owner, r.epoch)
                    log.info("%s: copying from broker %d from offset %d", topic, r.owner, got.start_offset)
                    continue
                if got.reset:
                    await drop(retire=False)
                    continue
                if got.data:
                    pending.append((wal.submit(got.data), appended))
                    appended = got.next_offset
                elif pending and not await settle(keep=0):  # nothing new: say what is durable now
                    await drop(retire=False)
                    continue
                if got.uploaded_through + 1 > wal.start_offset and time.monotonic() - trimmed > TRIM_EVERY:
                    trimmed = time.monotonic()
                    await wal.delete_before(got.uploaded_through + 1)
        finally:
            await asyncio.gather(*(f for f, _ in pending), return_exceptions=True)
            if wal is not None:
                await wal.close()
                self._ends[ns, t] = wal.committed_offset  # for `take`, which then need not open it again

    async def _adopts(self, ns: str, t: str, meta: tuple[int, int], r: TopicReplicas) -> bool | None:
        """This copy is this broker's own log, handed over to `r`'s owner, which continued it: it took its
        copy over (no gap of this broker's waits in the state key, which a load that did not would have
        recorded; this log fills it instead, when retired). None: not known yet (the next owner names its
        followers before it writes its reservation)."""
        if meta[0] != self.me or r.owner not in self._handed_to(ns, t):
            return False
        state = await read_state(self._store, ns, t)
        if state is not None and state.sealed and state.broker_id == self.me:
            return None  # still this broker's handover
        if state is None or state.broker_id != r.owner or state.sealed:
            return False
        return all(broker != self.me for _, _, broker in state_gaps(state))

    async def keep_handed(self, name: TopicName, log_dir: str, epoch: int, to: Sequence[int]) -> None:
        """This broker's closed WAL of `name`, whose term `epoch` it handed to `to`, kept as a copy."""
        ns, t = name.namespace, name.topic
        await self._stop_fetching((ns, t))  # (none: this broker owned it; a stale key's at most)
        async with self._dir_lock(ns, t):
            await self._remove_held(ns, t)
            os.makedirs(self._dir(ns, t))
            os.rename(log_dir, os.path.join(self._dir(ns, t), "log"))
            self._write_meta(ns, t, self.me, epoch, to)
        self._handed[ns, t] = epoch

    async def take(self, name: TopicName) -> TakenCopy | None:
        """Stop copying `name` (this broker is to own it) and hand over the copy, if it holds one."""
        topic = (name.namespace, name.topic)
        self._taken.add(topic)
        self._handed.pop(topic, None)
        await self._stop_fetching(topic)
        waiting = self._gap_waits.get(topic)
        if waiting is not None:  # a retirement waiting for the next owner's start: this broker is it
            waiting.cancel()
        async with self._dir_lock(*topic):  # a retirement under way ends first (and may delete it)
            meta = self._meta(*topic)
            log_dir = os.path.join(self._dir(*topic), "log")
            end = self._ends.pop(topic, None)
            if meta is None or not os.path.isdir(log_dir):
                return None
            if end is None:  # not copied since this broker started (or a handed copy): its WAL says
                wal = await self._open(*topic, 0)
                end = wal.committed_offset
                await wal.close()
        return TakenCopy(log_dir, meta[0], meta[1], end)

    async def _stop_fetching(self, topic: tuple[str, str]) -> None:
        task = self._fetchers.pop(topic, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def discard(self, name: TopicName) -> None:
        """A taken copy the reconciler made the topic's WAL (what is left of it)."""
        async with self._dir_lock(name.namespace, name.topic):
            await self._remove_held(name.namespace, name.topic)

    def retire_taken(self, name: TopicName) -> None:
        """A taken copy the reconciler did not take over (the objects hold all of it, or it is of another
        term): retired in the background, so that its records, or its word that its term acknowledged
        nothing more, close the gap that term left (the reconciler calls this once the topic's own
        reservation, which records that gap, is written)."""
        self._later(self._retire(name.namespace, name.topic))

"""Leader election on the metadata store, and the controller epoch that fences a deposed leader.

Protocol (docs/METADATA.md#election-and-the-controller-epoch): each broker holds a lease of its own (its
session) and campaigns by creating `keys.leader()` = its id (`ClusterLeader`) under that lease, in a
transaction that compares version == 0 (the key is absent). The broker that created the key leads; every
broker watches the key and campaigns again when it disappears (its holder's lease expired or was revoked,
or the holder resigned).

The key's create revision is the **controller epoch** (Kafka's `/controller_epoch` plays the same part): each
term creates the key anew, so epochs only grow, and every write made as leader (`write_as_leader`) is a
transaction that compares it, and the value naming this broker: a deposed leader's write fails with NotLeader
however late it reaches the store.

The local deadline: etcd expires a lease no sooner than TTL after the last keep-alive that reached it. The
broker measures from the moment it *sent* its last successful keep-alive, on its monotonic clock, so its
deadline does not fall after the store's (up to clock-rate drift, parts per million). From that deadline on
`is_leader` is False without asking the store: a broker resuming from a pause (GC, SIGSTOP, a VM migration)
does not act on a leadership it may have lost. That is an early refusal; the epoch compare is the guarantee,
since a lease alone is not mutual exclusion (docs/METADATA.md#fencing).

Owner: one background task per election runs the sessions (lease, keep-alives, watch, campaigns) and is the
only one that gains leadership; `resign`, `write_as_leader` and `close` may only give it up.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from danube_fast.meta import keys
from danube_fast.meta.fencing import guarded_write
from danube_fast.meta.resources_cluster import ClusterLeader
from danube_fast.meta.store import (
    BadValue,
    Compacted,
    Compare,
    Delete,
    Get,
    KeyValue,
    LeaseNotFound,
    MetadataError,
    MetadataStore,
    MetadataUnavailable,
    Op,
    Put,
    TxnResult,
)

log = logging.getLogger(__name__)
KEEP_ALIVES_PER_TTL = 3  # a keep-alive every ttl/3: two may fail before the lease is at risk
RETRY_FIRST_DELAY, RETRY_MAX_DELAY = 0.05, 1.0  # seconds, between attempts after a store error


class NotLeader(MetadataError):
    """This broker is not (or no longer) the leader of the epoch it wrote under: its write was not made."""

    retriable = False
    grpc_code = "FAILED_PRECONDITION"


@dataclass(frozen=True)
class LeadershipChange:
    """This broker became the leader of `epoch` (`is_leader` True) or lost the leadership of `epoch`."""

    is_leader: bool
    epoch: int


@dataclass(frozen=True)
class _Holder:
    """The leader key: the broker it names (None if the value is not a ClusterLeader), and its epoch."""

    broker_id: int | None
    epoch: int


def _not_leader(broker_id: int, epoch: int) -> Callable[[KeyValue | None], MetadataError]:
    def lost(kv: KeyValue | None) -> MetadataError:
        now = "is gone" if kv is None else f"is of epoch {kv.create_revision}, value {kv.value[:40]!r}"
        return NotLeader(f"broker {broker_id} is not the leader of epoch {epoch}: the leader key {now}")
    return lost


async def write_with_epoch(store: MetadataStore, broker_id: int, epoch: int, ops: Sequence[Op],
                           extra_compares: Sequence[Compare] = ()) -> TxnResult:
    """`ops` in one transaction, made only while the leader key is of `epoch` and names `broker_id`; else
    NotLeader. A failed extra compare returns a result with `succeeded` False. No local check: see
    LeaderElection.write_as_leader, which is what a broker calls."""
    key = keys.leader()
    fence = [Compare(key, "create_revision", "==", epoch),
             Compare(key, "value", "==", ClusterLeader(broker_id).to_json())]
    return await guarded_write(store, fence, ops, extra_compares, _not_leader(broker_id, epoch))


async def _close(watch: AsyncIterator[Any]) -> None:
    aclose = getattr(watch, "aclose", None)  # both stores return async generators
    if aclose is not None:
        await aclose()


class LeaderElection:
    """`await start()`, then `is_leader`, `epoch`, `leader_id()`, `changes()`; `await close()` at the end.

    `clock` is the monotonic clock the lease deadline is measured on (a test may pass its own). `on_lease`
    is awaited with each new lease before the campaign that uses it: the broker's session keys (its
    registration) live and die with the same lease as its leadership. If it raises MetadataError, the
    session is abandoned and retried like any other store failure.
    """

    def __init__(self, store: MetadataStore, broker_id: int, ttl_seconds: int, *,
                 clock: Callable[[], float] = time.monotonic,
                 on_lease: Callable[[int], Awaitable[None]] | None = None) -> None:
        if ttl_seconds < 1:
            raise ValueError(f"a lease lives at least 1 s, not {ttl_seconds}")
        self.broker_id = broker_id
        self.ttl = int(ttl_seconds)
        self._store = store
        self._clock = clock
        self._on_lease = on_lease
        self._key = keys.leader()
        self._value = ClusterLeader(broker_id).to_json()
        self._lease: int | None = None
        self._deadline = -math.inf  # the lease may have expired from this instant on (self._clock)
        self._epoch: int | None = None  # the term this broker leads, until it steps down
        self._seen: _Holder | None = None  # the leader key as last read or watched
        self._leader_known = asyncio.Event()
        self._campaigning = True
        self._task: asyncio.Task[None] | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._stray: set[asyncio.Task[int]] = set()  # keep-alives still running after their deadline
        self._callbacks: list[Callable[[LeadershipChange], None]] = []
        self._queues: set[asyncio.Queue[LeadershipChange | None]] = set()
        self._closed = False

    # state ------------------------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True while this broker leads and its lease cannot have expired yet (no store call)."""
        return self._epoch is not None and self._clock() < self._deadline

    @property
    def epoch(self) -> int | None:
        """The controller epoch of this broker's term while `is_leader`, else None."""
        return self._epoch if self.is_leader else None

    @property
    def lease(self) -> int | None:
        return self._lease

    @property
    def lease_deadline(self) -> float:
        """When the current lease may expire, on `clock`; -inf without a lease."""
        return self._deadline

    def leader_id(self) -> int | None:
        """The broker the leader key names, as last read or watched; None while there is none."""
        return None if self._seen is None else self._seen.broker_id

    async def wait_leader(self, timeout: float) -> int:
        """The leader's broker id, once there is one; TimeoutError after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while (leader := self.leader_id()) is None:
                await self._leader_known.wait()
                if self.leader_id() is None:
                    self._leader_known.clear()
            return leader

    def changes(self) -> AsyncIterator[LeadershipChange]:
        """Changes of this broker's leadership after this call, in order; ends when the election is closed."""
        queue: asyncio.Queue[LeadershipChange | None] = asyncio.Queue()
        self._queues.add(queue)
        if self._closed:
            queue.put_nowait(None)
        return self._drain(queue)

    async def _drain(self, queue: asyncio.Queue[LeadershipChange | None]) -> AsyncIterator[LeadershipChange]:
        try:
            while (change := await queue.get()) is not None:
                yield change
        finally:
            self._queues.discard(queue)

    def on_change(self, callback: Callable[[LeadershipChange], None]) -> Callable[[], None]:
        """Call `callback` (on the loop, synchronously) at each change; returns the function that stops it."""
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback)

    def _emit(self, change: LeadershipChange) -> None:
        for callback in list(self._callbacks):
            try:
                callback(change)
            except Exception:
                log.exception("a leadership callback of broker %d failed on %s", self.broker_id, change)
        for queue in self._queues:
            queue.put_nowait(change)

    def _become_leader(self, epoch: int) -> None:
        if self._epoch == epoch:
            return
        self._step_down("a new term")
        self._epoch = epoch
        log.info("broker %d is the leader of epoch %d", self.broker_id, epoch)
        self._emit(LeadershipChange(True, epoch))

    def _step_down(self, reason: str) -> None:
        epoch, self._epoch = self._epoch, None
        if epoch is not None:
            log.info("broker %d is no longer the leader of epoch %d: %s", self.broker_id, epoch, reason)
            self._emit(LeadershipChange(False, epoch))

    def _see(self, holder: _Holder | None) -> None:
        self._seen = holder
        if holder is not None and holder.broker_id is not None:
            self._leader_known.set()
        if self._epoch is not None and holder != _Holder(self.broker_id, self._epoch):
            self._step_down("the leader key changed")

    def _holder(self, value: bytes, epoch: int) -> _Holder:
        try:
            return _Holder(ClusterLeader.from_json(value, key=self._key).broker_id, epoch)
        except BadValue as e:
            log.warning("%s", e)
            return _Holder(None, epoch)

    # writes -----------------------------------------------------------------------------------------------

    async def write_as_leader(self, ops: Sequence[Op], extra_compares: Sequence[Compare] = ()) -> TxnResult:
        """`ops` in a transaction that holds only while this broker's term is current: NotLeader when it is
        not (refused locally once the lease may have expired; by the store's compare otherwise). A failed
        extra compare returns a result with `succeeded` False. MetadataUnavailable passes through."""
        epoch = self.epoch
        if epoch is None:
            why = "its lease may have expired" if self._epoch is not None else "it does not lead"
            raise NotLeader(f"broker {self.broker_id} is not the leader: {why}")
        try:
            return await write_with_epoch(self._store, self.broker_id, epoch, ops, extra_compares)
        except NotLeader:
            if self._epoch == epoch:
                self._step_down("a write as leader was refused")
            raise

    async def resign(self) -> None:
        """Give up leadership now (the key is deleted, so another broker takes over at once) and stop
        campaigning; the election still follows who leads. If the delete fails, the lease is left to expire
        and the error is raised."""
        self._campaigning = False
        epoch = self._epoch
        self._step_down("resigned")
        if epoch is not None:
            try:
                await self._delete_own_key(epoch)
            except MetadataError:
                if self._keeper is not None:
                    self._keeper.cancel()  # ends the session: no keep-alive keeps the key any longer
                raise

    async def _delete_own_key(self, epoch: int) -> None:
        await self._store.transaction([Compare(self._key, "create_revision", "==", epoch),
                                       Compare(self._key, "value", "==", self._value)], [Delete(self._key)])

    # lifecycle --------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Campaign once (so that `is_leader` and `leader_id()` are known on return), then keep the lease
        alive, follow the key and campaign again in the background. Raises MetadataUnavailable, leaving
        nothing behind, if the store cannot be reached."""
        if self._task is not None or self._closed:
            raise RuntimeError("a LeaderElection starts once")
        try:
            await self._grant()
            revision = await self._campaign()
        except BaseException:
            self._step_down("the first campaign failed")
            await self._abandon_lease()
            raise
        self._task = asyncio.create_task(self._run(revision), name=f"leader-election-{self.broker_id}")

    async def close(self) -> None:
        """Stop, step down and revoke the lease (which deletes the leader key if this broker held it)."""
        if self._closed:
            return
        self._closed = True
        self._campaigning = False
        self._step_down("closed")
        if self._task is not None:
            self._task.cancel()  # no await since the step-down: it cannot have won again
            await asyncio.gather(self._task, return_exceptions=True)
        if self._stray:  # keep-alives in flight: each ends within the store's call deadline
            await asyncio.wait(set(self._stray), timeout=self.ttl)
        for call in list(self._stray):
            call.cancel()
        await asyncio.gather(*self._stray, return_exceptions=True)
        await self._abandon_lease()
        for queue in self._queues:
            queue.put_nowait(None)

    # the background task ----------------------------------------------------------------------------------

    async def _run(self, revision: int | None) -> None:
        delay = RETRY_FIRST_DELAY
        while True:
            try:
                if revision is None:
                    await self._grant()
                    revision = await self._campaign()
                await self._session(revision)
                reason, delay = "its lease is lost", RETRY_FIRST_DELAY
            except MetadataError as e:
                reason, delay = str(e), min(2 * delay, RETRY_MAX_DELAY)
                log.warning("leader election of broker %d: %s; starting a new session", self.broker_id, e)
            self._step_down(reason)
            await self._abandon_lease()
            revision = None
            await asyncio.sleep(delay)

    async def _session(self, revision: int) -> None:
        """Keep the lease alive and follow the key from `revision` + 1, until the lease is lost or may have
        expired (returns) or the store fails (raises)."""
        assert self._lease is not None
        self._keeper = asyncio.create_task(self._keep_alive(self._lease))
        follower = asyncio.create_task(self._follow(revision))
        try:
            done, _ = await asyncio.wait({self._keeper, follower}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (self._keeper, follower):
                task.cancel()
            await asyncio.gather(self._keeper, follower, return_exceptions=True)
        for task in done:
            if not task.cancelled():  # resign() cancels the keeper to end the session
                task.result()

    async def _grant(self) -> None:
        sent = self._clock()
        self._lease = await self._store.grant_lease(self.ttl)
        self._deadline = sent + self.ttl
        if self._on_lease is not None:
            await self._on_lease(self._lease)

    async def _abandon_lease(self) -> None:
        """Revoke the lease if the store can be reached; otherwise it expires by itself within its TTL."""
        lease, self._lease, self._deadline = self._lease, None, -math.inf
        if lease is None:
            return
        try:
            await self._store.revoke_lease(lease)
        except LeaseNotFound:
            pass
        except MetadataError as e:
            log.info("broker %d leaves lease %x to expire: %s", self.broker_id, lease, e)

    async def _keep_alive(self, lease: int) -> None:
        """Returns when the lease is gone (LeaseNotFound) or may have expired: no keep-alive succeeded
        before the local deadline."""
        interval = self.ttl / KEEP_ALIVES_PER_TTL
        next_at = self._deadline - self.ttl + interval
        while True:
            await asyncio.sleep(max(0.0, min(next_at, self._deadline) - self._clock()))
            sent = self._clock()
            if sent >= self._deadline:
                log.warning("broker %d: lease %x may have expired (no keep-alive succeeded for %d s)",
                            self.broker_id, lease, self.ttl)
                return
            call = asyncio.ensure_future(self._store.keep_alive(lease))
            try:
                done, _ = await asyncio.wait({call}, timeout=max(0.0, self._deadline - sent))
            finally:
                if not call.done():  # it ends on the store's own deadline; its outcome no longer matters
                    self._stray.add(call)
                    call.add_done_callback(self._stray_done)
            if not done:
                continue  # the deadline has passed: the loop returns
            try:
                ttl = call.result()
            except LeaseNotFound:
                log.warning("broker %d: lease %x expired or was revoked", self.broker_id, lease)
                return
            except MetadataUnavailable as e:
                log.info("broker %d: a keep-alive of lease %x failed: %s", self.broker_id, lease, e)
                next_at = self._clock() + min(interval, RETRY_MAX_DELAY) / 2
                continue
            self._deadline = max(self._deadline, sent + ttl)
            next_at = sent + interval

    def _stray_done(self, call: asyncio.Task[int]) -> None:
        self._stray.discard(call)
        if not call.cancelled():
            call.exception()  # retrieved: a failure here was expected and changes nothing

    async def _campaign(self) -> int:
        """Create the key if it is absent (or only read it once this broker resigned); returns the store
        revision the outcome was read at, where following the key resumes."""
        assert self._lease is not None  # never a leader key without a lease: it would never expire
        if self._campaigning:
            result = await self._store.transaction([Compare(self._key, "version", "==", 0)],
                                                   [Put(self._key, self._value, self._lease)],
                                                   [Get(self._key)])
            if result.succeeded:
                self._see(_Holder(self.broker_id, result.revision))
                if self._campaigning:
                    self._become_leader(result.revision)
                else:  # resigned while the campaign was in flight
                    await self._delete_own_key(result.revision)
                return result.revision
        else:
            result = await self._store.transaction([], [Get(self._key)])
        found = result.responses[0]
        kv = found[0] if isinstance(found, list) and found else None
        self._see(None if kv is None else self._holder(kv.value, kv.create_revision))
        if kv is not None and self._campaigning and kv.value == self._value and kv.lease == self._lease:
            self._become_leader(kv.create_revision)  # ours already: a resync after the watch lost track
        return result.revision

    async def _follow(self, revision: int) -> None:
        """Follow the key from `revision` + 1; campaign when it disappears. Runs until cancelled or a store
        error other than a passing MetadataUnavailable in a campaign."""
        while True:
            await self._watch(revision)
            delay = RETRY_FIRST_DELAY
            while True:
                try:
                    revision = await self._campaign()
                    break
                except MetadataUnavailable as e:  # the keeper ends the session if this lasts
                    log.info("broker %d: a campaign failed: %s", self.broker_id, e)
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, RETRY_MAX_DELAY)

    async def _watch(self, revision: int) -> None:
        """Returns when the key is deleted while campaigning, or the watch lost track (compaction): either
        way the caller reads it again."""
        watch = self._store.watch_prefix(self._key, start_revision=revision + 1)
        try:
            async for event in watch:
                if event.key != self._key:  # a prefix watch: /cluster/leaderX is another key
                    continue
                if event.type == "delete":
                    self._see(None)
                    if self._campaigning:
                        return
                else:  # the epoch is the key's create revision, which every put event carries
                    self._see(self._holder(event.value, event.create_revision))
        except Compacted:
            return
        finally:
            await _close(watch)

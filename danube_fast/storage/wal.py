"""The asyncio face of one topic's write-ahead log.

Ownership: the event loop queues appends and commands and receives results; the disk work runs as tasks on
the process's shared IoPool (storage/io_pool.py), never on a thread of the WAL's own. A WAL has at most one
write task at a time, which owns the SegmentedLog engine for writing (append, roll, retention, close): it
takes everything queued since its last turn and appends it with one write. Under sync=always a separate sync
task runs fdatasync and acknowledges every group the fsync covered, in one `call_soon_threadsafe` hop:
group commit, pipelined, so the next group is written (by the write task, on another pool thread) while the
previous one is flushed (a writer that waited for each fsync left half the in-flight appends idle;
bench/RESULTS.md). The loop never blocks on disk: disk reads run in the default executor; reads at the tail
come from the in-memory BatchCache.

What readers see: records up to `committed_offset`, which advances only after the group that wrote them
was made as durable as the SyncPolicy promises. Under `always`, a consumer never sees a record that a crash
could take back. A replicated topic's owner holds that line lower still (`hold_visible`, `show_through`):
up to what its in-sync followers hold too, so that no reader sees a record a failover could give to another
(docs/REPLICATION.md); `durable_offset` and the `durable=True` reads are what it copies to them from.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from danube_fast.codec import frames
from danube_fast.errors import DanubeError, OffsetOutOfRange, WalClosed, WalWriteError
from danube_fast.storage._wal_common import AppendResult
from danube_fast.storage.config import WalConfig
from danube_fast.storage.file_span import FileSpan
from danube_fast.storage.io_pool import IoPool
from danube_fast.storage.log_loader import RecoveryReport
from danube_fast.storage.objects.format import Footer, clip_batches
from danube_fast.storage.segmented_log import SegmentedLog
from danube_fast.storage.tail_cache import BatchCache, CacheBudget, CachedGroup

log = logging.getLogger("danube_fast.wal")

Buffer = bytes | bytearray | memoryview

# Groups under this size are fsynced by the writer itself when the syncer is idle (bench/RESULTS.md:
# the broker's one-message appends gained ~10% throughput; the storage suite's big groups keep pipelining).
INLINE_SYNC_BYTES = 64 * 1024


@dataclass
class _Append:
    data: Buffer
    size: int
    future: asyncio.Future[tuple[int, int]]


@dataclass
class _Command:
    run: Callable[[], Any]
    future: asyncio.Future[Any]


class Wal:
    """One topic's WAL. Create with `await Wal.open(directory, config)`."""

    def __init__(self, engine: SegmentedLog, config: WalConfig, loop: asyncio.AbstractEventLoop,
                 pool: IoPool | None = None, cache_budget: CacheBudget | None = None) -> None:
        """`pool`: the threads that write and fdatasync (default: the process's shared IoPool);
        `cache_budget`: what the tail caches of every topic hold together (the broker's; None: this log's
        cache_bytes alone bounds its cache)."""
        self._log = engine
        self._config = config
        self._loop = loop
        self._pool = pool or IoPool.shared(config.io_threads)
        self._cache = BatchCache(config.cache_bytes, cache_budget)
        self._last_used = time.monotonic()  # the last append or read (release_if_idle)
        self._durable = engine.next_offset  # after the last record as durable as the sync policy says
        self._visible: int | None = None  # readers' limit below that (hold_visible), None: none
        self._committed = engine.next_offset  # what readers see: _durable, held to _visible
        self._committed_changed = asyncio.Event()
        self._closed: BaseException | None = None
        self._shut: asyncio.Future[None] = loop.create_future()  # set once the engine is closed
        # Appends made during one pass of the event loop, handed to the pool together by _handoff: one
        # lock and one task per pass instead of per append (under many concurrent producers the write task
        # then also sees bigger groups).
        self._outbox: list[_Append] = []
        self._handoff_scheduled = False
        self._unacked = 0  # appends not yet answered; written on the loop, read by the write task
        # Shared with the pool's threads, guarded by _cv.
        self._cv = threading.Condition()
        self._appends: deque[_Append] = deque()
        self._commands: deque[_Command] = deque()
        self._stopping = False
        self._writing = False  # a write task is queued, running or lingering (at most one: writes in order)
        self._lingering = False  # the write task waits for the linger to end before taking a group
        self._lingered = False  # ... and has waited once for the group it takes next
        # Written groups waiting for the fdatasync that covers them (sync=always), and the state of this
        # WAL's sync task: idle, queued or running (at most one; an inline fsync of the write task counts
        # as running).
        self._unsynced: deque[tuple[list[_Append], AppendResult]] = deque()
        self._sync_state = "idle"
        self._engine_closed = False
        self._interval_timer = False  # sync=interval: a tick is queued for the pool
        self._interval_due = False
        self._last_sync = time.monotonic()

    @classmethod
    async def open(cls, directory: str | os.PathLike[str], config: WalConfig | None = None, *,
                   initial_offset: int = 0, pool: IoPool | None = None,
                   cache_budget: CacheBudget | None = None) -> Wal:
        """Open (and recover) the log in `directory`; recovery runs off the event loop."""
        config = config or WalConfig()
        loop = asyncio.get_running_loop()
        engine = await loop.run_in_executor(None, lambda: SegmentedLog(
            os.fspath(directory),
            segment_bytes=config.segment_bytes,
            segment_ms=config.segment_ms,
            index_interval_bytes=config.index_interval_bytes,
            index_max_bytes=config.index_max_bytes,
            initial_offset=initial_offset,
            direct_io=config.direct_io and config.sync.mode == "always",
            direct_reads=config.direct_reads,
        ))
        return cls(engine, config, loop, pool, cache_budget)

    # -- state ---------------------------------------------------------------------------------------

    @property
    def directory(self) -> str:
        return self._log.directory

    @property
    def recovery(self) -> RecoveryReport:
        return self._log.recovery

    @property
    def committed_offset(self) -> int:
        """Offset after the last record readers may see (and that is acknowledged)."""
        return self._committed

    @property
    def durable_offset(self) -> int:
        """Offset after the last record as durable as the sync policy promises (committed_offset, unless a
        replicated topic's owner holds readers below it)."""
        return self._durable

    @property
    def start_offset(self) -> int:
        return self._log.start_offset

    def hold_visible(self, through: int) -> None:
        """From now on readers see records below `through` at most, and below what `show_through` says
        later (docs/REPLICATION.md: the in-sync followers' end). `through` must be a batch boundary."""
        self._visible = through
        self._set_committed()

    def show_through(self, through: int) -> None:
        """Readers may see records below `through` (a batch boundary), as far as they are durable here."""
        if self._visible is not None and through > self._visible:
            self._visible = through
            self._set_committed()

    def release_visible(self) -> None:
        """Readers see every durable record again (a topic no longer replicated)."""
        self._visible = None
        self._set_committed()

    def _line(self) -> int:
        """What readers may see: the durable records, held to _visible."""
        return self._durable if self._visible is None else min(self._durable, self._visible)

    def _set_committed(self) -> None:
        committed = self._line()
        if committed != self._committed:
            self._committed = committed
            self._committed_changed.set()
            self._committed_changed = asyncio.Event()

    @property
    def disk_bytes(self) -> int:
        """The bytes its segment files hold (what retention and the uploader have not removed yet)."""
        return self._log.disk_bytes

    @property
    def segment_bases(self) -> list[int]:
        """Base offsets of the segment files, oldest first; the last is the active segment's (the uploader
        turns the sealed ones into objects)."""
        return self._log.segment_bases

    def sealed_object(self, base: int) -> tuple[str, Footer] | None:
        """(path, footer) of the sealed segment starting at `base` when its file is a whole `.dnb1` object
        (SegmentedLog.sealed_object); the uploader stores such a file as it is."""
        return self._log.sealed_object(base)

    @property
    def config(self) -> WalConfig:
        return self._config

    # -- writing -------------------------------------------------------------------------------------

    async def append(self, batch: Buffer) -> tuple[int, int]:
        """Append a buffer of one or more encoded batches; returns its (first, last) offset once it is as
        durable as the sync policy promises. Raises FrameCorrupt (nothing appended) for a bad buffer."""
        return await self.submit(batch)

    def submit(self, batch: Buffer) -> asyncio.Future[tuple[int, int]]:
        """`append` without the coroutine: queue the buffer now, get the future of its (first, last) offset
        (for callers that keep many appends in flight and answer them in order)."""
        self._check_open()
        self._last_used = time.monotonic()
        fut: asyncio.Future[tuple[int, int]] = self._loop.create_future()
        self._outbox.append(_Append(batch, memoryview(batch).nbytes, fut))
        if not self._handoff_scheduled:
            self._handoff_scheduled = True
            self._loop.call_soon(self._handoff)
        self._unacked += 1
        fut.add_done_callback(self._answered)
        return fut

    def _answered(self, _fut: asyncio.Future[tuple[int, int]]) -> None:
        self._unacked -= 1

    def _handoff(self) -> None:
        self._handoff_scheduled = False
        if not self._outbox:
            return
        items, self._outbox = self._outbox, []
        with self._cv:
            self._appends.extend(items)
            self._kick()

    async def sync(self) -> None:
        """fdatasync now, whatever the policy (used at shutdown and before sealing a topic)."""
        await self._command(self._log.sync)

    async def roll(self) -> None:
        await self._command(self._log.roll)

    async def delete_before(self, offset: int) -> int:
        """Retention: delete whole segments whose records are all below `offset`."""
        deleted: int = await self._command(lambda: self._log.delete_before(offset))
        self._cache.drop_before(self._log.start_offset)
        return deleted

    async def release_if_idle(self, idle_s: float) -> bool:
        """When nothing was appended or read for `idle_s` seconds and no append waits: give back the cache
        and close the engine's files and index mappings (a topic nobody uses should cost next to nothing);
        the next append or read reopens them. True if released now."""
        if self._stopping or self._closed is not None or self._unacked or self._log.released \
                or time.monotonic() - self._last_used < idle_s:
            return False
        self._cache.clear()
        await self._command(self._log.release)
        return True

    @property
    def released(self) -> bool:
        """The engine's files are closed until the next use (release_if_idle)."""
        return self._log.released

    async def close(self) -> None:
        """Finish queued appends, fdatasync, close the files. Waiting readers get WalClosed."""
        if self._stopping:
            return
        self._handoff()  # appends accepted before close are written, as the docstring promises
        with self._cv:
            self._stopping = True
            self._kick()
        await self._shut
        self._closed = self._closed or WalClosed(f"the WAL in {self.directory} is closed")
        self._cache.clear()  # a closed log's groups leave the broker's cache budget
        self._committed_changed.set()

    async def _command(self, run: Callable[[], Any]) -> Any:
        self._check_open()
        fut: asyncio.Future[Any] = self._loop.create_future()
        with self._cv:
            self._commands.append(_Command(run, fut))
            self._kick()
        return await fut

    def _check_open(self) -> None:
        if self._closed is not None or self._stopping:
            raise WalClosed(f"the WAL in {self.directory} is closed")

    # -- the pool's tasks ------------------------------------------------------------------------------

    def _kick(self) -> None:
        """Under _cv: queue the write task unless it is queued, running or lingering already."""
        if not self._writing:
            self._writing = True
            self._pool.submit(self._write_task)

    def _write_task(self) -> None:
        """Write what is queued as one group, then run the queued commands; the last task closes the log.
        With a linger, a small group while other appends await their ack waits `linger_us` for more first
        (the task is queued again for then: no thread waits)."""
        policy = self._config.sync
        with self._cv:
            linger = self._config.linger_us / 1e6
            if linger and not self._lingered and self._appends and not self._commands and not self._stopping \
                    and self._unacked > len(self._appends) and self._queued_bytes() < INLINE_SYNC_BYTES:
                self._lingered = self._lingering = True
                self._pool.submit_at(time.monotonic() + linger, self._write_task)
                return
            self._lingered = self._lingering = False
            group = self._take_group()
            commands = list(self._commands)
            self._commands.clear()
            stopping = self._stopping and not self._appends
            interval_due, self._interval_due = self._interval_due, False
        if group:
            self._write_group(group)
        if policy.mode == "interval":
            self._interval_sync(interval_due)
        for cmd in commands:
            self._run_command(cmd)
        if self._log.unsynced_bytes == 0:
            self._last_sync = time.monotonic()
        if stopping:
            self._shutdown()
            return
        with self._cv:
            self._writing = False
            if self._appends or self._commands or self._stopping or self._interval_due:
                self._kick()

    def _interval_sync(self, due: bool) -> None:
        """sync=interval: fdatasync once `interval_ms` passed since the last one, here or at a tick queued
        for then."""
        if not self._log.unsynced_bytes:
            return
        deadline = self._last_sync + self._config.sync.interval_ms / 1000
        if due or time.monotonic() >= deadline:
            self._sync_quietly()
            return
        with self._cv:
            if not self._interval_timer:
                self._interval_timer = True
                self._pool.submit_at(deadline, self._interval_tick)

    def _interval_tick(self) -> None:
        with self._cv:
            self._interval_timer = False
            self._interval_due = True
            if not self._engine_closed:
                self._kick()

    def _queued_bytes(self) -> int:
        """Under _cv: the size of what waits for the writer (small appends are worth gathering; a big group
        is written at once)."""
        return sum(item.size for item in self._appends)

    def _take_group(self) -> list[_Append]:
        group: list[_Append] = []
        size = 0
        while self._appends and (not group or size + self._appends[0].size <= self._config.max_group_bytes):
            item = self._appends.popleft()
            group.append(item)
            size += item.size
        return group

    def _write_group(self, group: list[_Append]) -> None:
        try:
            result = self._log.append([item.data for item in group])
        except DanubeError as e:
            self._loop.call_soon_threadsafe(self._fail_groups, [group], e)
            return
        except Exception as e:  # a bug or MemoryError must not leave the group's futures hanging
            err = WalWriteError(f"appending to the WAL in {self.directory} failed: {e!r}")
            err.__cause__ = e
            self._loop.call_soon_threadsafe(self._fail_groups, [group], err)
            return
        if self._config.sync.mode != "always" or result.data is None:
            self._loop.call_soon_threadsafe(self._complete_groups, [(group, result)])
            return
        with self._cv:
            # A small group while no fsync is queued or running: fsync here rather than queue a task (one
            # thread handoff less per group, which is what small appends pay most for). Large groups, or a
            # busy fsync: queue it, so that the next group is written while this one is flushed (pipelining).
            small = memoryview(result.data).nbytes < INLINE_SYNC_BYTES
            inline = small and not self._unsynced and self._sync_state == "idle"
            if inline:
                self._sync_state = "running"
            else:
                self._unsynced.append((group, result))
                if self._sync_state == "idle":
                    self._sync_state = "queued"
                    self._pool.submit(self._sync_task)
        if not inline:
            return
        try:
            self._log.sync()
        except Exception as e:
            self._loop.call_soon_threadsafe(self._fail_groups, [group], _sync_error(e, self.directory))
        else:
            self._loop.call_soon_threadsafe(self._complete_groups, [(group, result)])
        finally:
            with self._cv:
                self._sync_state = "idle"
                self._cv.notify_all()

    def _sync_task(self) -> None:
        """sync=always: fdatasync whatever has been written, acknowledge exactly what it covered; queued
        again while groups wait. Runs beside the write task, so the next group is written meanwhile."""
        with self._cv:
            if self._engine_closed or not self._unsynced:
                self._sync_state = "idle"
                self._cv.notify_all()
                return
            self._sync_state = "running"
        try:
            covered = self._log.sync()
        except Exception as e:
            with self._cv:
                failed = [group for group, _ in self._unsynced]
                self._unsynced.clear()
                self._sync_state = "idle"
                self._cv.notify_all()
            self._loop.call_soon_threadsafe(self._fail_groups, failed, _sync_error(e, self.directory))
            return
        with self._cv:
            done = []
            while self._unsynced and self._unsynced[0][1].next_offset <= covered:
                done.append(self._unsynced.popleft())
            if self._unsynced:
                self._sync_state = "queued"
                self._pool.submit(self._sync_task)
            else:
                self._sync_state = "idle"
            self._cv.notify_all()
        if done:
            self._loop.call_soon_threadsafe(self._complete_groups, done)

    def _sync_quietly(self) -> None:
        try:
            self._log.sync()
        except WalWriteError as e:
            log.error("background fdatasync failed; the WAL refuses appends until reopened: %s", e)

    def _run_command(self, cmd: _Command) -> None:
        try:
            value = cmd.run()
        except Exception as e:
            self._loop.call_soon_threadsafe(_set_exception, cmd.future, e)
        else:
            self._loop.call_soon_threadsafe(_set_result, cmd.future, value)

    def _shutdown(self) -> None:
        """The last write task: let a running fsync finish, fsync what still waits, close the engine (which
        waits for disk reads in progress; reads that start later get WalClosed, never an error of a closed
        file)."""
        with self._cv:
            while self._sync_state == "running":
                self._cv.wait()
            self._engine_closed = True  # a sync task still queued finds nothing to do
            remaining = list(self._unsynced)
            self._unsynced.clear()
        if remaining:
            try:
                self._log.sync()
            except Exception as e:
                error = _sync_error(e, self.directory)
                self._loop.call_soon_threadsafe(self._fail_groups, [g for g, _ in remaining], error)
            else:
                self._loop.call_soon_threadsafe(self._complete_groups, remaining)
        try:
            self._log.close()
        except DanubeError as e:
            log.error("closing the WAL in %s: %s", self.directory, e)
        finally:
            self._loop.call_soon_threadsafe(_set_result, self._shut, None)

    # -- back on the event loop ----------------------------------------------------------------------

    def _complete_groups(self, done: list[tuple[list[_Append], AppendResult]]) -> None:
        for group, result in done:
            if result.data is not None:
                self._cache.add(self._cached(group, result))
                self._durable = result.next_offset
                self._committed = self._line()
            for item, r in zip(group, result.ranges, strict=True):
                if isinstance(r, Exception):
                    _set_exception(item.future, r)
                else:
                    _set_result(item.future, r)
        self._committed_changed.set()
        self._committed_changed = asyncio.Event()

    @staticmethod
    def _cached(group: list[_Append], result: AppendResult) -> CachedGroup:
        assert result.data is not None
        starts: list[int] = []
        positions: list[int] = []
        pos = 0
        for item, r in zip(group, result.ranges, strict=True):
            if isinstance(r, tuple):
                starts.append(r[0])
                positions.append(pos)
                pos += item.size
        return CachedGroup(result.first_offset, result.next_offset, result.data, starts, positions)

    def _fail_groups(self, groups: list[list[_Append]], error: Exception) -> None:
        for group in groups:
            for item in group:
                _set_exception(item.future, error)

    # -- reading -------------------------------------------------------------------------------------

    async def read(self, offset: int, max_bytes: int = 1024 * 1024, *, durable: bool = False
                   ) -> tuple[Buffer, int] | None:
        """Whole batches from the one holding `offset` (it may start before `offset`: skip those records),
        about max_bytes, all committed (`durable`: all durable here, held back or not); with the offset after
        the last record returned. None when `offset` is not committed yet. Raises OffsetOutOfRange below the
        first stored offset."""
        if self._closed is not None:
            raise self._closed
        committed = self._durable if durable else self._committed
        if offset >= committed:
            return None
        self._last_used = time.monotonic()
        group = self._cache.find(offset)
        if group is not None:
            return _below(group.from_offset(offset, max_bytes), offset, committed)
        if offset < self._log.start_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is below the first stored offset {self._log.start_offset}")
        # The engine's close waits for reads in progress; a read that starts after it gets WalClosed.
        data = await self._loop.run_in_executor(None, self._log.read, offset, max_bytes, committed)
        if data is None:
            return None
        return data, frames.span(data)[1]

    async def read_span(self, offset: int, max_bytes: int = 1024 * 1024
                        ) -> tuple[Buffer | FileSpan, int] | None:
        """`read`, except that batches the tail cache does not hold may come as a FileSpan, a byte range of
        their segment file, for a transport that sends them with sendfile (storage/file_span.py)."""
        committed = self._committed
        if self._closed is not None or offset >= committed or self._cache.find(offset) is not None:
            return await self.read(offset, max_bytes)
        self._last_used = time.monotonic()
        # One trip to the executor: small batches come back read (SegmentedLog.read).
        got = await self._loop.run_in_executor(None, partial(self._log.read, span=True), offset, max_bytes,
                                               committed)
        if got is None or isinstance(got, tuple):
            return got
        return got, frames.span(got)[1]

    def empty_between(self, low: int, high: int) -> int:
        return 0  # a WAL's offsets are dense: every one holds a record

    def cached(self, offset: int, max_bytes: int, *, durable: bool = False) -> tuple[memoryview, int] | None:
        """What `read` would answer from memory alone, without waiting: None when `offset` is not both
        committed and still in the cache."""
        committed = self._durable if durable else self._committed
        if self._closed is not None or offset >= committed:
            return None
        self._last_used = time.monotonic()
        group = self._cache.find(offset)
        return _below(group.from_offset(offset, max_bytes), offset, committed) if group is not None else None

    async def wait_committed(self, offset: int) -> None:
        """Return once `offset` is committed (readable); raises WalClosed if the log closes first."""
        while self._committed <= offset:
            if self._closed is not None:
                raise self._closed
            await self._committed_changed.wait()

    async def wait_durable(self, offset: int) -> None:
        """Return once `offset` is durable here, held back from readers or not."""
        while self._durable <= offset:
            if self._closed is not None:
                raise self._closed
            await self._committed_changed.wait()

    def reader(self, start: int, *, max_bytes: int = 1024 * 1024, follow: bool = True) -> WalReader:
        return WalReader(self, start, max_bytes, follow)


class WalReader:
    """Async iterator of buffers of whole batches from `start` on. The first buffer may begin with records
    before `start` (a batch is never split); skip them by offset. With `follow`, waits at the tail for new
    commits instead of stopping."""

    def __init__(self, wal: Wal, start: int, max_bytes: int, follow: bool) -> None:
        self._wal = wal
        self.position = start
        self._max_bytes = max_bytes
        self._follow = follow

    def __aiter__(self) -> AsyncIterator[Buffer]:
        return self

    async def __anext__(self) -> Buffer:
        while True:
            got = await self._wal.read(self.position, self._max_bytes)
            if got is not None:
                data, self.position = got
                return data
            if not self._follow:
                raise StopAsyncIteration
            await self._wal.wait_committed(self.position)


def _below(got: tuple[memoryview, int], offset: int, limit: int) -> tuple[memoryview, int]:
    """A cached read cut to the batches below `limit` (a held-back line inside a group)."""
    if got[1] <= limit:
        return got
    return clip_batches(got[0], offset, limit, len(got[0]), whole=True)


def _sync_error(e: Exception, directory: str) -> Exception:
    if isinstance(e, DanubeError):
        return e
    err = WalWriteError(f"fdatasync of the WAL in {directory} failed: {e!r}")  # a bug must fail the
    err.__cause__ = e  # appends, not strand them
    return err


def _set_result(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Any], error: BaseException) -> None:
    if not fut.done():
        fut.set_exception(error)

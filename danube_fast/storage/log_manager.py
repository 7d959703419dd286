"""The WALs of the topics a broker serves: opened, released when idle, closed and removed here.

LogManager owns what every log of the process shares: the I/O pool their writes and fsyncs run on
(storage/io_pool.py), the byte budget of their tail caches ([wal] cache_total_bytes, storage/tail_cache.py)
and the sweeper that gives back an idle log's cache, descriptors and index mappings ([wal] idle_release_ms)
until its next use. The broker's topic registry asks it for a topic's WAL and hands the WAL back here; nothing
else opens, closes or deletes one. Kafka's LogManager and Redpanda's log_manager hold the same place.

Owner: the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil

from danube_fast.names import TopicName
from danube_fast.storage.config import WalConfig
from danube_fast.storage.io_pool import IoPool
from danube_fast.storage.tail_cache import CacheBudget
from danube_fast.storage.wal import Wal

log = logging.getLogger("danube_fast.storage")


class LogManager:
    def __init__(self, root: str, config: WalConfig) -> None:
        """`root`: the directory holding one directory per namespace, and in it one per topic."""
        self._root = root
        self._config = config
        self.pool = IoPool.shared(config.io_threads)
        self.cache_budget = CacheBudget(config.cache_total_bytes)
        self._logs: dict[str, Wal] = {}  # the open logs, by directory
        self._sweeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._config.idle_release_ms and self._sweeper is None:
            self._sweeper = asyncio.create_task(self._release_idle(self._config.idle_release_ms / 1000),
                                                name="release-idle-logs")

    async def stop(self) -> None:
        """Stop the sweeper; the logs themselves are closed by whoever opened them (close)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None

    def directory(self, name: TopicName) -> str:
        return os.path.join(self._root, name.namespace, name.topic)

    async def open(self, name: TopicName, initial_offset: int = 0) -> Wal:
        """The topic's WAL, recovered (or new at `initial_offset`)."""
        wal = await Wal.open(self.directory(name), self._config, initial_offset=initial_offset,
                             pool=self.pool, cache_budget=self.cache_budget)
        report = wal.recovery
        if report.truncated_bytes:
            log.warning("WAL of %s: recovery cut %d bytes (%s)", name, report.truncated_bytes, report)
        self._logs[wal.directory] = wal
        return wal

    async def close(self, wal: Wal) -> None:
        """fsync and close; its files stay."""
        self._logs.pop(wal.directory, None)
        await wal.close()

    async def remove(self, name: TopicName, *, best_effort: bool = False) -> None:
        """Delete the topic's WAL directory (closed first by close(); a missing one is not an error).
        `best_effort`: whatever cannot be deleted is left, silently (undoing a creation that failed)."""
        directory = self.directory(name)
        if best_effort:
            remove = functools.partial(shutil.rmtree, directory, ignore_errors=True)
        else:
            remove = functools.partial(_remove_tree, directory)
        await asyncio.get_running_loop().run_in_executor(None, remove)

    def released(self) -> int:
        """Open logs that are released now (idle)."""
        return sum(1 for wal in self._logs.values() if wal.released)

    async def _release_idle(self, idle: float) -> None:
        """Logs that saw no append and no read for `idle` seconds give back their cache, descriptors and
        index mappings; the next use reopens them. Their topics, producers and subscriptions stay: Danube
        clients hold ids that must keep resolving."""
        while True:
            await asyncio.sleep(max(1.0, idle / 4))
            released = 0
            for wal in list(self._logs.values()):
                try:
                    released += await wal.release_if_idle(idle)
                except Exception as e:  # a closed or failed log: its owner reports that
                    log.debug("releasing the idle log in %s: %s", wal.directory, e)
            if released:
                log.info("released the logs of %d idle topics", released)


def _remove_tree(directory: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(directory)

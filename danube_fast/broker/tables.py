"""The table writer (docs/TABLES.md): on each topic's owner, the records of the Reliable topics whose policy
asks for a table (`tableMode`) appended to their Iceberg tables, exactly once, at most about `[tables]
lag_ms` behind the committed offset.

One task per broker. Every TICK_S a pass goes over the served topics that want a table (which ones is read
from the policies every `policy_check_ms`: a policy change applies without a restart) and, per topic due a
commit (its last was `lag_ms / 2` ago, or a whole commit's worth is waiting), reads what the table lacks
through the topic's `log` (object tier, then WAL, then the committed tail: what a consumer would read) and
commits it (danube_fast/tables/commit.py), at most `commit_bytes` of batches per
commit. A topic that turns a table on is backfilled from the first offset it keeps. The table itself says
where to resume (its current snapshot's `danube.offsets`), so a restart, a crash or a move to another broker
continues where the last commit ended, and a writer that lost a race to another plans again.

Decoding, Parquet encoding, the catalog commit and maintenance run in the table worker, a process of its
own (broker/table_worker.py, tables/worker.py), one request at a time per broker: here, only the reads and a
spool file's write.

Owner: the broker's event loop. `status` (what each table holds and what went wrong) is written only by the
pass; the admin service and the metrics read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from danube_fast import names
from danube_fast.broker import crashpoints
from danube_fast.broker.namespaces import Namespaces
from danube_fast.broker.retention import own_policies
from danube_fast.broker.table_worker import TableWorker, WorkerFailed
from danube_fast.broker.topic import ReliableTopic
from danube_fast.broker.topic_registry import TopicRegistry, partition_prefix, partitions_in
from danube_fast.errors import DanubeError, ObjectCorrupt, ObjectNotFound, OffsetOutOfRange
from danube_fast.meta import keys
from danube_fast.meta.resources import Policy
from danube_fast.meta.resources_storage import TableCatalog
from danube_fast.meta.store import MetadataStore
from danube_fast.names import TopicName
from danube_fast.storage.objects.format import clip_batches
from danube_fast.storage.tiered import records_between
from danube_fast.tables import worker_messages as m
from danube_fast.tables.config import TablesConfig
from danube_fast.tables.errors import ModeMismatch, SchemaModeError

if TYPE_CHECKING:
    from danube_fast.schema.arrow_values import Resolved
    from danube_fast.tables.worker_messages import Committed

log = logging.getLogger("danube_fast.tables")

READ_BYTES = 4 * 1024 * 1024  # one log read
TICK_S = 0.25  # how often the writer looks for topics due a commit
COMPACT_ROW_GROUPS = 4  # compaction's groups hold at most this many row groups' rows (maintenance.py)


class DataLost(Exception):
    """Records the table lacks are no longer stored ([tables] fail_on_data_loss)."""


class TableAhead(Exception):
    """The table holds offsets the topic has not: it belongs to an earlier topic of the same name."""


@dataclass
class TableStatus:
    """What the writer knows of one stored topic's table (admin `tables status`, metrics)."""

    mode: str
    table: str  # the Iceberg identifier, ns.topic
    committed_offset: int = 0  # the next offset the table lacks
    topic_offset: int = 0  # the topic's committed offset at the last pass
    behind_since: float | None = None  # when the table last fell behind the topic (None: caught up)
    files: int = 0
    bytes: int = 0
    commits: int = 0
    dlq_records: int = 0
    skipped_records: int = 0  # lost before the table got them (fail_on_data_loss false)
    metadata_location: str = ""
    compacted_files: int = 0  # replaced by compaction, by this broker since the topic was loaded here
    partitioning: str = ""  # the table's current spec: its time period, then tablePartitionBy's fields
    error: str = ""  # the last pass's error, "" when it went well
    stopped: str = ""  # data loss with fail_on_data_loss: the table waits for an operator

    def lag_ms(self, now: float) -> int:
        return 0 if self.behind_since is None else int((now - self.behind_since) * 1000)


@dataclass
class _Table:
    topic: ReliableTopic | None = None  # whose table it is: a topic deleted and created again is another
    committed: Committed | None = None  # the table as the worker last loaded or committed it; None: load it
    status: TableStatus = field(default_factory=lambda: TableStatus("none", ""))
    last_commit: float = 0.0  # when this broker last committed to it (the writer's clock)
    bytes_per_record: float = 0.0  # of the record batches of the last commit: to size what is pending
    # the policy's tablePartitioning and tablePartitionBy the table was last loaded (and evolved) for
    partitioning: tuple[str, str] = ("", "")
    resolved: Resolved | None = None  # schema mode: the topic's subject as last read
    resolved_at: float = 0.0  # when it was last read (or tried)
    unresolved: SchemaModeError | None = None  # why it could not be, then
    asked_version: int = 0  # the newest schema version records carried when the registry was last read


class TableWriter:
    def __init__(self, topics: TopicRegistry, namespaces: Namespaces, store: MetadataStore,
                 location: TableCatalog, config: TablesConfig, worker: TableWorker,
                 clock: Callable[[], float] = time.time) -> None:
        self._topics = topics
        self._namespaces = namespaces
        self._store = store
        self.location = location
        self._config = config
        self._worker = worker
        self._clock = clock
        self._tables: dict[str, _Table] = {}  # by stored topic
        self._modes: dict[str, str] = {}  # stored topic -> table mode, from the last policy read
        # stored topic -> (tablePartitioning, tablePartitionBy), from the same read
        self._partitioning: dict[str, tuple[str, str]] = {}
        # stored topic -> its table's retention: (ms, bytes), 0 for no limit
        self._retention: dict[str, tuple[int, int]] = {}
        self._modes_read = 0.0
        self._maintained: dict[str, float] = {}  # table identifier -> when it was last maintained
        self._dropped_at = 0.0  # when deleted topics' tables were last looked for ([tables] drop_with_topic)
        self.dropped: list[str] = []  # the tables it dropped, for the log and the tests
        self._task: asyncio.Task[None] | None = None
        self.passes = 0

    @property
    def status(self) -> dict[str, TableStatus]:
        return {name: t.status for name, t in self._tables.items()}

    async def publish_location(self) -> None:
        """Write where the catalog is (`/danube-data/tables/catalog`) when the store says otherwise."""
        key = keys.tables_catalog()
        kv = await self._store.get(key)
        if kv is None or TableCatalog.from_json(kv.value, key=key) != self.location:
            await self._store.put(key, self.location.to_json())

    async def prepare(self) -> None:
        """Before the broker serves: when a policy asks for tables, start the table worker (its imports take
        about a second), so that the first commit does not wait for it."""
        policies = await self._policies(self._topics.stored())
        modes = [p.table_mode for p in policies.values()]
        modes += [self._namespaces.policy(ns).table_mode for ns in self._namespaces.names()]
        if any(mode != "none" for mode in modes):
            await self._worker.start()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tables")

    async def _ask(self, op: str, **kwargs: Any) -> Any:
        """An op of the worker; its failures that stop or hold a table raised as the writer's own."""
        try:
            return await self._worker.call(op, **kwargs)
        except WorkerFailed as e:
            raise _translated(e) from None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._worker.close()

    async def _run(self) -> None:
        tick = min(self._config.lag_ms / 2000, TICK_S)
        while True:
            started = self._clock()
            try:
                behind = await self.run_pass()
            except DanubeError as e:  # the metadata store away: the next pass tries again
                log.warning("table pass failed: %s", e)
                behind = False
            except Exception:  # a bug must not end the tables for the broker's life
                log.exception("table pass failed")
                behind = False
            # A topic with more to write than one commit takes goes on at once; the others wait.
            await asyncio.sleep(0 if behind else max(0.0, tick - (self._clock() - started)))

    async def run_pass(self) -> bool:
        """One pass over the served topics that want a table; whether any is still behind after it."""
        served = self._topics.stored()
        now = self._clock()
        if now - self._modes_read >= self._config.policy_check_ms / 1000 or \
                any(t.full not in self._modes for t in served):
            policies = await self._policies(served)
            self._modes = {name: p.table_mode for name, p in policies.items()}
            self._partitioning = {name: (p.table_partitioning, p.table_partition_by)
                                  for name, p in policies.items()}
            self._retention = {name: (p.table_retention_ms, p.table_retention_bytes)
                               for name, p in policies.items()}
            self._modes_read = now
        wanted = [t for t in served if self._modes.get(t.full, "none") != "none"]
        for gone in set(self._tables) - {t.full for t in wanted}:
            del self._tables[gone]
        behind = False
        for topic in wanted:
            mode = self._modes[topic.full]
            entry = self._tables.get(topic.full)
            # A new mode, or the topic deleted and created again between passes, starts over (and clears a
            # stop): the cached table state is of the earlier one.
            if entry is None or entry.status.mode != mode or entry.topic is not topic:
                entry = self._tables[topic.full] = _Table(topic=topic, status=TableStatus(mode, ""))
            if entry.status.stopped:
                continue
            partitioning = self._partitioning.get(topic.full, ("hour", ""))
            if entry.partitioning != partitioning:  # loading the table evolves it to the policy's
                entry.partitioning, entry.committed = partitioning, None
            try:
                more = await self._write(topic, entry)
                behind |= more
                if not more:
                    await self._maintain(entry, topic, self._retention.get(topic.full, (0, 0)))
                entry.status.error = ""
            except (DataLost, TableAhead, ModeMismatch) as e:
                entry.status.stopped = str(e)
                log.error("%s: table stopped: %s", topic.full, e)
            except SchemaModeError as e:  # the registry or the topic's subject must change first
                if str(e) != entry.status.error:
                    log.warning("%s: table waits: %s", topic.full, e)
                entry.status.error = str(e)
            except Exception as e:  # the catalog, the object store or a disk away: the next pass retries
                entry.committed = None  # reload: a failed commit may have left it stale
                error = str(e) if isinstance(e, WorkerFailed) else f"{type(e).__name__}: {e}"
                if error != entry.status.error:  # once per cause, not once per pass
                    log.warning("%s: table commit failed, retrying each pass: %s", topic.full, error)
                entry.status.error = error
        if self._config.drop_with_topic and now - self._dropped_at >= self._config.maintenance_ms / 1000:
            self._dropped_at = now
            try:
                await self._drop_deleted()
            except Exception as e:  # the catalog or the store away: the next round tries again
                log.warning("dropping the tables of deleted topics failed: %s: %s", type(e).__name__, e)
        self.passes += 1
        return behind

    async def snapshots(self, namespace: str, base: str) -> list[m.SnapshotInfo] | None:
        """The snapshots the topic's table keeps (None: it has no table), read by the table worker (started
        for it when it is not running)."""
        result: list[m.SnapshotInfo] | None = await self._ask("snapshots", identifier=(namespace, base))
        return result

    async def _policies(self, served: list[ReliableTopic]) -> dict[str, Policy]:
        """Each topic's policy as the store says now, by full name."""
        own = await own_policies(self._store, served)
        return {t.full: self._namespaces.topic_policy(t.name, own.get(t.full)) for t in served}

    async def _drop_deleted(self) -> None:
        """Drop the tables whose topic is gone from the metadata store (read there, not from the cache: a
        cache behind would drop a live topic's table). Any broker may do it; a table dropped twice is
        dropped once."""
        from danube_fast.tables.catalog import DEAD_LETTER_SUFFIX

        for namespace, table in await self._ask("tables"):
            base = table.removesuffix(DEAD_LETTER_SUFFIX)
            if await self._topic_exists(namespace, base):
                continue
            files = await self._ask("drop", identifier=(namespace, table))
            name = f"{namespace}.{table}"
            for stored in [s for s, t in self._tables.items() if t.status.table == name]:
                del self._tables[stored]  # its cached state is of the dropped table
            self.dropped.append(name)
            log.info("%s.%s: topic /%s/%s was deleted: table dropped, %d files deleted", namespace, table,
                     namespace, base, files)

    async def _topic_exists(self, namespace: str, topic: str) -> bool:
        """The topic, or a partition of it, in the metadata store."""
        if await self._store.get(keys.namespace_topic(namespace, topic)) is not None:
            return True
        name = TopicName(namespace, topic)
        return bool(partitions_in(await self._store.get_prefix(partition_prefix(name)), name))

    async def _resolve(self, topic: ReliableTopic, entry: _Table, force: bool = False) -> Resolved:
        """Schema mode: the topic's subject, read again every policy_check_ms (or when `force`d); raises
        SchemaModeError while it cannot type a table."""
        now = self._clock()
        if force or now - entry.resolved_at >= self._config.policy_check_ms / 1000:
            from danube_fast.tables import typed

            entry.resolved_at = now
            entry.resolved = None
            try:
                entry.resolved = await typed.resolve(self._store, topic.name.namespace, topic.name.topic)
            except SchemaModeError as e:
                entry.unresolved = e
        if entry.resolved is None:
            raise entry.unresolved or SchemaModeError("the topic's schema subject was not read yet")
        return entry.resolved

    async def _write(self, topic: ReliableTopic, entry: _Table) -> bool:
        """Commit up to commit_bytes of what the table lacks; whether more is left."""
        status = entry.status
        spec = self._spec(topic)
        if entry.committed is None:
            entry.committed = await self._ask("load", spec=spec)
            status.table = ".".join(spec.identifier)
            self._took(entry, entry.committed)
        if status.mode == "schema":
            await self._resolve(topic, entry)
        held = entry.committed.offsets.get(topic.full)
        log_ = topic.log
        start = log_.start_offset if held is None else held
        end = log_.committed_offset
        status.topic_offset = end
        status.committed_offset = start
        if held is not None and held > end:
            raise TableAhead(f"the table holds offsets up to {held} but the topic's committed offset is "
                             f"{end}: the topic was deleted and created again (or lost acknowledged records "
                             f"under sync none); drop or rename the table {status.table} to start a new one")
        if start >= end:
            status.behind_since = None
            return False
        now = self._clock()
        if status.behind_since is None:
            status.behind_since = now
        # Commit every lag_ms / 2, or at once when a whole commit's worth is waiting: a busy topic is read
        # while its batches are still in the WAL's tail cache, not from the device after they left it.
        pending = (end - start) * entry.bytes_per_record
        if now - entry.last_commit < self._config.lag_ms / 2000 and pending < self._config.commit_bytes:
            return False
        if start < log_.start_offset:
            lost = records_between(log_, start, log_.start_offset)
            if lost and self._config.fail_on_data_loss:
                raise DataLost(f"offsets {start}..{log_.start_offset - 1} ({lost} records) were deleted "
                               "before the table got them; set [tables] fail_on_data_loss = false to skip "
                               "them")
            status.skipped_records += lost
        data, next_offset = await self._read(topic, start, end, status)
        if next_offset == start:
            return False
        base, partition = _stored(topic)
        try:
            state, dead = await self._worker.commit(
                data, spec=spec, stored=topic.full, topic=f"/{topic.name.namespace}/{base}",
                partition=partition, start=start, end=next_offset,
                resolved=entry.resolved if status.mode == "schema" else None,
                asked_version=entry.asked_version,
                pause_before_commit=crashpoints.armed(crashpoints.TABLE_BEFORE_COMMIT))
        except WorkerFailed as e:
            if e.failure.kind == m.MOVED:
                log.info("%s: another commit landed first (%s): planning again from the table", topic.full,
                         e.failure.message)
                entry.committed = None
                return True
            if e.failure.kind == m.STALE_SCHEMA:  # read the registry again; a version it lacks won't decode
                await self._resolve(topic, entry, force=True)
                entry.asked_version = e.failure.version
                return True
            raise _translated(e) from None
        entry.committed = state
        if dead:
            status.dlq_records += dead
            log.warning("%s: %d records did not decode with their schema and went to the dead-letter table",
                        topic.full, dead)
        status.committed_offset = state.offsets[topic.full]
        self._took(entry, state)
        status.commits += 1
        entry.last_commit = now
        entry.bytes_per_record = sum(len(d) for d in data) / max(1, next_offset - start)
        more = status.committed_offset < end
        if not more:
            status.behind_since = None
        return more

    async def _maintain(self, entry: _Table, topic: ReliableTopic, retention: tuple[int, int]) -> None:
        """Retention, compaction, expiry and the sweep of the entry's table (and of its dead-letter table)
        when due: each table once per maintenance_ms, whichever of its stored topics comes first."""
        name = entry.status.table
        now = self._clock()
        due = now - self._maintained.get(name, 0.0) >= self._config.maintenance_ms / 1000
        if entry.committed is None or not due:
            return
        self._maintained[name] = now
        c = self._config
        started = time.monotonic()
        got = await self._ask("maintain", spec=self._spec(topic), target_bytes=c.target_file_bytes,
                              min_files=c.compact_min_files, keep_ms=c.snapshot_keep_ms,
                              grace_ms=c.orphan_grace_ms, retention_ms=retention[0],
                              retention_bytes=retention[1], group_rows=COMPACT_ROW_GROUPS * c.row_group_rows)
        if got is None:  # the worker has not loaded it (it was restarted): the next commit does
            return
        entry.committed, done = got
        self._took(entry, entry.committed)
        entry.status.compacted_files += done.compacted_files
        if done.compacted_files or done.expired_snapshots or done.swept_files or done.retained_files:
            log.info("%s: retention removed %d files, compacted %d files into %d, expired %d snapshots, "
                     "swept %d files (%.1f s)", name, done.retained_files, done.compacted_files,
                     done.written_files, done.expired_snapshots, done.swept_files, time.monotonic() - started)

    @staticmethod
    def _took(entry: _Table, state: Committed) -> None:
        entry.status.metadata_location, entry.status.files, entry.status.bytes = (
            state.metadata_location, state.files, state.bytes)
        entry.status.partitioning = state.partitioning

    def _spec(self, topic: ReliableTopic) -> m.TableSpec:
        base, partition = _stored(topic)
        mode = self._modes.get(topic.full, "envelope")
        unit, partition_by = self._partitioning.get(topic.full, ("hour", ""))
        return m.TableSpec(topic.name.namespace, base, partition >= 0, mode, unit,
                           self._config.row_group_rows, self._config.compression, partition_by)

    async def _read(self, topic: ReliableTopic, start: int, end: int,
                    status: TableStatus) -> tuple[list[memoryview], int]:
        """Whole batches of [start, end) up to commit_bytes, and the offset after the last record read."""
        chunks: list[memoryview] = []
        size = 0
        offset = start
        while offset < end and size < self._config.commit_bytes:
            try:
                got = await topic.log.read(offset, READ_BYTES)
            except (ObjectCorrupt, ObjectNotFound) as e:
                offset = self._skip_unreadable(topic, offset, e, status)
                continue
            except OffsetOutOfRange:
                break  # retention moved the start meanwhile: the next pass sees it
            if got is None:
                # Nothing readable at `offset`: not committed yet, or the rest of the range is a hole (a dead
                # owner's unused reservation, declared empty). The table holds all of a hole: the commit
                # moves its offsets past it even with no rows, or it would wait for records that never come.
                if records_between(topic.log, offset, end) == 0:
                    offset = end
                break
            chunk, after = clip_batches(got[0], offset, end, self._config.commit_bytes - size,
                                        whole=not chunks)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            offset = after
            await asyncio.sleep(0)  # a read the tail cache answers does not wait: let the loop serve others
        return chunks, offset

    def _skip_unreadable(self, topic: ReliableTopic, offset: int, error: Exception,
                         status: TableStatus) -> int:
        log_ = topic.log
        following = log_.cloud.next_start(offset) if log_.cloud is not None else None
        target = following if following is not None else log_.wal.start_offset
        if self._config.fail_on_data_loss or target <= offset:
            raise DataLost(f"offset {offset} cannot be read: {error}")
        status.skipped_records += records_between(log_, offset, target)
        log.warning("%s: offsets %d..%d cannot be read (%s): the table skips them", topic.full, offset,
                    target - 1, error)
        return target


def _translated(e: WorkerFailed) -> Exception:
    """A worker's failure as the writer handles it: a table of another mode stops, a topic whose schema
    cannot type a table waits, anything else is retried."""
    if e.failure.kind == m.MODE_MISMATCH:
        return ModeMismatch(e.failure.message)
    if e.failure.kind == m.SCHEMA_MODE:
        return SchemaModeError(e.failure.message)
    return e


def _stored(topic: ReliableTopic) -> tuple[str, int]:
    """(base topic's short name, partition index or -1)."""
    short = topic.name.topic
    base = names.partition_base(short)
    return (short, -1) if base is None else (base, names.partition_index(short))

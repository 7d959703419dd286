"""The table worker: a process of its own that does a broker's table work (decoding a commit's batches,
Parquet, the Iceberg commit, schema evolution, dead letters, maintenance), so that none of that Python holds
the broker's GIL while producers wait for their acks (docs/TABLES.md, "Freshness and pacing").

Spawned and fed by the broker (broker/table_worker.py), one request at a time (worker_messages.py). It keeps
the catalog and the tables it loaded; a request that fails forgets its tables, so the next one plans from
what the catalog says. The catalog on the metadata store reaches the store through the broker
(RemotePointers): the worker holds no store connection and no credentials of its own.

A commit's batches are read straight out of the broker's memory (process_vm_readv, `read_parent`): the
copy is the worker's CPU, at its priority, not the broker's. Where the kernel forbids that (found by
`open`'s probe), the broker spools them to a memory file instead.

Dies with its broker (PR_SET_PDEATHSIG) and when its socket ends.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import itertools
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from danube_fast.meta.resources_storage import TableCatalog
from danube_fast.meta.store import Compare, KeyValue
from danube_fast.tables import worker_messages as m
from danube_fast.tables.errors import ModeMismatch, SchemaModeError

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from danube_fast.schema.arrow_values import Resolved
    from danube_fast.tables.maintenance import Done
    from danube_fast.tables.worker_messages import Committed

log = logging.getLogger("danube_fast.tables")
PR_SET_PDEATHSIG = 1
IOV_MAX = 1024


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def read_parent(pid: int, regions: list[tuple[int, int]], into: Any = None) -> Any:
    """The bytes at `regions` ((address, size) in process `pid`) one after another, in `into` (a mutable
    pyarrow buffer at least that large) or a new buffer; the buffer. Raises OSError when the kernel refuses
    or a region is not all there."""
    import pyarrow as pa

    libc = ctypes.CDLL(None, use_errno=True)
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                                      ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]
    total = sum(size for _, size in regions)
    buf = into if into is not None and into.size >= total else pa.allocate_buffer(total)
    at = 0
    for i in range(0, len(regions), IOV_MAX):
        group = regions[i:i + IOV_MAX]
        size = sum(s for _, s in group)
        local = (_Iovec * 1)(_Iovec(buf.address + at, size))
        remote = (_Iovec * len(group))(*(_Iovec(a, s) for a, s in group))
        got = libc.process_vm_readv(pid, local, 1, remote, len(group), 0)
        if got != size:
            errno = ctypes.get_errno() if got < 0 else 0
            raise OSError(errno, f"read {got} of {size} bytes of the broker's memory: {os.strerror(errno)}")
        at += size
    return buf


class StaleSchema(Exception):
    """Records carry a schema version newer than the writer's latest: the broker reads the registry again."""

    def __init__(self, version: int) -> None:
        super().__init__(f"records of schema version {version}")
        self.version = version


class Channel:
    """The worker's end of the socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._ids = itertools.count(1)

    def send(self, message: tuple[Any, ...]) -> None:
        self._sock.sendall(m.encode(message))

    def receive(self) -> tuple[Any, ...] | None:
        return m.receive(self._sock)

    def ask(self, op: str, args: tuple[Any, ...]) -> Any:
        """A call the broker makes for the worker (a pointer store call, REACH); its answer."""
        call_id = next(self._ids)
        self.send((m.POINTER, call_id, op, args))
        reply = self.receive()
        if reply is None:
            raise ConnectionError("the broker closed the table worker's socket")
        kind, got_id, ok, value = reply
        if kind != m.POINTER_REPLY or got_id != call_id:
            raise ConnectionError(f"the broker answered {kind} {got_id} to pointer call {call_id}")
        if not ok:
            raise OSError(f"the metadata store: {value}")
        return value


class RemotePointers:
    """tables/pointers.py's PointerStore, asked of the broker."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    def get(self, key: str) -> KeyValue | None:
        kv: KeyValue | None = self._channel.ask("get", (key,))
        return kv

    def swap(self, key: str, guard: Compare, value: bytes) -> bool:
        return bool(self._channel.ask("swap", (key, guard, value)))

    def delete(self, key: str) -> None:
        self._channel.ask("delete", (key,))

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        kvs: list[KeyValue] = self._channel.ask("get_prefix", (prefix,))
        return kvs


class Worker:
    """The ops a broker may request (OPS), each with keyword arguments."""

    OPS = frozenset({"open", "load", "commit", "maintain", "tables", "drop", "snapshots"})

    def __init__(self, channel: Channel, parent: int, slices: int = 1) -> None:
        """`slices`: the Parquet files a commit's rows of one partition may be encoded into at once."""
        self._channel = channel
        self._parent = parent
        self._slices = slices
        self._location: TableCatalog | None = None
        self._io: dict[str, str] = {}
        self._catalog: Catalog | None = None
        self._tables: dict[tuple[str, str], Table] = {}
        # Commits' batches are read into this one buffer, kept: a new one each time cost the worker its
        # pages again (faulting in 256 MiB took 0.6 s of CPU where a copy into mapped pages took 34 ms).
        self._batches: Any = None

    def forget(self, spec: m.TableSpec | None) -> None:
        if spec is not None:
            self._tables.pop(spec.identifier, None)
            self._tables.pop(dataclasses.replace(spec, dead_letters=True).identifier, None)

    def _open_catalog(self) -> Catalog:
        if self._catalog is None:
            from danube_fast.tables.catalog import open_catalog

            if self._location is None:
                raise RuntimeError("the table worker was not opened")
            self._catalog = open_catalog(self._location, pointers=RemotePointers(self._channel), io=self._io)
        return self._catalog

    def _table(self, spec: m.TableSpec) -> Table:
        table = self._tables.get(spec.identifier)
        if table is None:
            from danube_fast.tables.catalog import load_or_create

            table = load_or_create(self._open_catalog(), spec.namespace, spec.identifier[1], spec.partitioned,
                                   spec.time_partitions, spec.row_group_rows,
                                   "envelope" if spec.dead_letters else spec.mode, spec.compression,
                                   "" if spec.dead_letters else spec.partition_by)
            self._tables[spec.identifier] = table
        return table

    # -- ops ------------------------------------------------------------------------------------------------

    def open(self, location: TableCatalog, io: dict[str, str], probe: tuple[int, bytes]) -> bool:
        """Import the table libraries and open the catalog: before the first commit needs them. Whether the
        broker's memory can be read (`probe`: an address there and the bytes it holds)."""
        from danube_fast.tables import commit, envelope, maintenance, typed  # noqa: F401

        self._location, self._io, self._catalog = location, io, None
        self._open_catalog()
        try:
            return bool(read_parent(self._parent, [(probe[0], len(probe[1]))]).to_pybytes() == probe[1])
        except OSError as e:
            log.info("the broker's memory cannot be read (%s): commits are spooled", e)
            return False

    def load(self, spec: m.TableSpec) -> Committed:
        """The table as the catalog has it now (created when missing)."""
        from danube_fast.tables import commit

        self.forget(spec)
        return commit.state(self._table(spec))

    def commit(self, spec: m.TableSpec, stored: str, topic: str, partition: int, start: int, end: int,
               lengths: list[int], resolved: Resolved | None, asked_version: int, pause_before_commit: bool,
               regions: list[tuple[int, int]] | None = None, spool: str | None = None
               ) -> tuple[Committed, int]:
        """Append the records of `stored`'s offsets [start, end), whose batches (`lengths` long) are at
        `regions` of the broker's memory or one after another in the file `spool`, to the table; in schema
        mode the records that do not decode go to
        the dead-letter table first (commit.append_dead_letters). The state after, and how many went there.
        `pause_before_commit`: the broker armed the crash point between the Parquet files and the commit."""
        import pyarrow as pa

        from danube_fast.tables import commit, partitions, typed
        from danube_fast.tables.envelope import rows_of

        table = self._table(spec)
        columns = None
        if spec.mode == "schema":  # the table's columns first: tablePartitionBy may name them
            if resolved is None:
                raise SchemaModeError("the topic's schema subject was not read yet")
            columns = typed.value_columns(resolved)
            commit.evolve(table, columns, f"{resolved.subject}:{resolved.version}", resolved.format)
        partitions.fit(table, spec.time_partitions, spec.partition_by)  # before any decoding: it may refuse
        with contextlib.ExitStack() as mapped:
            if regions is not None:
                self._batches = read_parent(self._parent, regions, self._batches)
                view = memoryview(self._batches)
            else:
                assert spool is not None
                view = memoryview(mapped.enter_context(pa.memory_map(spool)).read_buffer())
            data, at = [], 0
            for size in lengths:
                data.append(view[at:at + size])
                at += size
            rows = rows_of(data, start, end, topic, partition)  # copies: the views may go
            del data, view
        dead = 0
        if spec.mode == "schema":
            assert resolved is not None and columns is not None
            newest = typed.newest_version(rows)
            if newest is not None and newest > max(resolved.version, asked_version):
                raise StaleSchema(newest)
            decoded = typed.split(rows, resolved, columns)
            if decoded.dead.num_rows:
                dead_letters = self._table(dataclasses.replace(spec, dead_letters=True))
                if commit.append_dead_letters(dead_letters, stored, start, end, decoded.dead):
                    dead = decoded.dead.num_rows
            from pyiceberg.io.pyarrow import schema_to_pyarrow

            rows = typed.conform(decoded.typed, schema_to_pyarrow(table.schema(), include_field_ids=False))
        pause: Callable[[], None] = lambda: None  # noqa: E731
        if pause_before_commit:
            def pause() -> None:
                self._channel.ask(m.REACH, ())
        return commit.append_range(table, stored, start, end, rows, pause, self._slices), dead

    def maintain(self, spec: m.TableSpec, target_bytes: int, min_files: int, keep_ms: int, grace_ms: int,
                 retention_ms: int, retention_bytes: int, group_rows: int) -> tuple[Committed, Done] | None:
        """One maintenance round of the table, and of its dead-letter table when this worker wrote to it;
        the table's state after and what was done to it. None when the table is not loaded."""
        from danube_fast.tables import commit, maintenance

        table = self._tables.get(spec.identifier)
        if table is None:
            return None
        done = maintenance.maintain(table, target_bytes, min_files, keep_ms, grace_ms,
                                    retention_ms=retention_ms, retention_bytes=retention_bytes,
                                 group_rows=group_rows)
        dead_letters = self._tables.get(dataclasses.replace(spec, dead_letters=True).identifier)
        if dead_letters is not None:
            maintenance.maintain(dead_letters, target_bytes, min_files, keep_ms, grace_ms,
                                 retention_ms=retention_ms, retention_bytes=retention_bytes,
                                 group_rows=group_rows)
            dead_letters.refresh()
        return commit.state(table.refresh()), done

    def tables(self) -> list[tuple[str, str]]:
        """Every table of the catalog, as (namespace, table)."""
        catalog = self._open_catalog()
        return [(str(ident[0]), str(ident[-1])) for namespace in catalog.list_namespaces()
                for ident in catalog.list_tables(namespace)]

    def snapshots(self, identifier: tuple[str, str]) -> list[m.SnapshotInfo] | None:
        """The snapshots the table keeps, as the catalog has it now; None when there is no such table."""
        from pyiceberg.exceptions import NoSuchTableError

        from danube_fast.tables.commit import snapshots

        try:
            return snapshots(self._open_catalog().load_table(identifier))
        except NoSuchTableError:
            return None

    def drop(self, identifier: tuple[str, str]) -> int:
        """Drop the table and delete its files (tables/maintenance.py `drop`); how many files."""
        from danube_fast.tables import maintenance

        self._tables.pop(identifier, None)
        return maintenance.drop(self._open_catalog(), identifier)


def failure(e: BaseException) -> m.Failure:
    """What the broker is told of a failed op."""
    from pyiceberg.exceptions import CommitFailedException

    from danube_fast.tables.commit import OffsetsMoved

    error = f"{type(e).__name__}: {e}"
    if isinstance(e, (CommitFailedException, OffsetsMoved)):
        return m.Failure(m.MOVED, error, str(e))
    if isinstance(e, StaleSchema):
        return m.Failure(m.STALE_SCHEMA, error, str(e), e.version)
    if isinstance(e, ModeMismatch):
        return m.Failure(m.MODE_MISMATCH, error, str(e))
    if isinstance(e, SchemaModeError):
        return m.Failure(m.SCHEMA_MODE, error, str(e))
    return m.Failure(m.FAILED, error, str(e))


def serve(channel: Channel, parent: int, slices: int = 1) -> None:
    """Answer requests until the broker closes the socket."""
    worker = Worker(channel, parent, slices)
    while True:
        message = channel.receive()
        if message is None:
            return
        kind, request_id, op, kwargs = message
        if kind != m.REQUEST or op not in Worker.OPS:
            raise ValueError(f"the table worker got {kind} {op!r}")
        try:
            channel.send((m.REPLY, request_id, True, getattr(worker, op)(**kwargs)))
        except Exception as e:  # told to the broker, which records it in the table's status and retries
            worker.forget(kwargs.get("spec"))
            if not isinstance(e, (StaleSchema, ModeMismatch, SchemaModeError)):
                log.debug("table worker: %s failed", op, exc_info=True)
            channel.send((m.REPLY, request_id, False, failure(e)))


def die_with_parent(parent: int) -> None:
    """Be killed when the broker dies (Linux's parent-death signal), even by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the signal was set
        os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m danube_fast.tables.worker")
    parser.add_argument("--fd", type=int, required=True, help="the socket the broker passed")
    parser.add_argument("--parent", type=int, required=True, help="the broker's pid")
    parser.add_argument("--nice", type=int, default=0, help="added to the process's nice value")
    parser.add_argument("--threads", type=int, default=1,
                        help="Arrow's CPU and I/O thread pools' size, and the Parquet files a commit is "
                             "encoded into at once")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s [table worker]: %(message)s")
    die_with_parent(args.parent)
    if args.nice:
        os.nice(args.nice)
    import pyarrow as pa

    # Arrow sizes its pools by the machine's cores: a commit's Parquet encoding would then take every core
    # in bursts, which a nice value does not keep from the broker's threads (docs/TABLES.md).
    pa.set_cpu_count(args.threads)
    pa.set_io_thread_count(args.threads)
    # ConnectionError: the broker went away, nothing to answer.
    with socket.socket(fileno=args.fd) as sock, contextlib.suppress(ConnectionError):
        serve(Channel(sock), args.parent, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())

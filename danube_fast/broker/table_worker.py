"""The broker's side of its table worker process (tables/worker.py; docs/TABLES.md, "Freshness and pacing").

A table commit is mostly Python (pyiceberg's metadata, manifests and validation) and the rest is Arrow and
Parquet work: in the broker's process, every millisecond of that Python is a millisecond a producer's ack
may wait for the GIL. So the work runs in a process of its own, spawned on first need and again if it dies,
and the broker only reads the batches through the topic's log, writes them to a spool file and waits.

- **The batches are not copied by the broker**: the worker reads them straight out of the broker's memory
  (process_vm_readv; the broker names their addresses and keeps them alive until the commit is answered).
  Writing a 256 MiB commit to a memory file instead cost the broker 130 ms of a core per commit, and at
  half of full speed that alone took the producers' ack p99 from 7 ms to 38 ms (a probe at 720 k records/s
  of 256 B, `[tables]` defaults). Where the kernel forbids the read (a seccomp profile, Yama's ptrace scope
  3), found when the worker starts, a commit's batches go to an anonymous memory file (memfd; where there
  is none, a temp file in the data dir, unlinked at once) that the worker maps through
  `/proc/{broker}/fd/{fd}`, written in a thread of the worker's priority. Nothing is left behind however
  either process dies.
- **The metadata store** is the broker's: the catalog on it asks the broker for each pointer call
  (tables/pointers.py), served here on the broker's loop.
- **Priority**: the worker runs at `[tables] worker_nice` (its nice value raised by that much) with Arrow's
  thread pools at `[tables] worker_threads`, so that on a busy machine the broker's and its clients'
  threads get the CPU first. Both measured: docs/TABLES.md, "Freshness and pacing".

Owner: the TableWriter (broker/tables.py), which sends one request at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import logging
import os
import socket
import sys
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from danube_fast.broker import crashpoints
from danube_fast.meta.resources_storage import TableCatalog
from danube_fast.meta.store import MetadataStore
from danube_fast.tables import pointers
from danube_fast.tables import worker_messages as m

log = logging.getLogger("danube_fast.tables")

IOV_BATCH = 512  # buffers per writev (IOV_MAX is 1024 on Linux)
CLOSE_TIMEOUT = 5.0
PR_SET_PTRACER = 0x59616D61  # Yama: let this process (the worker) read the broker's memory
PROBE = b"danube-fast table worker probe"


class WorkerFailed(Exception):
    """An op failed in the worker; `failure.kind` says what the writer does about it."""

    def __init__(self, failure: m.Failure) -> None:
        super().__init__(failure.error)
        self.failure = failure


class WorkerGone(Exception):
    """The worker process exited (or could not start) while a request waited: the next request spawns
    another."""


def spool(chunks: Sequence[memoryview], fallback_dir: str) -> tuple[int, str]:
    """`chunks` one after another in a new anonymous file; its descriptor and a path another process of
    the machine opens it by. Blocking: run it in a thread (writev releases the GIL)."""
    try:
        fd = os.memfd_create("danube-fast-table-commit")
    except (AttributeError, OSError):  # no memfd here: a file of the data dir nobody else can name
        os.makedirs(fallback_dir, exist_ok=True)
        fd, name = tempfile.mkstemp(".batches", dir=fallback_dir)
        os.unlink(name)
    try:
        write_all(fd, chunks)
    except BaseException:
        os.close(fd)
        raise
    return fd, f"/proc/{os.getpid()}/fd/{fd}"


def write_all(fd: int, chunks: Sequence[memoryview]) -> None:
    for i in range(0, len(chunks), IOV_BATCH):
        group = list(chunks[i:i + IOV_BATCH])
        written = os.writev(fd, group)
        for chunk in group:  # a short write (a signal, a full disk that raises next): finish by hand
            if written >= len(chunk):
                written -= len(chunk)
                continue
            rest = chunk[written:]
            while rest:
                rest = rest[os.write(fd, rest):]
            written = 0


class _PyBuffer(ctypes.Structure):  # CPython's Py_buffer (stable ABI since 3.11)
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


def address(view: object) -> int:
    """Where a contiguous buffer's bytes are (the caller keeps the buffer alive while they are read)."""
    buf = _PyBuffer()
    if ctypes.pythonapi.PyObject_GetBuffer(ctypes.py_object(view), ctypes.byref(buf), 0) != 0:
        raise BufferError("not a contiguous buffer")
    try:
        return int(buf.buf or 0)
    finally:
        ctypes.pythonapi.PyBuffer_Release(ctypes.byref(buf))


def _allow_reads_by(pid: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # without Yama: nothing to allow
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PTRACER, pid, 0, 0, 0)


def _lower_priority(nice: int) -> None:
    """Raise the calling thread's nice value by `nice` (Linux: a thread's own priority)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                       os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + nice)


class TableWorker:
    def __init__(self, location: TableCatalog, file_io: dict[str, str], store: MetadataStore,
                 spool_fallback: str, nice: int = 0, threads: int = 1) -> None:
        self._location = location
        self._file_io = file_io
        self._store = store
        self._spool_fallback = spool_fallback  # where commits are spooled without memfd
        self._nice = nice
        self._threads = threads
        # The spool's copy runs at the worker's priority too: a commit's worth of memcpy is a burst of CPU
        # the event loop would otherwise compete with.
        self._spooler = ThreadPoolExecutor(1, "table-spool", initializer=_lower_priority, initargs=(nice,))
        self._lock = asyncio.Lock()  # one request at a time
        self._ids = itertools.count(1)
        self._process: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self.spawned = 0  # processes started, for the status and the tests
        self.reads_memory = False  # the worker reads batches from this process's memory (else: spooled)

    @property
    def pid(self) -> int | None:
        return None if self._process is None or self._process.returncode is not None else self._process.pid

    async def start(self) -> None:
        """Spawn the worker now, unless it runs."""
        async with self._lock:
            if self._writer is None:
                await self._spawn()

    async def call(self, op: str, **kwargs: Any) -> Any:
        """Run `op` (tables/worker.py `Worker`) in the worker; its result. Raises WorkerFailed when the op
        failed there, WorkerGone when the process ended first."""
        async with self._lock:
            if self._writer is None:
                await self._spawn()
            return await self._request(op, kwargs)

    async def commit(self, chunks: Sequence[memoryview], **kwargs: Any) -> Any:
        """The `commit` op with `chunks` (whole record batches) spooled for the worker to read."""
        async with self._lock:
            if self._writer is None:
                await self._spawn()
            lengths = [len(c) for c in chunks]
            if self.reads_memory:  # `chunks` stays referenced, so its memory stays put, until answered
                regions = [(address(c), len(c)) for c in chunks]
                return await self._request("commit", {**kwargs, "regions": regions, "lengths": lengths})
            fd, path = await asyncio.get_running_loop().run_in_executor(self._spooler, spool, chunks,
                                                                        self._spool_fallback)
            try:
                return await self._request("commit", {**kwargs, "spool": path, "lengths": lengths})
            finally:
                os.close(fd)

    async def _request(self, op: str, kwargs: dict[str, Any]) -> Any:
        assert self._writer is not None
        request_id = next(self._ids)
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = done
        try:
            self._writer.write(m.encode((m.REQUEST, request_id, op, kwargs)))
            await self._writer.drain()
            ok, value = await done
        except (ConnectionError, OSError) as e:
            raise WorkerGone(f"the table worker is gone: {e}") from e
        finally:
            self._waiting.pop(request_id, None)
        if not ok:
            raise WorkerFailed(value)
        return value

    async def _spawn(self) -> None:
        mine, theirs = socket.socketpair()
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "danube_fast.tables.worker", "--fd", str(theirs.fileno()),
                "--parent", str(os.getpid()), "--nice", str(self._nice), "--threads", str(self._threads),
                "--log-level", logging.getLevelName(logging.getLogger().getEffectiveLevel()),
                pass_fds=(theirs.fileno(),), stdin=asyncio.subprocess.DEVNULL)
        except OSError as e:
            mine.close()
            raise WorkerGone(f"the table worker could not start: {e}") from e
        finally:
            theirs.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=mine)
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader), name="table worker")
        self.spawned += 1
        _allow_reads_by(self._process.pid)
        probe = PROBE + os.urandom(8)
        self.reads_memory = bool(await self._request("open", {
            "location": self._location, "io": self._file_io, "probe": (address(probe), probe)}))
        log.info("table worker started (pid %d; %s)", self._process.pid,
                 "reads batches from the broker's memory" if self.reads_memory else "batches spooled")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        """Replies to their requests; the worker's pointer calls served. At the end, the waiting request
        fails and the next spawns a new worker."""
        error: BaseException = WorkerGone("the table worker exited")
        try:
            while True:
                header = await reader.readexactly(m.HEADER.size)
                message = m.decode(await reader.readexactly(m.length(header)))
                if message[0] == m.REPLY:
                    _, request_id, ok, value = message
                    waiting = self._waiting.get(request_id)
                    if waiting is not None and not waiting.done():
                        waiting.set_result((ok, value))
                elif message[0] == m.POINTER:
                    await self._pointer(*message[1:])
                else:
                    raise ValueError(f"the table worker sent {message[0]!r}")
        except asyncio.IncompleteReadError:
            pass
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a message that makes no sense: the worker is restarted
            log.error("table worker: %s", e)
            error = WorkerGone(f"the table worker sent what cannot be read: {e}")
        finally:
            await self._ended(error)

    async def _pointer(self, call_id: int, op: str, args: tuple[Any, ...]) -> None:
        if op == m.REACH:
            crashpoints.reach(crashpoints.TABLE_BEFORE_COMMIT)
            result: tuple[bool, Any] = (True, None)
        else:
            try:
                result = (True, await pointers.serve(self._store, op, args))
            except Exception as e:  # the worker's commit fails with it and is retried next pass
                result = (False, f"{type(e).__name__}: {e}")
        assert self._writer is not None
        self._writer.write(m.encode((m.POINTER_REPLY, call_id, *result)))
        await self._writer.drain()

    async def _ended(self, error: BaseException) -> None:
        writer, process = self._writer, self._process
        self._writer = None
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(error)
        if writer is not None:
            writer.close()
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            code = await process.wait()
            if code not in (0, -9):
                log.warning("table worker (pid %d) exited with %d", process.pid, code)

    async def close(self) -> None:
        writer, process, task = self._writer, self._process, self._reader_task
        self._writer = None
        if writer is not None:
            writer.close()  # the worker's socket ends: it exits after the request it is on
        if process is not None and process.returncode is None:
            try:
                await asyncio.wait_for(process.wait(), CLOSE_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._spooler.shutdown(wait=False)

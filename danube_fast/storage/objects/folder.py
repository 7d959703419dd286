"""FolderStore: the object tier of standalone mode, as files under a local folder.

Owner: the folder belongs to the store; its blocking file work runs in the loop's default executor, so the
event loop never waits on the disk. Writes are atomic and durable (STYLE 9): write a temporary file in the
object's directory, check its length, fsync, rename over the key, fsync the directory (and the parent of every
directory the write created). A crash leaves either no object or the whole object, never a torn one; at worst
a stray temporary file, which `list` does not show.

`span` names an object's batches as a byte range of its file, for a connection that sends them with
sendfile (storage/file_span.py), as catch-up reads of the WAL's segment files do.

`put_file` of a file on the same file system (a sealed WAL segment: docs/FORMAT.md, "Sealed segments") is a
hard link, made atomic and durable the same way: the object costs no byte of copy and no disk space while
the WAL keeps the segment. Elsewhere (another file system) the file is copied.

With `direct` (the broker's `[wal] direct_io`) the file is written with O_DIRECT from a reused aligned buffer
(`write_direct` of the WAL's segment primitives), not through the page cache: an upload then costs the
broker a copy into that buffer instead of the kernel's copy into freshly allocated cache pages
(docs/ARCHITECTURE.md, "Direct object writes"). Where the file system has no O_DIRECT (tmpfs), it writes
through the page cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

from danube_fast.errors import ObjectCorrupt, ObjectNotFound, ObjectStoreUnavailable, WalCorrupt
from danube_fast.storage import file_span
from danube_fast.storage.file_span import FileSpan
from danube_fast.storage.objects.format import FOOTER_GUESS, Buffer, footer_length, parse_footer
from danube_fast.storage.objects.store import check_key
from danube_fast.storage.wal_engine import segments

T = TypeVar("T")
_TMP = ".tmp-"


def _iov_max() -> int:
    """Buffers one writev may take (IOV_MAX: 1024 on Linux; POSIX guarantees 16)."""
    try:
        limit = os.sysconf("SC_IOV_MAX")
    except (ValueError, OSError):
        return 16
    return max(limit, 16)


_IOV_MAX = _iov_max()


class FolderStore:
    """Open with `await FolderStore.open(root)`. Implements ObjectStore; the etag is always None."""

    def __init__(self, root: str, *, direct: bool = True) -> None:
        self.root = os.path.abspath(root)
        self.direct = direct

    @classmethod
    async def open(cls, root: str | os.PathLike[str], *, direct: bool = True) -> FolderStore:
        store = cls(os.fspath(root), direct=direct)
        await store._run(lambda: _makedirs_durable(store.root), "open", "")
        return store

    def __repr__(self) -> str:
        return f"FolderStore({self.root!r})"

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    async def _run(self, fn: Callable[[], T], what: str, key: str) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(None, fn)
        except ObjectNotFound:
            raise
        except OSError as e:
            raise _unavailable(what, key, self.root, e) from e

    async def put(self, key: str, data: bytes) -> str | None:
        return await self.put_parts(key, (data,))

    async def put_parts(self, key: str, parts: Sequence[Buffer]) -> str | None:
        path = self._path(key)
        await self._run(lambda: _write_atomic(path, parts, self.direct), "put", key)
        return None

    async def put_file(self, key: str, path: str) -> str | None:
        target = self._path(key)
        await self._run(lambda: _link_atomic(path, target, self.direct), "put", key)
        return None

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        path = self._path(key)
        return await self._run(lambda: _read_range(self.root, path, start, end), "get", key)

    async def span(self, key: str, position: int, offset: int, max_bytes: int, limit: int
                   ) -> tuple[FileSpan, int] | None:
        """Whole batches of the object at `key` from the one holding `offset`, walking from the indexed
        batch at `position`, named in the object's file (file_span.find: at most max_bytes, all below
        `limit`); None when the batch holding `offset` is small (read it instead). Raises ObjectNotFound,
        ObjectCorrupt."""
        path = self._path(key)
        return await self._run(lambda: _span(self.root, path, position, offset, max_bytes, limit), "get", key)

    async def delete(self, key: str) -> None:
        path = self._path(key)

        def unlink() -> None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

        await self._run(unlink, "delete", key)

    async def list(self, prefix: str = "") -> list[str]:
        return await self._run(lambda: _list_keys(self.root, prefix), "list", prefix)

    async def close(self) -> None:
        return None


def _unavailable(what: str, key: str, root: str, e: OSError) -> ObjectStoreUnavailable:
    return ObjectStoreUnavailable(f"object store folder {root}: {what} {key!r} failed: {e.strerror or e}")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _makedirs_durable(path: str) -> None:
    """os.makedirs, with each new directory's entry fsynced in its parent."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
        _fsync_dir(os.path.dirname(directory))


def _publish(path: str, make: Callable[[str], None]) -> None:
    """`make(tmp)` creates the object's bytes, durable, under a temporary name in the object's directory;
    then it is renamed over `path` and the directory fsynced. On a failure the temporary file goes."""
    directory, name = os.path.split(path)
    _makedirs_durable(directory)
    tmp = os.path.join(directory, f".{name}{_TMP}{uuid.uuid4().hex}")
    try:
        make(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def _write_atomic(path: str, parts: Sequence[Buffer], direct: bool = False) -> None:
    def make(tmp: str) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            written = _write_parts(fd, tmp, parts, direct)
            size = os.fstat(fd).st_size
            if size != written:
                raise OSError(f"wrote {written} bytes but the file holds {size}")
            os.fsync(fd)
        finally:
            os.close(fd)

    _publish(path, make)


# A hard link is refused across file systems, by file systems without them, and past a file's link limit.
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP}


def _link_atomic(source: str, path: str, direct: bool) -> None:
    """The file `source` as the object at `path`: a hard link (the source's bytes are durable already),
    published as _write_atomic publishes; a copy where no link can be made."""
    try:
        _publish(path, lambda tmp: os.link(source, tmp))
    except OSError as e:
        if e.errno not in _NO_LINK:
            raise
        with open(source, "rb") as f:
            data = f.read()
        _write_atomic(path, (data,), direct)


def _write_parts(fd: int, path: str, parts: Sequence[Buffer], direct: bool) -> int:
    """The parts into the new empty file `fd` (at `path`): with O_DIRECT when asked and the file system
    takes it, else with writev; the bytes written."""
    if direct:
        try:
            dfd = os.open(path, os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
        except OSError as e:
            if e.errno != errno.EINVAL:  # EINVAL: no O_DIRECT here (tmpfs)
                raise
        else:
            try:
                return segments.write_direct(fd, dfd, list(parts))
            finally:
                os.close(dfd)
    return _write_all(fd, parts)


def _write_all(fd: int, parts: Sequence[Buffer]) -> int:
    """Write the parts one after another with os.writev (no joined copy): at most IOV_MAX buffers a call,
    resumed after a short write (Linux writes at most 2 GiB - 4 KiB a call); the bytes written."""
    views = [view for view in (memoryview(part).cast("B") for part in parts) if view]
    total = sum(len(view) for view in views)
    i = 0
    while i < len(views):
        n = os.writev(fd, views[i : i + _IOV_MAX])
        if n <= 0:
            raise OSError(errno.EIO, f"writev wrote {n} bytes")
        while n:
            if n < len(views[i]):
                views[i] = views[i][n:]
                break
            n -= len(views[i])
            i += 1
    return total


def _list_keys(root: str, prefix: str) -> list[str]:
    """The keys under `root` starting with `prefix`; walks only the folder the prefix's last `/` names."""
    if not os.path.isdir(root):  # gone or unmounted: unavailable, not empty
        raise NotADirectoryError(errno.ENOTDIR, "the object store folder is not a folder", root)
    directory = prefix.rpartition("/")[0]
    top = os.path.join(root, *directory.split("/")) if directory else root

    def failed(e: OSError) -> None:
        if not (e.filename == top and isinstance(e, FileNotFoundError | NotADirectoryError)):
            raise e  # a folder the prefix names may be missing (no such objects); nothing else may fail

    found: list[str] = []
    for dirpath, _dirs, files in os.walk(top, onerror=failed):
        rel = os.path.relpath(dirpath, root)
        base = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        found.extend(base + name for name in files
                     if not (name.startswith(".") and _TMP in name) and (base + name).startswith(prefix))
    return sorted(found)


def _span(root: str, path: str, position: int, offset: int, max_bytes: int, limit: int
          ) -> tuple[FileSpan, int] | None:
    fd = _open(root, path)
    try:
        size = os.fstat(fd).st_size
        tail = os.pread(fd, min(FOOTER_GUESS, size), max(size - FOOTER_GUESS, 0))
        need = footer_length(tail)
        if need > len(tail):
            tail = os.pread(fd, need, size - need)
        body_end = parse_footer(tail).body_end  # the walk must not read the footer as a batch
        try:
            return file_span.find(fd, position, body_end, offset, max_bytes, limit, path)
        except WalCorrupt as e:
            raise ObjectCorrupt(f"object {os.path.relpath(path, root)!r}: {e}") from e
    finally:
        os.close(fd)


def _open(root: str, path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError) as e:
        if os.path.isdir(root):  # else the folder itself is gone (unmounted): the store is unavailable
            raise ObjectNotFound(f"no object {os.path.relpath(path, root)!r} in {root}") from e
        raise


def _read_range(root: str, path: str, start: int | None, end: int | None) -> bytes:
    f = open(_open(root, path), "rb")  # noqa: SIM115 (closed by the with below)
    with f:
        size = os.fstat(f.fileno()).st_size
        lo = 0 if start is None else max(size + start, 0) if start < 0 else min(start, size)
        hi = size if end is None else max(min(end, size), lo)
        f.seek(lo)
        return f.read(hi - lo)

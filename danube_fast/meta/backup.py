"""Metadata backup and restore (docs/METADATA.md#backup-and-restore): every key of a MetadataStore to a file,
and back into an empty one.

The file is JSON lines, ASCII, every line ending in "\\n":

    {"format":"danube-fast-metadata","version":1,"revision":R,"created_at":"...","key_count":N,
     "entries_sha256":"<hex SHA-256 of the bytes of lines 2 to N+1>"}
    {"key":"/...","value_b64":"<standard base64 of the value>"}
    {"key":"/...","value_b64":"...","lease":"<the source store's lease id, as unsigned 64-bit hex>"}
    ...

one line per key in key order (UTF-8 byte order, as both stores list them), taken in one read at revision R,
so the file is one consistent state of the store. `lease` is present only for a key that was under a lease;
its TTL is not recorded, as the MetadataStore protocol can only learn a lease's TTL by refreshing it
(`keep_alive`), which a backup must not do. A restore refuses a file unless the header, the key count, the
checksum and every line check out, before it writes anything.

Leased keys are ephemeral: a broker's registration and the leader key exist only while their broker lives
and keeps its lease. Lease ids belong to the store that granted them, so they are never restored. By
default (`skip_ephemeral=True`) restore leaves these keys out: written without a lease they would never
expire, and the new cluster would take a dead broker for a live one (and assign it topics), or keep a leader
key that no election can replace. With `skip_ephemeral=False` they are written without a lease and listed
in the summary, for an operator who wants to inspect them; deleting them afterwards is the operator's job.

Revisions are not restored: the target numbers its own, and every restored key starts at version 1 with the
create and mod revision of the transaction that wrote it. The header keeps the source revision for reference.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import itertools
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from danube_fast.meta.store import (
    MAX_REQUEST_BYTES,
    MAX_TXN_OPS,
    Compare,
    Get,
    KeyValue,
    MetadataError,
    MetadataStore,
    Put,
    check_txn,
)

FORMAT = "danube-fast-metadata"
VERSION = 1
ALL_KEYS = "/"  # every key of the product is an absolute path
# Our estimate of one entry's share of a restore transaction (its compare and its put), framing included;
# at least the store's own estimate, so that a batch we accept, check_txn accepts.
ENTRY_OVERHEAD_BYTES = 2 * 128
_HEADER_FIELDS = {"format", "version", "revision", "created_at", "key_count", "entries_sha256"}
_ENTRY_FIELDS = {"key", "value_b64", "lease"}
_HEX_LEASE = re.compile(r"[1-9a-f][0-9a-f]{0,15}")  # as encode() writes it: non-zero, no leading zero
U64_MASK = 2**64 - 1
_SHA256 = re.compile(r"[0-9a-f]{64}")


class BackupFileError(MetadataError, ValueError):
    """The file is not a complete, intact metadata backup this version can read. Nothing was written."""

    grpc_code = "INVALID_ARGUMENT"


class StoreNotEmpty(MetadataError):
    """A restore found keys in the target store. Nothing was written."""

    grpc_code = "FAILED_PRECONDITION"

    def __init__(self, message: str, key_count: int) -> None:
        super().__init__(message)
        self.key_count = key_count


class RestoreIncomplete(MetadataError):
    """A restore stopped part way (the store failed, or someone else wrote one of the keys): the first
    `written` keys of the file are in the target, the others are not."""

    grpc_code = "ABORTED"

    def __init__(self, message: str, written: int, total: int) -> None:
        super().__init__(message)
        self.written = written
        self.total = total


@dataclass(frozen=True)
class Entry:
    key: str
    value: bytes
    lease: int = 0  # the lease id in the source store; 0 = none


@dataclass(frozen=True)
class Backup:
    """A parsed, validated backup file."""

    revision: int
    created_at: str
    entries: tuple[Entry, ...]
    path: str = ""  # where it was read from


@dataclass(frozen=True)
class BackupSummary:
    path: str
    revision: int  # the source store's revision the file shows
    key_count: int
    leased_keys: int
    file_bytes: int

    def as_json(self) -> dict[str, object]:
        return {"path": self.path, "revision": self.revision, "key_count": self.key_count,
                "leased_keys": self.leased_keys, "file_bytes": self.file_bytes}


@dataclass(frozen=True)
class RestoreSummary:
    path: str
    source_revision: int
    keys_written: int
    transactions: int
    skipped_ephemeral: tuple[str, ...]  # leased in the source, not written
    unleased_ephemeral: tuple[str, ...]  # leased in the source, written without a lease
    revision: int  # the target store's revision after the restore

    def as_json(self) -> dict[str, object]:
        return {"path": self.path, "source_revision": self.source_revision, "keys_written": self.keys_written,
                "transactions": self.transactions, "skipped_ephemeral": list(self.skipped_ephemeral),
                "unleased_ephemeral": list(self.unleased_ephemeral), "revision": self.revision}


# -------------------------------------------------------------------------------------------------- backup


async def backup(store: MetadataStore, file: str | os.PathLike[str]) -> BackupSummary:
    """Write every key of `store` to `file`, replacing it atomically (tmp, fsync, rename, fsync dir; the file
    is readable by its owner only). One read-only transaction lists the keys, so the file shows the store
    at one revision."""
    path = os.fspath(file)
    result = await store.transaction((), [Get(ALL_KEYS, prefix=True)])
    kvs = result.responses[0]
    if not isinstance(kvs, list):
        raise MetadataError(f"the store answered a range read with {kvs!r}")
    data = encode(kvs, result.revision, datetime.now(UTC).isoformat(timespec="seconds"))
    await asyncio.to_thread(_write_atomically, path, data)
    return BackupSummary(path, result.revision, len(kvs), sum(1 for kv in kvs if kv.lease), len(data))


def encode(kvs: Sequence[KeyValue], revision: int, created_at: str) -> bytes:
    """The file's bytes for `kvs` (in key order) read at `revision`."""
    lines = []
    for kv in kvs:
        entry: dict[str, object] = {"key": kv.key, "value_b64": base64.b64encode(kv.value).decode("ascii")}
        if kv.lease:
            entry["lease"] = f"{kv.lease & U64_MASK:x}"  # etcd's ids are int64 on the wire, any bit set
        lines.append(_dumps(entry))
    body = b"".join(lines)
    header = {"format": FORMAT, "version": VERSION, "revision": revision, "created_at": created_at,
              "key_count": len(kvs), "entries_sha256": hashlib.sha256(body).hexdigest()}
    return _dumps(header) + body


def _dumps(obj: dict[str, object]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("ascii") + b"\n"


def _write_atomically(path: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if os.fstat(f.fileno()).st_size != len(data):
                raise OSError(f"{tmp} holds {os.fstat(f.fileno()).st_size} bytes after writing {len(data)}")
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)


# ------------------------------------------------------------------------------------------------- restore


async def load(file: str | os.PathLike[str]) -> Backup:
    """Read and check a backup file whole (BackupFileError), without touching any store."""
    path = os.fspath(file)
    return decode(await asyncio.to_thread(_read, path), path)


async def restore(store: MetadataStore, source: str | os.PathLike[str] | Backup, *,
                  skip_ephemeral: bool = True, on_written: Callable[[int], object] | None = None
                  ) -> RestoreSummary:
    """Write the keys of a backup (a file, or what `load` made of one) into `store`, which must hold no key.

    Raises BackupFileError (the file is incomplete, corrupt or of another format) or StoreNotEmpty before
    writing anything. Writes in transactions of at most MAX_TXN_OPS keys and MAX_REQUEST_BYTES, each put
    guarded by "the key does not exist", so a key someone else creates meanwhile is never overwritten; a
    failure part way raises RestoreIncomplete, and the target must be emptied before a retry. See the
    module docstring for leased keys (`skip_ephemeral`) and revisions. `on_written(n)` hears of each
    transaction's n keys (a progress bar)."""
    parsed = source if isinstance(source, Backup) else await load(source)
    present = await store.get_prefix(ALL_KEYS)
    if present:
        raise StoreNotEmpty(f"the target store already holds {len(present)} key(s) (first "
                            f"{present[0].key!r}): restore writes only into an empty store", len(present))
    ephemeral = tuple(e.key for e in parsed.entries if e.lease)
    entries = [e for e in parsed.entries if not (skip_ephemeral and e.lease)]
    written = transactions = 0
    revision = await store.current_revision()
    for batch in _batches(entries):
        try:
            result = await store.transaction([Compare(e.key, "version", "==", 0) for e in batch],
                                             [Put(e.key, e.value) for e in batch])
        except MetadataError as e:
            raise RestoreIncomplete(f"restore stopped after {written} of {len(entries)} keys: {e}; empty the "
                                    f"target store before retrying", written, len(entries)) from e
        if not result.succeeded:
            raise RestoreIncomplete(
                f"restore stopped after {written} of {len(entries)} keys: another client created one of the "
                f"keys {batch[0].key!r} to {batch[-1].key!r} meanwhile; empty the target store before "
                f"retrying",
                written, len(entries))
        written += len(batch)
        transactions += 1
        revision = result.revision
        if on_written is not None:
            on_written(len(batch))
    return RestoreSummary(parsed.path, parsed.revision, written, transactions,
                          ephemeral if skip_ephemeral else (), () if skip_ephemeral else ephemeral, revision)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _batches(entries: Sequence[Entry]) -> Iterator[list[Entry]]:
    batch: list[Entry] = []
    size = 0
    for entry in entries:
        cost = 2 * len(entry.key.encode()) + len(entry.value) + ENTRY_OVERHEAD_BYTES
        if batch and (len(batch) == MAX_TXN_OPS or size + cost > MAX_REQUEST_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(entry)
        size += cost
    if batch:
        yield batch


# -------------------------------------------------------------------------------------------------- decode


def decode(data: bytes, path: str = "") -> Backup:
    """Parse and check a whole backup file; BackupFileError names the first problem and its line."""
    header_line, newline, body = data.partition(b"\n")
    if not newline:
        raise BackupFileError("the file has no complete header line: it is empty, truncated or not a "
                              "danube-fast metadata backup")
    header = _object(header_line, 1)
    if header.get("format") != FORMAT:
        raise BackupFileError(f"line 1: not a danube-fast metadata backup (format {header.get('format')!r})")
    if header.get("version") != VERSION:
        raise BackupFileError(f"line 1: backup format version {header.get('version')!r} is not supported "
                              f"(this version reads {VERSION})")
    _only(header, _HEADER_FIELDS, 1)
    revision = _count(header, "revision", 1)
    key_count = _count(header, "key_count", 1)
    created_at, checksum = header.get("created_at"), header.get("entries_sha256")
    if not isinstance(created_at, str):
        raise BackupFileError("line 1: created_at is missing or not a string")
    if not isinstance(checksum, str) or not _SHA256.fullmatch(checksum):
        raise BackupFileError("line 1: entries_sha256 is missing or not 64 lowercase hex digits")
    lines = body.split(b"\n")
    if lines.pop():  # the text after the last newline: empty in a complete file
        raise BackupFileError(f"line {len(lines) + 2} is cut short: the file is truncated")
    if len(lines) != key_count:
        raise BackupFileError(f"the header announces {key_count} key(s) but the file holds {len(lines)} "
                              f"line(s) after it: the file is truncated or corrupt")
    if hashlib.sha256(body).hexdigest() != checksum:
        raise BackupFileError("the entries do not match the header's entries_sha256: the file is corrupt")
    entries = tuple(_entry(line, n) for n, line in enumerate(lines, 2))
    for n, (before, after) in enumerate(itertools.pairwise(entries), 3):
        if before.key.encode() >= after.key.encode():
            raise BackupFileError(f"line {n}: key {after.key!r} is not after {before.key!r}: keys must be "
                                  f"unique and in order")
    return Backup(revision, created_at, entries, path)


def _object(line: bytes, n: int) -> dict[str, object]:
    try:
        obj = json.loads(line, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise BackupFileError(f"line {n} is not valid JSON: {e}") from e
    if not isinstance(obj, dict):
        raise BackupFileError(f"line {n} is not a JSON object")
    return obj


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _only(obj: dict[str, object], allowed: set[str], n: int) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise BackupFileError(f"line {n}: unknown field(s) {', '.join(unknown)}")


def _count(obj: dict[str, object], name: str, n: int) -> int:
    value = obj.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BackupFileError(f"line {n}: {name} is missing or not a non-negative integer")
    return value


def _entry(line: bytes, n: int) -> Entry:
    obj = _object(line, n)
    _only(obj, _ENTRY_FIELDS, n)
    key, value_b64, lease = obj.get("key"), obj.get("value_b64"), obj.get("lease")
    if not isinstance(key, str):
        raise BackupFileError(f"line {n}: key is missing or not a string")
    if not isinstance(value_b64, str):
        raise BackupFileError(f"line {n}: value_b64 is missing or not a string")
    if "lease" in obj and not (isinstance(lease, str) and _HEX_LEASE.fullmatch(lease)):
        raise BackupFileError(f"line {n}: lease {lease!r} is not a non-zero lease id in lowercase hex")
    try:
        value = base64.b64decode(value_b64, validate=True)
    except (binascii.Error, ValueError) as e:
        raise BackupFileError(f"line {n}: value_b64 of key {key!r} is not valid base64: {e}") from e
    try:  # the key is valid, and key and value fit in one restore transaction
        check_txn([Compare(key, "version", "==", 0)], [Put(key, value)], ())
    except (MetadataError, TypeError) as e:
        raise BackupFileError(f"line {n}: {e}") from e
    return Entry(key, value, int(lease, 16) if isinstance(lease, str) else 0)

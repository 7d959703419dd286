"""The MetadataStore protocol: what the broker needs from etcd, and what the embedded store provides too.

Semantics follow etcd v3 (one global revision counter; per key create_revision, mod_revision, version;
leases; transactions; watches ordered by revision and resumable from one). Both implementations pass the
contract suite in tests/contract/.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from danube_fast.errors import DanubeError

MAX_REQUEST_BYTES = 1536 * 1024  # etcd's default --max-request-bytes: the limit of one put or transaction
# A value of exactly MAX_REQUEST_BYTES is refused by etcd once the key and framing are added ("request is too
# large", measured on etcd 3.4.23), so the value limit keeps 8 KiB of headroom for them.
MAX_VALUE_BYTES = MAX_REQUEST_BYTES - 8 * 1024
MAX_TXN_OPS = 128  # etcd's default --max-txn-ops: per compare list and per branch
_OP_OVERHEAD = 64  # protobuf framing per operation, rounded up; counted against MAX_REQUEST_BYTES


class MetadataError(DanubeError):
    """A metadata operation failed."""


class MetadataUnavailable(MetadataError):
    """The store cannot do it now: etcd down or partitioned, or the store's disk full, read-only, locked or
    failing (the subclasses below). Try again later; reads may still be served from a LocalCache."""

    retriable = True
    grpc_code = "UNAVAILABLE"


class MetadataStoreFull(MetadataUnavailable):
    """No room for the write: the embedded store's disk is full, or etcd reached its space quota (its NOSPACE
    alarm). Nothing of the write was kept and reads still work; writes work again once space is freed (etcd:
    compact, defragment, then disarm the alarm)."""


class MetadataReadOnly(MetadataUnavailable):
    """The embedded store's file or file system is read-only. Reads may still work; writes work again once
    it is writable (the file system remounted read-write)."""


class MetadataRefused(MetadataError):
    """The store refused this client: etcd's TLS handshake failed (this client does not trust etcd's
    certificate, or etcd did not accept this client's), or etcd's authentication refused the user or its
    password, or a call without one. A setting is wrong on one side: trying again does not help. The broker
    cannot reach its metadata, so callers of the broker see UNAVAILABLE."""

    grpc_code = "UNAVAILABLE"


class MetadataCorrupt(MetadataError):
    """The embedded store's file is not a SQLite database or is damaged: restore it from a backup."""

    grpc_code = "DATA_LOSS"


class InvalidKey(MetadataError, ValueError):
    grpc_code = "INVALID_ARGUMENT"


class ValueTooLarge(MetadataError, ValueError):
    grpc_code = "INVALID_ARGUMENT"


class BadValue(MetadataError, ValueError):
    """A stored value is not the JSON its key holds (not JSON, or a field missing or of the wrong type)."""

    grpc_code = "INVALID_ARGUMENT"


class InvalidTransaction(MetadataError, ValueError):
    """Too many ops, a key put twice (or put and deleted) in one branch, or a compare of the wrong type."""

    grpc_code = "INVALID_ARGUMENT"


class InvalidRevision(MetadataError, ValueError):
    """A compaction asked for a revision the store has not reached."""

    grpc_code = "OUT_OF_RANGE"


class Compacted(MetadataError):
    """A watch asked to resume from a revision the store no longer keeps history for: resync instead."""

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


class LeaseNotFound(MetadataError):
    """The lease expired or was revoked."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


@dataclass(frozen=True)
class WatchEvent:
    type: Literal["put", "delete"]
    key: str
    value: bytes  # empty for deletes
    revision: int  # the mod_revision of the change
    prev_value: bytes | None = None
    # For puts, the key's state after the change (as etcd's event carries it); 0 for deletes.
    create_revision: int = 0
    version: int = 0
    lease: int = 0


@dataclass(frozen=True)
class Compare:
    """A transaction guard: `target` of `key` compared with `value` by `op`.

    target "value" compares bytes; "version", "create_revision", "mod_revision" compare ints. A missing key
    has version 0, create_revision 0 and mod_revision 0 (etcd's rule), so `Compare(k, "version", "==", 0)`
    means "k does not exist".

    `prefix`: every key under `key` must pass (etcd's range compare); with none, a missing key is compared,
    so `Compare(p, "version", "==", 0, prefix=True)` means "no key under p" (a value compare fails).
    """

    key: str
    target: Literal["value", "version", "create_revision", "mod_revision"]
    op: Literal["==", "!=", "<", ">"]
    value: bytes | int
    prefix: bool = False


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True)
class Delete:
    key: str
    prefix: bool = False


@dataclass(frozen=True)
class Get:
    key: str
    prefix: bool = False


Op = Put | Delete | Get


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # store revision after the transaction
    responses: list[list[KeyValue] | int | None] = field(default_factory=list)
    # per op of the branch that ran: list[KeyValue] for Get, number deleted for Delete, None for Put


@runtime_checkable
class MetadataStore(Protocol):
    """Keys are absolute paths ("/cluster/leader"); values are bytes (JSON for typed resources)."""

    async def get(self, key: str) -> KeyValue | None: ...

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        """Sorted by key."""
        ...

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Returns the new revision."""
        ...

    async def delete(self, key: str) -> bool:
        """True if the key existed."""
        ...

    async def delete_prefix(self, prefix: str) -> int:
        """Number of keys deleted."""
        ...

    async def transaction(self, compare: Sequence[Compare], success: Sequence[Op],
                          failure: Sequence[Op] = ()) -> TxnResult: ...

    def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        """Events for keys under prefix, in revision order. start_revision 0 = from now; otherwise every
        change at or after that revision first. Raises Compacted when that history is gone. Iteration ends
        only when the consumer stops; a lost connection is resumed internally from the last revision seen,
        or raises MetadataUnavailable if the store stays unreachable."""
        ...

    async def current_revision(self) -> int: ...

    async def grant_lease(self, ttl_seconds: int) -> int:
        """A new lease id; keys put under it are deleted when it expires or is revoked."""
        ...

    async def keep_alive(self, lease: int) -> int:
        """Refresh once; returns the remaining TTL. Raises LeaseNotFound if it already expired."""
        ...

    async def revoke_lease(self, lease: int) -> None:
        """Deletes the lease's keys (one revision). LeaseNotFound if it already expired or was revoked."""
        ...

    async def compact(self, revision: int) -> None:
        """Drop the history before `revision`: a watch starting earlier then raises Compacted. Compacting
        to a revision at or below the last compaction does nothing; beyond the current one raises
        InvalidRevision."""
        ...

    async def close(self) -> None: ...


def check_key(key: str) -> bytes:
    """The key (or prefix) as UTF-8 bytes; InvalidKey unless it is a non-empty str starting with "/" and
    holding no NUL."""
    if not isinstance(key, str) or not key.startswith("/") or "\0" in key:
        raise InvalidKey(f"metadata keys are non-empty paths starting with '/' and without NUL, not {key!r}")
    try:
        return key.encode()
    except UnicodeEncodeError as e:
        raise InvalidKey(f"metadata key {key!r} is not valid Unicode") from e


def check_value(value: bytes) -> None:
    if not isinstance(value, bytes):
        raise TypeError(f"metadata values are bytes, not {type(value).__name__}")
    if len(value) > MAX_VALUE_BYTES:
        raise ValueTooLarge(f"a metadata value is {len(value)} bytes, over the limit of {MAX_VALUE_BYTES}")


def prefix_range_end(prefix: bytes) -> bytes:
    """The first key after every key starting with `prefix` (etcd's range_end for a prefix)."""
    end = bytearray(prefix)
    while end and end[-1] == 0xFF:
        end.pop()
    if not end:
        return b"\0"  # etcd: every key from `prefix` on; unreachable for UTF-8 keys, which hold no 0xFF
    end[-1] += 1
    return bytes(end)


def check_txn(compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> None:
    """Refuse, before anything is written, what etcd refuses: see InvalidTransaction, InvalidKey,
    ValueTooLarge. Both stores call it, so both refuse the same requests."""
    if max(len(compare), len(success), len(failure)) > MAX_TXN_OPS:
        raise InvalidTransaction(f"a transaction holds at most {MAX_TXN_OPS} compares and ops per branch")
    size = 0
    for c in compare:
        size += len(check_key(c.key)) + _OP_OVERHEAD
        if c.op not in ("==", "!=", "<", ">"):
            raise InvalidTransaction(f"unknown compare operator {c.op!r}")
        if c.target == "value":
            if not isinstance(c.value, bytes):
                raise InvalidTransaction(f"a value compare on {c.key!r} needs bytes, not {c.value!r}")
            size += len(c.value)
        elif c.target not in ("version", "create_revision", "mod_revision"):
            raise InvalidTransaction(f"unknown compare target {c.target!r}")
        elif not isinstance(c.value, int) or isinstance(c.value, bool):
            raise InvalidTransaction(f"a {c.target} compare on {c.key!r} needs an int, not {c.value!r}")
    for branch in (success, failure):
        size += _check_branch(branch)
    if size > MAX_REQUEST_BYTES:
        raise ValueTooLarge(f"a transaction of about {size} bytes is over the limit of {MAX_REQUEST_BYTES}")


def _check_branch(ops: Sequence[Op]) -> int:
    puts: set[bytes] = set()
    deletes: list[tuple[bytes, bytes | None]] = []  # (start, end) with end None for one key
    size = 0
    for op in ops:
        key = check_key(op.key)
        size += len(key) + _OP_OVERHEAD
        if isinstance(op, Put):
            check_value(op.value)
            size += len(op.value)
            if key in puts:
                raise InvalidTransaction(f"key {op.key!r} is put twice in one transaction branch")
            puts.add(key)
        elif isinstance(op, Delete):
            deletes.append((key, prefix_range_end(key) if op.prefix else None))
        elif not isinstance(op, Get):
            raise InvalidTransaction(f"unknown transaction op {op!r}")
    for start, end in deletes:
        if any(k == start if end is None else start <= k < end for k in puts):
            raise InvalidTransaction(f"a key under {start.decode()!r} is put and deleted in one branch")
    return size

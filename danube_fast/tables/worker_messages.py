"""What a broker and its table worker process say to each other (docs/TABLES.md, "Freshness and pacing").

The broker (broker/table_worker.py) spawns the worker (tables/worker.py) and talks to it on a Unix socket
pair: each message is a pickled tuple after its length (8 bytes, little-endian). Pickle is safe here: both
ends run the same installed package and the socket is the broker's own, never a network peer's. Record
batches do not travel on the socket: the broker names their addresses in its memory (or a spool file).
The broker unpickles the replies on its event loop: the types they hold are defined in modules that import
nothing heavy (this one, tables/maintenance.py).

    broker -> worker   (REQUEST, id, op, kwargs)       an op of tables/worker.py `Worker`
                       (POINTER_REPLY, id, ok, value)  the answer to a pointer store call
    worker -> broker   (REPLY, id, ok, value)          ok: the op's result; not ok: a Failure
                       (POINTER, id, op, args)         a PointerStore call (tables/pointers.py) or REACH

One request at a time: the broker sends the next once the last is answered, and the worker makes its
pointer calls one at a time while it works on it.
"""

from __future__ import annotations

import pickle
import socket
import struct
from dataclasses import dataclass
from typing import Any

HEADER = struct.Struct("<Q")
MAX_MESSAGE = 64 * 1024 * 1024  # messages hold names, offsets and table states: far below this

REQUEST = "request"
REPLY = "reply"
POINTER = "pointer"
POINTER_REPLY = "pointer_reply"
REACH = "reach"  # a POINTER op: the worker is at a crash point the broker armed (broker/crashpoints.py)

# Failure kinds: what the broker does about a failed op
MOVED = "moved"  # another commit landed first, or the table holds other offsets: plan again from the table
STALE_SCHEMA = "stale_schema"  # records of a schema version newer than the writer's: read the registry
MODE_MISMATCH = "mode_mismatch"  # the table was written in another table mode: stop it
SCHEMA_MODE = "schema_mode"  # the topic's schema cannot type a table yet: wait
FAILED = "failed"  # anything else (the catalog, the object store, a disk): retry next pass


@dataclass(frozen=True)
class Failure:
    kind: str
    error: str  # "TypeName: message", as the table's status shows it
    message: str  # the message alone
    version: int = 0  # STALE_SCHEMA: the records' version


@dataclass(frozen=True)
class Committed:
    """What a table holds after a commit (a reply the broker unpickles: defined here, where unpickling it
    imports nothing heavy; the broker's event loop once stalled 70 ms importing pyarrow for it)."""

    offsets: dict[str, int]
    metadata_location: str
    files: int
    bytes: int
    partitioning: str = "hour"  # the table's current spec as the status shows it (tables/partitions.py)


@dataclass(frozen=True)
class SnapshotInfo:
    """One snapshot a table keeps (admin tables snapshots, pyspark_danube.table_snapshots)."""

    snapshot_id: int
    committed_at_ms: int
    operation: str  # append; overwrite (compaction) or delete (retention)
    offsets: dict[str, int]  # stored topic -> the next offset the table lacked then (its danube.offsets)
    records: int  # the table's totals then
    files: int


@dataclass(frozen=True)
class TableSpec:
    """Which table a request is about, and how to create it when it is missing."""

    namespace: str
    base: str  # the topic's (base) name: the table's
    partitioned: bool
    mode: str  # envelope or schema
    time_partitions: str  # the policy's tablePartitioning: hour, day, month or none
    row_group_rows: int
    compression: str = "zstd"
    partition_by: str = ""  # the policy's tablePartitionBy, canonical (meta/table_partitions.py)
    dead_letters: bool = False  # the topic's dead-letter table (envelope form) instead

    @property
    def identifier(self) -> tuple[str, str]:
        from danube_fast.tables.catalog import DEAD_LETTER_SUFFIX

        return self.namespace, self.base + DEAD_LETTER_SUFFIX if self.dead_letters else self.base


def encode(message: tuple[Any, ...]) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload)) + payload


def decode(payload: bytes) -> tuple[Any, ...]:
    message = pickle.loads(payload)
    if not isinstance(message, tuple) or not message:
        raise ValueError(f"a table worker message is a tuple, not {type(message).__name__}")
    return message


def length(header: bytes) -> int:
    (size,) = HEADER.unpack(header)
    if size > MAX_MESSAGE:
        raise ValueError(f"a table worker message of {size} bytes (at most {MAX_MESSAGE})")
    return int(size)


def receive(sock: socket.socket) -> tuple[Any, ...] | None:
    """The next message on a blocking socket; None at its end."""
    header = _exactly(sock, HEADER.size)
    if header is None:
        return None
    payload = _exactly(sock, length(header))
    if payload is None:
        raise ConnectionError("the table worker's socket ended inside a message")
    return decode(payload)


def _exactly(sock: socket.socket, size: int) -> bytes | None:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            if got == 0:
                return None
            raise ConnectionError("the table worker's socket ended inside a message")
        got += n
    return bytes(buf)

# Typed Python view of danube_fast.codec._frames (and its pure-Python twin danube_fast.codec._frames_py).
# The byte layout is documented at the top of _frames.pyx and in docs/FORMAT.md.
from collections.abc import Iterable, Iterator, Sequence
from typing import Literal, overload

import pyarrow as pa
from typing_extensions import Buffer

MAGIC: int
VERSION: int
HEADER_SIZE: int
LAYOUT: dict[str, int]
MAX_BATCH_BYTES: int
COMPRESSIONS: tuple[str, ...]
ARROW_SCHEMA: pa.Schema  # built on first use (module __getattr__), as arrow_schema() returns it
def arrow_schema() -> pa.Schema: ...

class Record:
    payload: bytes
    publish_time: int
    request_id: int
    routing_key: str | None
    attributes: dict[str, str] | None
    schema_id: int | None
    schema_version: int | None
    offset: int
    def __init__(
        self,
        payload: bytes,
        publish_time: int = 0,
        request_id: int = 0,
        routing_key: str | None = None,
        attributes: dict[str, str] | None = None,
        schema_id: int | None = None,
        schema_version: int | None = None,
        offset: int = -1,
    ) -> None: ...

class BatchHeader:
    position: int
    base_offset: int
    length: int
    crc: int
    record_count: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_name: str
    broker_addr: str
    compression: str
    raw_size: int
    session: int
    sequence: int
    @property
    def last_offset(self) -> int: ...
    @property
    def end(self) -> int: ...

def crc32c(data: Buffer, value: int = 0) -> int: ...
def encode_batch(
    records: Sequence[Record],
    *,
    producer_id: int = 0,
    producer_name: str = "",
    broker_addr: str = "",
    base_offset: int = 0,
    compression: str | None = "none",
    level: int | None = None,
    session: int = 0,
    sequence: int = 0,
) -> bytes: ...
@overload
def encode_payloads(
    payloads: Sequence[bytes],
    *,
    publish_time: int = 0,
    producer_id: int = 0,
    producer_name: str = "",
    broker_addr: str = "",
    base_offset: int = 0,
    compression: str | None = "none",
    level: int | None = None,
    session: int = 0,
    sequence: int = 0,
    room: Literal[0] = 0,
) -> bytes: ...
@overload
def encode_payloads(
    payloads: Sequence[bytes],
    *,
    publish_time: int = 0,
    producer_id: int = 0,
    producer_name: str = "",
    broker_addr: str = "",
    base_offset: int = 0,
    compression: str | None = "none",
    level: int | None = None,
    session: int = 0,
    sequence: int = 0,
    room: int,
) -> bytes | memoryview: ...
def span(buf: Buffer) -> tuple[int, int]: ...
def join_after_room(chunks: Iterable[Buffer], room: int) -> memoryview: ...
def fill_room(data: Buffer, head: Buffer) -> bytes | None: ...
def stamp_base_offset(buf: Buffer, base_offset: int, position: int = 0) -> None: ...
def parse_header(buf: Buffer, position: int = 0) -> BatchHeader: ...
def verify_batch(buf: Buffer, position: int = 0) -> BatchHeader: ...
def scan_batches(buf: Buffer, verify: bool = True) -> list[BatchHeader]: ...
def iter_records(buf: Buffer, verify: bool = True) -> Iterator[Record]: ...
def decode_records(buf: Buffer, verify: bool = True) -> list[Record]: ...
def decode_arrow(buf: Buffer, verify: bool = True) -> pa.RecordBatch: ...
def decode_arrow_chunks(bufs: Iterable[Buffer], verify: bool = True) -> pa.RecordBatch: ...

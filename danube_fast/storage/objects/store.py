"""The ObjectStore protocol (S3 or a local folder) and object naming (`connect.open_object_store(url)` opens
a store).

Every external dependency sits behind a small Protocol with a real and a local implementation, and one test
suite runs over both (STYLE 7): `S3Store` (aiobotocore) and `FolderStore`. Errors are the project's:
`ObjectStoreUnavailable` (retriable: unreachable, 5xx, timeouts, I/O errors), `ObjectNotFound`, and
`ObjectStoreError` for what retrying will not fix.

Object keys are relative to the store's root (the S3 key prefix or the folder): `{ns}/{topic}/{object_id}`
with `object_id = data-{start}-{end}.dnb1` (docs/METADATA.md#storage-keys). Metadata paths are not built here:
they are `danube_fast.meta.keys`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from danube_fast.errors import ObjectStoreError
from danube_fast.storage.objects.format import FOOTER_GUESS, Buffer, Footer, footer_length, parse_footer

OBJECT_SUFFIX = ".dnb1"


@runtime_checkable
class ObjectStore(Protocol):
    """A flat namespace of immutable objects. Keys are `/`-separated relative paths without empty, `.` or
    `..` components. Owner: whoever opened it; one store may serve many topics' uploaders and readers
    concurrently (every method is safe to call from concurrent tasks on the event loop that opened it)."""

    async def put(self, key: str, data: bytes) -> str | None:
        """Store `data` under `key` durably (replacing any object there) before returning; the store's etag
        (S3's, without quotes), or None when it has none (a folder)."""
        ...

    async def put_parts(self, key: str, parts: Sequence[Buffer]) -> str | None:
        """`put` of the concatenation of `parts`, which the store may write without joining them (a folder
        writes them with writev; S3 takes one body, so it joins them). The parts must not change until
        this returns."""
        ...

    async def put_file(self, key: str, path: str) -> str | None:
        """`put` of the file at `path` as it is, a file that never changes (a sealed WAL segment, which is a
        whole object: docs/FORMAT.md, "Sealed segments"). A folder on the same file system links it: no
        byte is copied."""
        ...

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes [start, end) of the object, clipped to its size (a range past the end gives b""). A negative
        `start` counts from the end (`start=-n`: the last n bytes, the whole object if it is shorter).
        ObjectNotFound if there is no such object."""
        ...

    async def delete(self, key: str) -> None:
        """Remove the object; deleting a missing object is not an error (S3 semantics)."""
        ...

    async def list(self, prefix: str = "") -> list[str]:
        """The keys starting with `prefix` (a plain string prefix, as S3's), sorted."""
        ...

    async def close(self) -> None: ...


async def read_footer(store: ObjectStore, key: str) -> Footer:
    """The footer of the object at `key`: one ranged GET of its tail, a second when the footer is longer
    (an object with a very large index). Raises ObjectNotFound, ObjectCorrupt, ObjectStoreUnavailable."""
    tail = await store.get(key, -FOOTER_GUESS)
    need = footer_length(tail)
    if need > len(tail):
        tail = await store.get(key, -need)
    return parse_footer(tail)


def object_id(start_offset: int, end_offset: int) -> str:
    """`data-{start}-{end}.dnb1`: the descriptor's `object_id`, the file name of the object."""
    return f"data-{start_offset}-{end_offset}{OBJECT_SUFFIX}"


def object_key(namespace: str, topic: str, object_id: str) -> str:
    """The store key of a topic's object: `{ns}/{topic}/{object_id}`."""
    return f"{check_key(namespace)}/{check_key(topic)}/{check_key(object_id)}"


def topic_objects_prefix(namespace: str, topic: str) -> str:
    """The store prefix of one topic's objects (for listing them without the metadata store)."""
    return f"{check_key(namespace)}/{check_key(topic)}/"


def check_key(key: str) -> str:
    """`key` if it is a valid relative object key; ObjectStoreError otherwise (keys come from topic names,
    which must not walk out of a folder store's root)."""
    if not isinstance(key, str) or not key or key.startswith("/") or "\0" in key or \
            any(part in ("", ".", "..") for part in key.split("/")):
        raise ObjectStoreError(f"invalid object key {key!r}: a relative path without empty, '.' or '..' "
                               f"parts")
    return key

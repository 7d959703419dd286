"""What the catalog on the metadata store (meta_catalog.py) needs of the store, as synchronous calls:
pyiceberg is synchronous, the store is async and bound to its event loop.

Two ways to reach it: `LoopPointers` sends each call to the loop from another thread of the same process (a
reader, the tests); the table worker process (tables/worker.py) asks the broker that spawned it over its
socket, so the worker needs no store connection, credentials or election state of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from danube_fast.meta.store import Compare, KeyValue, MetadataStore, Put

Call = Callable[[Coroutine[Any, Any, Any]], Any]


class PointerStore(Protocol):
    def get(self, key: str) -> KeyValue | None: ...

    def swap(self, key: str, guard: Compare, value: bytes) -> bool:
        """Put `value` at `key` only where `guard` holds; whether it did."""
        ...

    def delete(self, key: str) -> None: ...

    def get_prefix(self, prefix: str) -> list[KeyValue]: ...


class LoopPointers:
    """A PointerStore over `store`, each call run on the store's loop by `call` (never from that loop's own
    thread: it would wait for itself)."""

    def __init__(self, store: MetadataStore, call: Call) -> None:
        self._store = store
        self._call = call

    def get(self, key: str) -> KeyValue | None:
        kv: KeyValue | None = self._call(self._store.get(key))
        return kv

    def swap(self, key: str, guard: Compare, value: bytes) -> bool:
        return bool(self._call(self._store.transaction([guard], [Put(key, value)], [])).succeeded)

    def delete(self, key: str) -> None:
        self._call(self._store.delete(key))

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        kvs: list[KeyValue] = self._call(self._store.get_prefix(prefix))
        return kvs


async def serve(store: MetadataStore, op: str, args: tuple[Any, ...]) -> Any:
    """One PointerStore call made on the store's own loop (the broker's side of the table worker's)."""
    if op == "get":
        return await store.get(args[0])
    if op == "swap":
        key, guard, value = args
        return (await store.transaction([guard], [Put(key, value)], [])).succeeded
    if op == "delete":
        await store.delete(args[0])
        return None
    if op == "get_prefix":
        return await store.get_prefix(args[0])
    raise ValueError(f"no pointer store call {op!r}")

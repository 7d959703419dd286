"""One asyncio lock per key, for work that looks state up, awaits, then changes it (creating a topic or a
producer): two coroutines for the same key take turns and the second finds what the first made, while
different keys go on at once. A key's lock lives only while someone holds or waits for it.

Owner: the event loop; each user (TopicRegistry, Subscriptions) keeps its own KeyedLocks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable


class KeyedLocks:
    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}  # key -> (lock, holders and waiters)

    @contextlib.asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            _, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __contains__(self, key: Hashable) -> bool:
        """Someone holds or waits for `key`'s lock."""
        return key in self._locks

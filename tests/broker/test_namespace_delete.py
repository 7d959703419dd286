"""DeleteNamespace against a topic created meanwhile (broker/namespaces.py `delete`): its check of the
topics is made again as a compare in its write, so a topic whose creation landed after the cache looked
makes the delete fail instead of being left without its namespace. A cache that has not seen the topic yet
is the fault a real cache gives only by timing: here it is one that stopped following the store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from danube_fast.broker.namespaces import Namespaces
from danube_fast.errors import ApiError
from danube_fast.meta import keys
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import Policy
from danube_fast.meta.store import Put

Run = Callable[..., Any]


def test_a_topic_created_after_the_cache_looked_fails_the_namespace_delete(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        store = await EmbeddedStore.open(tmp_path / "meta.db")
        cache = await LocalCache.start(store, [keys.namespaces_prefix()])
        namespaces = Namespaces(store, cache, Policy())
        await namespaces.create("ns")
        stale = await LocalCache.start(store, [keys.namespaces_prefix()])
        await stale.close()  # it knows the namespace, and nothing written from now on
        await store.transaction([], [Put(keys.namespace_topic("ns", "t"), b"null")], [])
        behind = Namespaces(store, stale, Policy())
        with pytest.raises(ApiError, match="namespace ns still has topics") as refused:
            await behind.delete("ns")
        assert refused.value.grpc_code == "FAILED_PRECONDITION"
        assert await store.get(keys.namespace_policy("ns")) is not None  # nothing deleted
        await store.delete(keys.namespace_topic("ns", "t"))
        await namespaces.delete("ns")
        assert await store.get(keys.namespace_policy("ns")) is None
        await cache.close()
        await store.close()

    run(main())

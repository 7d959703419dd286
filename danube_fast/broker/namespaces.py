"""Namespaces and the policies topics take from them (docs/METADATA.md).

Namespaces owns nothing of its own: a namespace is its policy key under `/namespaces/`, and this broker sees
every namespace through the LocalCache of that prefix, so one created or changed through the store by an
admin on another broker applies here without a restart. Writes go to the store first and wait until the cache
has seen them, so that the next read here agrees with what was just answered.

Owner: the event loop.
"""

from __future__ import annotations

import contextlib
import logging

from danube_fast.errors import ApiError, not_found, precondition
from danube_fast.meta import keys
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import Policy
from danube_fast.meta.store import BadValue, Compare, Delete, KeyValue, MetadataStore, Put
from danube_fast.names import TopicName

log = logging.getLogger("danube_fast.broker")

BOOTSTRAP_NAMESPACES = ("default", "system")
CACHE_WAIT = 5.0  # seconds to wait for the cache to see this broker's own write


async def bootstrap(store: MetadataStore, policy: Policy) -> None:
    """The namespaces every broker starts with, created with `policy` unless they exist."""
    for ns in BOOTSTRAP_NAMESPACES:
        await store.transaction([Compare(keys.namespace_policy(ns), "version", "==", 0)],
                                [Put(keys.namespace_policy(ns), policy.to_json())], [])


class Namespaces:
    def __init__(self, store: MetadataStore, cache: LocalCache, default_policy: Policy) -> None:
        """`cache` must watch `/namespaces/`; `default_policy`: a new namespace's, and the policy of a topic
        whose namespace has none."""
        self._store = store
        self._cache = cache
        self._default = default_policy

    def exists(self, namespace: str) -> bool:
        return self._cache.get(keys.namespace_policy(namespace)) is not None

    def names(self) -> list[str]:
        found = []
        for kv in self._cache.get_prefix(keys.namespaces_prefix()):
            with contextlib.suppress(ValueError):
                found.append(keys.parse_namespace_policy(kv.key))
        return sorted(found)

    def policy(self, namespace: str) -> Policy:
        kv = self._cache.get(keys.namespace_policy(namespace))
        if kv is None:
            raise not_found(f"namespace {namespace} does not exist")
        return Policy.from_json(kv.value, key=kv.key)

    async def create(self, namespace: str) -> None:
        key = keys.namespace_policy(namespace)
        txn = await self._store.transaction([Compare(key, "version", "==", 0)],
                                            [Put(key, self._default.to_json())], [])
        if not txn.succeeded:
            raise ApiError("ALREADY_EXISTS", f"namespace {namespace} already exists")
        await self._cache.wait_for_revision(txn.revision, CACHE_WAIT, key=key)

    async def delete(self, namespace: str) -> None:
        """Only an empty namespace: its topics, wherever in the cluster they are served, go first."""
        if not self.exists(namespace):
            raise not_found(f"namespace {namespace} does not exist")
        topics = keys.namespace_topics_prefix(namespace)
        if self._cache.get_prefix(topics):
            raise precondition(f"namespace {namespace} still has topics: delete them first")
        # The check again, in the write: a topic created since the cache looked (its creation compares that
        # the namespace exists) makes the delete fail rather than leave the topic without its namespace.
        txn = await self._store.transaction([Compare(topics, "version", "==", 0, prefix=True)],
                                            [Delete(keys.namespace_prefix(namespace), prefix=True)], [])
        if not txn.succeeded:
            raise precondition(f"namespace {namespace} still has topics: delete them first")
        await self._cache.wait_for_revision(txn.revision, CACHE_WAIT)

    def topic_policy(self, name: TopicName, own: KeyValue | None) -> Policy:
        """The topic's policy given what its own policy key holds (`own`): that policy if it has a valid one,
        else its namespace's (from the cache: a change there applies at once). A value that is not a policy
        is logged and passed over rather than stop the topic."""
        if own is not None:
            try:
                return Policy.from_json(own.value, key=own.key)
            except BadValue as e:
                log.warning("%s: its own policy is not valid, the namespace's applies: %s", name.full, e)
        kv = self._cache.get(keys.namespace_policy(name.namespace))
        return Policy.from_json(kv.value, key=kv.key) if kv is not None else self._default

    async def read_topic_policy(self, name: TopicName) -> Policy:
        """The topic's policy as the metadata says now (a topic's own policy replaces its namespace's)."""
        return self.topic_policy(name, await self._store.get(keys.topic_policy(name.namespace, name.topic)))

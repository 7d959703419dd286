"""ClusterView: the cluster as the metadata says it is, read synchronously from a LocalCache.

The cache must mirror `CACHE_PREFIXES`: `/cluster/` (registrations, broker states, assignments, unassigned
markers, load reports, the leader key) and `/namespaces/` (namespace policies and the namespace topic
markers). `/topics/` is not needed: topic details (delivery, subscriptions, schema) are read from the store
when an admin call asks for them, so that no broker has to follow every cursor write of the cluster.

Values that do not parse (a key of an unknown shape, a value that is not docs/METADATA.md's JSON) are left
out of the listings and logged once per key and revision; single-key reads raise `BadValue` for them.

Who owns a topic: the broker whose assignment key `/cluster/brokers/{id}/{ns}/{topic}` exists. Finding it
for one topic needs every broker's assignments (a dead broker's too), so the owner index is built from one
scan of `/cluster/brokers/` and reused until something under that prefix changes (admin calls are rare;
parsing 10k assignments takes a few tens of milliseconds, checking for a change a fraction of that).

Owner: the event loop of the cache; the view holds no state of its own but that memo.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from danube_fast.meta import keys
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import (
    BrokerRegistration,
    BrokerState,
    ClusterLeader,
    LoadReport,
    Resource,
    TopicReplicas,
    Unassigned,
)
from danube_fast.meta.store import BadValue, InvalidKey, KeyValue

log = logging.getLogger("danube_fast.cluster")

CACHE_PREFIXES = (keys.cluster_prefix(), keys.namespaces_prefix())

R = TypeVar("R", bound=Resource)


class BrokerEntry(NamedTuple):
    broker_id: int
    registration: BrokerRegistration
    state: BrokerState | None  # None until the broker wrote one
    is_leader: bool


class UnassignedTopic(NamedTuple):
    namespace: str
    topic: str
    marker: Unassigned


class ClusterView:
    def __init__(self, cache: LocalCache) -> None:
        self._cache = cache
        self._owners: dict[tuple[str, str], int] = {}
        self._owners_fingerprint = (-1, -1)
        self._reported: set[tuple[str, int]] = set()  # (key, mod_revision) of bad values already logged

    @property
    def cache(self) -> LocalCache:
        return self._cache

    # -- reading values --------------------------------------------------------------------------------

    def _value(self, kv: KeyValue, resource: type[R]) -> R | None:
        """The value of a listed key, or None (logged once) if it is not what the key holds."""
        try:
            return resource.from_json(kv.value, key=kv.key)
        except BadValue as e:
            if (kv.key, kv.mod_revision) not in self._reported:
                self._reported.add((kv.key, kv.mod_revision))
                log.warning("cluster view: %s", e)
            return None

    def _by_broker(self, prefix: str, parse: Callable[[str], int], resource: type[R]) -> dict[int, R]:
        found: dict[int, R] = {}
        for kv in self._cache.get_prefix(prefix):
            with contextlib.suppress(InvalidKey):
                broker_id = parse(kv.key)
                value = self._value(kv, resource)
                if value is not None:
                    found[broker_id] = value
        return found

    def _get(self, key: str, resource: type[R]) -> R | None:
        kv = self._cache.get(key)
        return None if kv is None else resource.from_json(kv.value, key=kv.key)

    # -- brokers ---------------------------------------------------------------------------------------

    def registrations(self) -> dict[int, BrokerRegistration]:
        """Registered brokers (their registration lives under their lease), by id."""
        return self._by_broker(keys.register_prefix(), keys.parse_broker_register, BrokerRegistration)

    def brokers(self) -> list[BrokerEntry]:
        """Every registered broker, by id: (id, registration, state or None, is_leader)."""
        leader = self.leader_id()
        entries = []
        for broker_id, registration in sorted(self.registrations().items()):
            kv = self._cache.get(keys.broker_state(broker_id))
            state = None if kv is None else self._value(kv, BrokerState)
            entries.append(BrokerEntry(broker_id, registration, state, broker_id == leader))
        return entries

    def registration(self, broker_id: int) -> BrokerRegistration | None:
        return self._get(keys.broker_register(broker_id), BrokerRegistration)

    def state(self, broker_id: int) -> BrokerState | None:
        return self._get(keys.broker_state(broker_id), BrokerState)

    def leader_id(self) -> int | None:
        leader = self._get(keys.leader(), ClusterLeader)
        return None if leader is None else leader.broker_id

    def load_reports(self) -> dict[int, LoadReport]:
        return self._by_broker(keys.load_prefix(), keys.parse_load_report, LoadReport)

    # -- topics ----------------------------------------------------------------------------------------

    def broker_topics(self, broker_id: int) -> list[tuple[str, str]]:
        """(namespace, topic) assigned to the broker, sorted."""
        found = []
        for kv in self._cache.get_prefix(keys.broker_topics_prefix(broker_id)):
            with contextlib.suppress(InvalidKey):  # its state key shares the prefix
                _, namespace, topic = keys.parse_broker_topic(kv.key)
                found.append((namespace, topic))
        return found

    def replicas(self, namespace: str, topic: str) -> TopicReplicas | None:
        """The copies' key of a replicated topic (docs/REPLICATION.md); None without one, or unreadable."""
        kv = self._cache.get(keys.replicas(namespace, topic))
        return None if kv is None else self._value(kv, TopicReplicas)

    def owner(self, namespace: str, topic: str) -> int | None:
        """The broker the topic is assigned to; None while it is unassigned (or does not exist)."""
        return self._owner_index().get((namespace, topic))

    def owners(self) -> dict[tuple[str, str], int]:
        """Every assignment of the cluster: (namespace, topic) -> broker id."""
        return dict(self._owner_index())

    def _owner_index(self) -> dict[tuple[str, str], int]:
        kvs = self._cache.get_prefix(keys.brokers_prefix())
        # Any change under the prefix changes this: a put raises the newest mod revision, a delete alone
        # lowers the count. (The cache's revision would not do: it is the highest of all its prefixes.)
        fingerprint = (len(kvs), max((kv.mod_revision for kv in kvs), default=0))
        if fingerprint != self._owners_fingerprint:
            owners: dict[tuple[str, str], int] = {}
            for kv in kvs:
                with contextlib.suppress(InvalidKey):
                    broker_id, namespace, topic = keys.parse_broker_topic(kv.key)
                    owners[(namespace, topic)] = broker_id
            self._owners, self._owners_fingerprint = owners, fingerprint
        return self._owners

    def assignment(self, broker_id: int, namespace: str, topic: str) -> KeyValue | None:
        """The assignment key as cached (its create revision guards an unload)."""
        return self._cache.get(keys.broker_topic(broker_id, namespace, topic))

    def unassigned(self) -> list[UnassignedTopic]:
        """Topics waiting for the load manager: new ones (null marker) and unloaded ones."""
        found = []
        for kv in self._cache.get_prefix(keys.unassigned_prefix()):
            with contextlib.suppress(InvalidKey):
                namespace, topic = keys.parse_unassigned(kv.key)
                marker = self._value(kv, Unassigned)
                if marker is not None:
                    found.append(UnassignedTopic(namespace, topic, marker))
        return found

    # -- namespaces ------------------------------------------------------------------------------------

    def namespaces(self) -> list[str]:
        """Namespace names, once each (a namespace has a policy; topic markers name it too), sorted."""
        found: set[str] = set()
        for kv in self._cache.get_prefix(keys.namespaces_prefix()):
            with contextlib.suppress(InvalidKey):
                found.add(keys.parse_namespace_policy(kv.key))
                continue
            with contextlib.suppress(InvalidKey):
                found.add(keys.parse_namespace_topic(kv.key)[0])
        return sorted(found)

    def namespace_exists(self, namespace: str) -> bool:
        return self._cache.get(keys.namespace_policy(namespace)) is not None

    def namespace_topics(self, namespace: str) -> list[str]:
        """The short names of the namespace's topics (its `/namespaces/{ns}/topics/` markers), sorted."""
        found = []
        for kv in self._cache.get_prefix(keys.namespace_topics_prefix(namespace)):
            with contextlib.suppress(InvalidKey):
                found.append(keys.parse_namespace_topic(kv.key)[1])
        return found

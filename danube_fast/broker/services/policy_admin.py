"""PolicyAdmin on the admin port (proto/PolicyAdmin.proto): a namespace's policy changed in place, a topic
given a policy of its own (docs/METADATA.md: it replaces the namespace's for that topic) or its own policy
removed. A partitioned topic's base name stands for its partitions: each gets the change (one compare-and-put
each).

Each change is one compare-and-put on the policy's key, conditioned on the revision it was computed from, so
two admins changing different keys at once never lose one's change (the second gets ABORTED and calls again).
A namespace change is answered once this broker's cache holds it; topic policies are not cached, the owner
reads them at its next retention pass (docs/RETENTION.md) and at the topic's next load.
"""

from __future__ import annotations

import json

from danube_fast.broker.context import BrokerContext
from danube_fast.broker.services.status import Context, unary
from danube_fast.errors import ApiError, invalid, not_found
from danube_fast.meta import keys
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import Policy
from danube_fast.meta.store import BadValue, Compare, KeyValue, MetadataStore, Put
from danube_fast.names import TopicName, check_namespace, parse_topic
from danube_fast.proto import PolicyAdmin_pb2 as pb

CACHE_WAIT = 5.0  # seconds a namespace change may take to come back through this broker's watch
KNOWN_KEYS = Policy.KEYS


def changed(current: Policy, changes: str, what: str) -> Policy:
    """`current` with `changes` (a JSON object of policy keys) applied; INVALID_ARGUMENT saying what is
    wrong."""
    try:
        fields = json.loads(changes)
    except ValueError as e:
        raise invalid(f"{what}: the changes are not JSON: {e}") from None
    if not isinstance(fields, dict) or not fields:
        raise invalid(f"{what}: the changes must be a JSON object of policy keys, e.g. "
                      '{"retentionTimeInMinutes": 1440}')
    unknown = sorted(set(fields) - set(KNOWN_KEYS))
    if unknown:
        raise invalid(f"{what}: unknown policy keys {unknown}; known: {', '.join(KNOWN_KEYS)}")
    try:
        return current.merged(fields, what)
    except BadValue as e:
        raise invalid(str(e)) from None


def view(policy: Policy, own: bool = False) -> pb.PolicyView:
    return pb.PolicyView(policy=json.dumps(policy.to_obj(), sort_keys=True), own=own)


class PolicyAdminService:
    def __init__(self, ctx: BrokerContext, store: MetadataStore, cache: LocalCache) -> None:
        self._topics = ctx.topics
        self._namespaces = ctx.namespaces
        self._clustered = ctx.placement.clustered
        self._store = store
        self._cache = cache

    def _copies_possible(self, before: Policy, policy: Policy, what: str) -> None:
        """A replicationFactor raised beyond the brokers there are is refused (docs/REPLICATION.md): a copy
        needs a broker of its own. Fewer brokers later (one died) leave the topic under-replicated."""
        if policy.copies <= 1 or policy.copies <= before.copies:
            return
        if not self._clustered:
            raise invalid(f"{what}: replicationFactor {policy.copies} needs a cluster; a standalone broker "
                          "keeps one copy")
        brokers = len(self._cache.get_prefix(keys.register_prefix()))
        if policy.copies > brokers:
            raise invalid(f"{what}: replicationFactor {policy.copies} is more than the {brokers} brokers of "
                          "the cluster")

    @unary
    async def SetNamespacePolicy(self, request: pb.SetNamespacePolicyRequest, context: Context
                                 ) -> pb.PolicyView:
        key = keys.namespace_policy(check_namespace(request.namespace))
        kv = await self._store.get(key)
        if kv is None:
            raise not_found(f"namespace {request.namespace} does not exist")
        what = f"namespace {request.namespace}"
        before = Policy.from_json(kv.value, key=key)
        policy = changed(before, request.changes, what)
        self._copies_possible(before, policy, what)
        revision = await self._swap(kv, key, policy)
        await self._cache.wait_for_revision(revision, CACHE_WAIT, key=key)
        return view(policy)

    @unary
    async def GetTopicPolicy(self, request: pb.TopicPolicyRequest, context: Context) -> pb.PolicyView:
        name = self._stored(request.topic)[0]  # a partitioned topic's partitions are set together
        own = await self._store.get(keys.topic_policy(name.namespace, name.topic))
        return view(self._namespaces.topic_policy(name, own), own is not None)

    @unary
    async def SetTopicPolicy(self, request: pb.SetTopicPolicyRequest, context: Context) -> pb.PolicyView:
        policy = None
        for name in self._stored(request.topic):
            key = keys.topic_policy(name.namespace, name.topic)
            own = await self._store.get(key)
            before = self._namespaces.topic_policy(name, own)
            policy = changed(before, request.changes, f"topic {name.full}")
            self._copies_possible(before, policy, f"topic {name.full}")
            await self._swap(own, key, policy)
        assert policy is not None
        return view(policy, own=True)

    @unary
    async def ClearTopicPolicy(self, request: pb.TopicPolicyRequest, context: Context) -> pb.PolicyView:
        stored = self._stored(request.topic)
        for name in stored:
            await self._store.delete(keys.topic_policy(name.namespace, name.topic))
        return view(self._namespaces.topic_policy(stored[0], None))

    def _stored(self, topic: str) -> list[TopicName]:
        """The topic, or a partitioned topic's partitions (its base name stands for all of them: a policy
        is kept per stored topic); NOT_FOUND when it is neither."""
        name = parse_topic(topic)
        found = [parse_topic(full) for full in self._topics.partitions(name)]
        if not found:
            raise not_found(f"topic {name.full} does not exist (as a topic or as a partitioned topic)")
        return found

    async def _swap(self, old: KeyValue | None, key: str, policy: Policy) -> int:
        """Put `policy` at `key` if the key still is what `old` read; the store's revision after it."""
        guard = Compare(key, "mod_revision", "==", old.mod_revision) if old is not None else \
            Compare(key, "version", "==", 0)
        result = await self._store.transaction([guard], [Put(key, policy.to_json())], [])
        if not result.succeeded:
            raise ApiError("ABORTED", f"{key} changed while this change was made: read it and call again")
        return result.revision


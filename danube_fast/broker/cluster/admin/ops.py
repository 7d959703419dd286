"""The admin API's cluster operations, as metadata reads and writes (docs/WIRE.md C.14, docs/TOPIC_MOVE.md).

Nothing here touches a topic's runtime state: an unload is the two metadata changes of
docs/TOPIC_MOVE.md#a-graceful-move-unload (the unassigned marker `{reason: "unload", from_broker}` put and the
assignment deleted, in one transaction), and the owner, watching its assignments, seals and lets the topic go;
the load manager on the leader assigns it again. A drain marks the broker `draining` (so the load manager
gives it nothing new) and unloads its topics.

Every write waits until the view's cache holds it, so the caller's next read shows it. Errors are ApiErrors
with the status v0.7.3 answers (FAILED_PRECONDITION below two brokers, NOT_FOUND for an unassigned topic).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from danube_fast.broker.cluster.view import ClusterView
from danube_fast.errors import ApiError, DanubeError, not_found, precondition, unavailable
from danube_fast.meta import keys
from danube_fast.meta.resources import (
    BrokerMode,
    BrokerState,
    DeliveryMode,
    TopicDelivery,
    TopicSchemaConfig,
    Unassigned,
)
from danube_fast.meta.store import Compare, Delete, Get, KeyValue, MetadataStore, Put

MIN_BROKERS_TO_UNLOAD = 2  # v0.7.3 topics_admin.rs: a topic has nowhere to go in a single-broker cluster
UNLOAD_ATTEMPTS = 3  # the owner read from the cache may be stale: read again after a failed compare
CACHE_WAIT = 5.0  # seconds to wait for the cache to show this process's own write
DRAIN_REASON = "admin_unload"  # v0.7.3's reason for a drain started by UnloadBroker
ACTIVATE_REASON = "admin_activate"  # v0.7.3's reason when ActivateBroker names none
DEFAULT_PARALLEL = 4  # topics a drain moves at once when the request says 0
DEFAULT_DRAIN_SECONDS = 60.0  # how long a drain waits for reassignments when the request says 0
# GetClusterBalance: a broker is overloaded above mean * (1 + IMBALANCE) and underloaded below
# mean * (1 - IMBALANCE) (0.3 is the "balanced" threshold of Danube's load manager), and only where one move
# would narrow the spread: at least 2 topics above the least loaded broker (below the most loaded one).
IMBALANCE = 0.3


async def _caught_up(view: ClusterView, revision: int, key: str) -> None:
    try:
        await view.cache.wait_for_revision(revision, CACHE_WAIT, key=key)
    except TimeoutError as e:
        raise unavailable(f"the metadata cache did not catch up with revision {revision}: {e}") from e


# -- topics ------------------------------------------------------------------------------------------------

async def unload_topic(store: MetadataStore, view: ClusterView, namespace: str, topic: str, *,
                       from_broker: int | None = None) -> int:
    """Unload the topic from its owner (docs/TOPIC_MOVE.md#a-graceful-move-unload, step 1); returns that
    owner's id.

    One transaction: if the assignment key still has the create revision it was read at, put the unassigned
    marker `Unassigned.unload(owner)` and delete the assignment. With `from_broker`, only an assignment to
    that broker is unloaded (a drain must not unload a topic that already moved elsewhere): NOT_FOUND then.
    """
    name = keys.topic_name(namespace, topic)
    if len(view.registrations()) < MIN_BROKERS_TO_UNLOAD:
        raise precondition(f"Cannot unload the topic {name}: single broker cluster detected, the topic has "
                           "no other broker to go to")
    for _ in range(UNLOAD_ATTEMPTS):
        owner = view.owner(namespace, topic)
        if owner is None or (from_broker is not None and owner != from_broker):
            where = "unassigned" if owner is None else f"assigned to broker {owner}"
            raise not_found(f"Unable to unload the topic {name}: it is {where}")
        kv = view.assignment(owner, namespace, topic)
        assert kv is not None  # the owner index is built from the same cache, at the same revision
        key = keys.broker_topic(owner, namespace, topic)
        txn = await store.transaction(
            [Compare(key, "create_revision", "==", kv.create_revision)],
            [Put(keys.unassigned(namespace, topic), Unassigned.unload(owner).to_json()), Delete(key)], [])
        await _caught_up(view, txn.revision, key)
        if txn.succeeded:
            return owner
    raise ApiError("ABORTED", f"Unable to unload the topic {name}: its assignment kept changing; try again")


@dataclass(frozen=True)
class TopicRecord:
    """What the metadata says of a topic beyond its assignment (from `/topics/{ns}/{topic}/`)."""

    exists: bool
    delivery: DeliveryMode
    subscriptions: tuple[str, ...]  # once each, sorted (v0.7.3 repeats those with a cursor: D.16)
    schema: TopicSchemaConfig | None


def _record(kvs: list[KeyValue], namespace: str, topic: str) -> TopicRecord:
    root = keys.topic_root(namespace, topic)
    delivery_key, schema_key = keys.topic_delivery(namespace, topic), keys.topic_schema(namespace, topic)
    delivery, schema, subscriptions = DeliveryMode.NON_RELIABLE, None, set()
    exists = False
    for kv in kvs:
        if kv.key == root:
            exists = True
        elif kv.key == delivery_key:
            delivery = TopicDelivery.from_json(kv.value, key=kv.key).mode
        elif kv.key == schema_key:
            schema = TopicSchemaConfig.from_json(kv.value, key=kv.key)
        else:
            with contextlib.suppress(ValueError):  # cursors, producers, policy
                subscriptions.add(keys.parse_topic_subscription(kv.key)[2])
    return TopicRecord(exists, delivery, tuple(sorted(subscriptions)), schema)


async def topic_records(store: MetadataStore, topics: Iterable[tuple[str, str]], *, details: bool = True
                        ) -> dict[tuple[str, str], TopicRecord]:
    """Each topic's record, read in transactions of Gets (one consistent read per 64 topics). Without
    `details` only the root and delivery are read (for listings: no subscriptions, no schema)."""
    wanted = list(topics)
    found: dict[tuple[str, str], TopicRecord] = {}
    per_txn = 64  # two Gets per topic, under etcd's 128 operations per transaction
    for i in range(0, len(wanted), per_txn):
        chunk = wanted[i:i + per_txn]
        ops: list[Get] = []
        for ns, t in chunk:
            ops.append(Get(keys.topic_root(ns, t)))
            ops.append(Get(keys.topic_prefix(ns, t), prefix=True) if details
                       else Get(keys.topic_delivery(ns, t)))
        txn = await store.transaction([], ops, [])
        for j, (ns, t) in enumerate(chunk):
            kvs: list[KeyValue] = []
            for response in txn.responses[2 * j:2 * j + 2]:
                assert isinstance(response, list)
                kvs.extend(response)
            found[(ns, t)] = _record(kvs, ns, t)
    return found


# -- brokers -----------------------------------------------------------------------------------------------

def _is_active(state: BrokerState | None) -> bool:
    return state is None or state.mode == BrokerMode.ACTIVE  # a broker writes its state as it registers


async def _set_state(store: MetadataStore, view: ClusterView, broker_id: int, state: BrokerState,
                     guard: Compare | None) -> None:
    key = keys.broker_state(broker_id)
    txn = await store.transaction([guard] if guard is not None else [], [Put(key, state.to_json())], [])
    if not txn.succeeded:
        raise not_found(f"broker {broker_id} is not registered")
    await _caught_up(view, txn.revision, key)


async def activate_broker(store: MetadataStore, view: ClusterView, broker_id: int, reason: str = "") -> None:
    """State `active` with `reason` (ActivateBroker). The broker must be registered or have a state (a
    drained broker that is stopped keeps its state and may be activated before it starts again)."""
    if broker_id not in view.registrations() and view.state(broker_id) is None:
        raise not_found(f"broker {broker_id} is not registered and has no state")
    await _set_state(store, view, broker_id, BrokerState(BrokerMode.ACTIVE, reason or ACTIVATE_REASON), None)


@dataclass(frozen=True)
class DrainReport:
    """UnloadBrokerResponse: `pending` topics were not reassigned elsewhere before the deadline."""

    started: bool
    total: int
    succeeded: int
    failed: int
    pending: int
    failed_topics: tuple[str, ...]  # "/ns/topic: why"


def _selected(topics: list[tuple[str, str]], include: Collection[str], exclude: Collection[str]
              ) -> list[tuple[str, str]]:
    return [(ns, t) for ns, t in topics if (not include or ns in include) and ns not in exclude]


async def drain_broker(store: MetadataStore, view: ClusterView, broker_id: int, *,
                       namespaces_include: Collection[str] = (), namespaces_exclude: Collection[str] = (),
                       max_parallel: int = 0, dry_run: bool = False, timeout: float = 0.0,
                       reason: str = DRAIN_REASON) -> DrainReport:
    """UnloadBroker: set the broker `draining`, then unload its topics (those of `namespaces_include` if
    given, minus `namespaces_exclude`), `max_parallel` at a time (0: DEFAULT_PARALLEL), each counted as
    succeeded once it is assigned to another broker. Topics not reassigned within `timeout` seconds (0:
    DEFAULT_DRAIN_SECONDS) are pending; they go on moving after the call returns. A dry run changes nothing
    and reports every selected topic as pending."""
    registered = view.registrations()
    if broker_id not in registered:
        raise not_found(f"broker {broker_id} is not registered")
    if len(registered) < MIN_BROKERS_TO_UNLOAD:
        raise precondition("Cannot unload broker: single broker cluster detected")
    if not any(_is_active(view.state(b)) for b in registered if b != broker_id):
        raise precondition("Cannot unload broker: no other active broker to take its topics")
    topics = _selected(view.broker_topics(broker_id), namespaces_include, namespaces_exclude)
    if dry_run:
        return DrainReport(False, len(topics), 0, 0, len(topics), ())
    await _set_state(store, view, broker_id, BrokerState(BrokerMode.DRAINING, reason),
                     Compare(keys.broker_register(broker_id), "version", ">", 0))
    if not topics:
        return DrainReport(True, 0, 0, 0, 0, ())
    outcomes = await _move_all(store, view, broker_id, topics, max_parallel or DEFAULT_PARALLEL,
                               timeout or DEFAULT_DRAIN_SECONDS)
    failed = tuple(f"{keys.topic_name(*t)}: {why}" for t, why in outcomes.items() if why is not None)
    succeeded = sum(1 for t in topics if t not in outcomes)
    return DrainReport(True, len(topics), succeeded, len(failed), len(outcomes) - len(failed), failed)


async def _move_all(store: MetadataStore, view: ClusterView, broker_id: int, topics: list[tuple[str, str]],
                    parallel: int, timeout: float) -> dict[tuple[str, str], str | None]:
    """Unload each topic and wait for its next assignment. Returns the topics that did not move: the
    reason they failed, or None for those still pending at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    moved: dict[tuple[str, str], asyncio.Future[None]] = {t: loop.create_future() for t in topics}
    events = view.cache.subscribe(keys.brokers_prefix())  # before any unload: no reassignment is missed

    async def watch() -> None:
        async for event in events:
            if event.type != "put":
                continue
            with contextlib.suppress(ValueError):  # state keys share the prefix
                owner, ns, t = keys.parse_broker_topic(event.key)
                future = moved.get((ns, t))
                if owner != broker_id and future is not None and not future.done():
                    future.set_result(None)

    slots = asyncio.Semaphore(parallel)
    left: dict[tuple[str, str], str | None] = {}

    async def move(t: tuple[str, str]) -> None:
        async with slots:
            if loop.time() >= deadline:
                left[t] = None
                return
            try:
                await unload_topic(store, view, *t, from_broker=broker_id)
            except DanubeError as e:  # the store failed, or the topic is no longer on the broker
                if e.grpc_code != "NOT_FOUND" or view.owner(*t) in (None, broker_id):
                    left[t] = str(e)
                return  # or it had moved elsewhere already
            try:
                await asyncio.wait_for(asyncio.shield(moved[t]), max(0.0, deadline - loop.time()))
            except TimeoutError:
                left[t] = None

    watcher = asyncio.create_task(watch(), name=f"drain {broker_id}: reassignments")
    try:
        await asyncio.gather(*(move(t) for t in topics))
    finally:
        events.close()
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    return left


# -- balance -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BrokerLoad:
    broker_id: int
    load: float
    topic_count: int
    is_overloaded: bool
    is_underloaded: bool


@dataclass(frozen=True)
class Balance:
    """GetClusterBalance. `std_deviation` is the population one; `coefficient_of_variation` is
    std_deviation / mean_load (0 for an empty cluster)."""

    coefficient_of_variation: float
    mean_load: float
    max_load: float
    min_load: float
    std_deviation: float
    brokers: tuple[BrokerLoad, ...]


def balance_of(topic_counts: Mapping[int, int]) -> Balance:
    """The figures of brokers whose load is their topic count."""
    if not topic_counts:
        return Balance(0.0, 0.0, 0.0, 0.0, 0.0, ())
    loads = {b: float(n) for b, n in topic_counts.items()}
    mean = sum(loads.values()) / len(loads)
    std = math.sqrt(sum((x - mean) ** 2 for x in loads.values()) / len(loads))
    low, high = min(loads.values()), max(loads.values())
    brokers = tuple(
        BrokerLoad(b, x, topic_counts[b],
                   is_overloaded=x > mean * (1 + IMBALANCE) and x - low >= 2,
                   is_underloaded=x < mean * (1 - IMBALANCE) and high - x >= 2)
        for b, x in sorted(loads.items()))
    return Balance(std / mean if mean else 0.0, mean, high, low, std, brokers)


def cluster_balance(view: ClusterView) -> Balance:
    """The balance of the registered brokers. A broker's load is the number of topics assigned to it, read
    from the assignment keys: the load manager places and rebalances by topic count, and the assignments are
    current where a load report lags by its interval (its CPU and memory figures are not comparable between
    brokers of different sizes)."""
    return balance_of({b: len(view.broker_topics(b)) for b in view.registrations()})

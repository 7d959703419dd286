"""The topics this broker serves, and every producer and consumer on them, by id.

Ownership: everything here lives on the event loop; the metadata store is written first and memory changed
after the write succeeded, so a failed write leaves nothing half-made. Standalone mode serves every topic of
the store. On start it loads namespaces' topics, their WALs, producers, subscriptions and cursors, which is
how a restart (after SIGTERM or SIGKILL) picks up where the last run stopped.

Reads on the request path are memory lookups; namespace existence and policies come from the LocalCache of
`/namespaces/`, so a namespace created through the store by an admin is seen without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from danube_fast.broker import names
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.consumer import Consumer
from danube_fast.broker.dispatch.batches import BatchDispatcher
from danube_fast.broker.dispatch.budget import ByteBudget
from danube_fast.broker.dispatch.live import LiveDispatcher
from danube_fast.broker.dispatch.reliable import ReliableDispatcher
from danube_fast.broker.errors import (
    ApiError,
    denied,
    exhausted,
    invalid,
    not_found,
    precondition,
    unavailable,
)
from danube_fast.broker.names import TopicName
from danube_fast.broker.ownership import Fence, LocalPlacement, Placement, Unfenced
from danube_fast.broker.subscription import Subscription
from danube_fast.broker.topic import ProducerEntry, Topic
from danube_fast.meta import keys
from danube_fast.meta.cache import LocalCache
from danube_fast.meta.resources import (
    NULL,
    DeliveryMode,
    Policy,
    Producer,
    ProducerAccessMode,
    SubscriptionCursor,
    SubscriptionType,
    TopicDelivery,
    TopicRoot,
)
from danube_fast.meta.resources import Subscription as SubscriptionRecord
from danube_fast.meta.store import Compare, Delete, MetadataError, MetadataStore, Put
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.storage.gaps import Gap
from danube_fast.storage.wal import Wal

if TYPE_CHECKING:
    from danube_fast.broker.tiering import Tier

log = logging.getLogger("danube_fast.broker")

BOOTSTRAP_NAMESPACES = ("default", "system")
CACHE_WAIT = 5.0  # seconds to wait for the cache to see this broker's own write
TOMBSTONE_SECONDS = 60.0
MOVED_SECONDS = 600.0  # how long clients of a topic that moved away get UNAVAILABLE ("look it up") here
STREAM_WAIT = 10.0  # seconds a subscribed consumer may go without opening its stream before it counts as gone
MAX_KEY_FILTERS = 64  # Key-Shared filters per consumer: each is matched against every routing key


def new_id(taken: Iterable[int] = ()) -> int:
    """A random non-zero u64, as Danube's ids are (clients treat them as opaque, docs/WIRE.md C.1)."""
    used = set(taken)
    while True:
        value = secrets.randbits(64)
        if value and value not in used:
            return value


class Topics:
    def __init__(self, config: BrokerConfig, store: MetadataStore, cache: LocalCache, broker_id: int,
                 placement: Placement) -> None:
        self._config = config
        self._store = store
        self._cache = cache
        self.broker_id = broker_id
        self.topics: dict[str, Topic] = {}
        self.producers: dict[int, ProducerEntry] = {}
        self.consumers: dict[int, Consumer] = {}
        # Consumers removed (topic deleted, Exclusive holder replaced) -> set once a health check told the
        # client CLOSE. Kept for TOMBSTONE_SECONDS; see ConsumerService.ReceiveMessages.
        self.gone: dict[int, tuple[float, asyncio.Event]] = {}
        self._creating: dict[str, asyncio.Lock] = {}
        self._reaper: asyncio.Task[None] | None = None
        # Cluster mode: topics this broker let go of and their producers, by when (their clients get
        # UNAVAILABLE and look the topic up again).
        self.moved_topics: dict[str, float] = {}
        self.moved_producers: dict[int, float] = {}
        self.placement = placement  # where topics live (broker/ownership.py)
        self.tier: Tier | None = None
        self.stopping = False  # the broker is shutting down: fast consumer streams end with UNAVAILABLE
        # Bytes every dispatcher holds for delivery, against [dispatch] broker_bytes (dispatch/budget.py).
        self.budget = ByteBudget(config.dispatch.broker_bytes)
        # Topics whose load failed (their WAL cannot be opened, their metadata cannot be read) -> why. They
        # are logged and refused with FAILED_PRECONDITION; every other topic is served.
        self.broken: dict[str, str] = {}

    @classmethod
    async def open(cls, config: BrokerConfig, store: MetadataStore, broker_id: int, tier: Tier | None = None,
                   placement: Placement | None = None) -> Topics:
        """Standalone mode (`LocalPlacement`, the default) loads every topic of the store here; in cluster
        mode the placement loads the topics assigned to this broker once it is a member."""
        for ns in BOOTSTRAP_NAMESPACES:
            await store.transaction([Compare(keys.namespace_policy(ns), "version", "==", 0)],
                                    [Put(keys.namespace_policy(ns), config.policy.to_json())], [])
        cache = await LocalCache.start(store, [keys.namespaces_prefix()])
        self = cls(config, store, cache, broker_id, placement or LocalPlacement(broker_id))
        self.tier = tier
        try:
            if not self.placement.clustered:
                await self._load()
        except BaseException:
            await self.close()
            raise
        self._reaper = asyncio.create_task(self._reap_idle(), name="reap-idle-subscriptions")
        return self

    async def close(self) -> None:
        """Stop dispatching, persist every cursor, fsync and close every WAL."""
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        for c in self.consumers.values():
            c.end_streams()
        for topic in self.topics.values():
            for sub in topic.subscriptions.values():
                try:
                    await sub.dispatcher.close()
                except Exception as e:  # keep closing the others; the WAL still holds the data
                    log.error("closing subscription %s on %s: %s", sub.name, topic.full, e)
            await self._close_storage(topic)
        await self._cache.close()

    # -- loading -------------------------------------------------------------------------------------

    async def _load(self) -> None:
        """Standalone: every topic in the store is this broker's."""
        found: set[tuple[str, str]] = set()
        for kv in await self._store.get_prefix(keys.topics_prefix()):
            with contextlib.suppress(ValueError):
                found.add(keys.parse_topic_root(kv.key))
        for (ns, short) in sorted(found):
            name = TopicName(ns, short)
            try:
                topic = await self.load_topic(name)
                if topic is not None and topic.wal is not None and self.tier is not None:
                    await self.tier.attach(topic, None)
            except Exception as e:
                if isinstance(e, MetadataError) and e.retriable:
                    raise  # the store itself is down: no topic can load
                await self.mark_broken(name, e)
        if self.broken:
            log.error("%d topics could not be loaded: %s", len(self.broken), ", ".join(sorted(self.broken)))

    async def mark_broken(self, name: TopicName, error: Exception) -> None:
        """One topic's storage failed to load: it must not keep the broker from serving the others."""
        log.error("cannot load topic %s, serving the other topics without it: %s", name, error)
        self.broken[name.full] = str(error)
        await self._discard(name)

    def forget_broken(self, name: TopicName) -> None:
        self.broken.pop(name.full, None)

    async def _discard(self, name: TopicName) -> None:
        """Forget what a failed load of `name` set up."""
        topic = self.topics.pop(name.full, None)
        if topic is None:
            return
        for entry in topic.producers.values():
            self.producers.pop(entry.producer_id, None)
        for sub in topic.subscriptions.values():
            with contextlib.suppress(Exception):
                await sub.dispatcher.close(save=False)
        with contextlib.suppress(Exception):
            await self._close_storage(topic)

    def check_loadable(self, name: TopicName) -> None:
        """FAILED_PRECONDITION for a topic whose load failed at start, saying why."""
        why = self.broken.get(name.full)
        if why is not None:
            raise precondition(f"topic {name} could not be loaded on this broker ({names.clip(why)}); the "
                               "broker serves its other topics: see its log")

    async def load_topic(self, name: TopicName, fence: Fence | None = None, initial_offset: int = 0,
                         gaps: Sequence[Gap] = ()) -> Topic | None:
        """Serve `name` from its metadata: the WAL (recovered, or new at `initial_offset`), its producers,
        subscriptions and cursors. None when the topic has no delivery key (a half-made topic)."""
        ns, short = name.namespace, name.topic
        delivery_kv = await self._store.get(keys.topic_delivery(ns, short))
        if delivery_kv is None:
            log.warning("topic %s has no delivery key; not loaded", name)
            return None
        delivery = TopicDelivery.from_json(delivery_kv.value, key=delivery_kv.key).mode
        producers = await self._store.get_prefix(keys.topic_producers_prefix(ns, short))
        subscriptions = await self._store.get_prefix(keys.topic_subscriptions_prefix(ns, short))
        topic = await self._open_topic(name, delivery, fence, initial_offset, gaps)
        for kv in producers:
            p = Producer.from_json(kv.value, key=kv.key)
            entry = ProducerEntry(p.producer_id, p.producer_name, topic)
            topic.producers[p.producer_name] = entry
            self.producers[p.producer_id] = entry
            self.moved_producers.pop(p.producer_id, None)
        cursors: dict[str, int] = {}
        records: list[SubscriptionRecord] = []
        for kv in subscriptions:
            try:
                _, _, sub_name = keys.parse_subscription_cursor(kv.key)
                cursors[sub_name] = SubscriptionCursor.from_json(kv.value, key=kv.key).offset
            except ValueError:
                records.append(SubscriptionRecord.from_json(kv.value, key=kv.key))
        for rec in records:
            start = cursors[rec.subscription_name] + 1 if rec.subscription_name in cursors else 0
            self._attach_subscription(topic, rec.subscription_name, rec.subscription_type, start)
        self.moved_topics.pop(topic.full, None)
        self.broken.pop(topic.full, None)
        log.info("loaded %s (%s): %d producers, %d subscriptions%s", name, delivery.value,
                 len(topic.producers), len(topic.subscriptions),
                 f", WAL at offset {topic.wal.committed_offset}" if topic.wal else "")
        return topic

    def wal_dir(self, name: TopicName) -> str:
        return os.path.join(self._config.wal_root, name.namespace, name.topic)

    async def _open_topic(self, name: TopicName, delivery: DeliveryMode, fence: Fence | None = None,
                          initial_offset: int = 0, gaps: Sequence[Gap] = ()) -> Topic:
        """`fence` None: standalone's (Unfenced)."""
        wal = None
        if delivery == DeliveryMode.RELIABLE:
            wal = await Wal.open(self.wal_dir(name), self._config.wal, initial_offset=initial_offset)
            report = wal.recovery
            if report.truncated_bytes:
                log.warning("WAL of %s: recovery cut %d bytes (%s)", name, report.truncated_bytes, report)
        fence = fence or Unfenced(self._store)
        if wal is not None:
            fence.next = wal.committed_offset
        topic = Topic(name, delivery, self._policy(name), wal, fence)
        if wal is not None and self.tier is not None:
            topic.log = await self.tier.log_for(name, wal, gaps)
        self.topics[name.full] = topic
        return topic

    async def unload_topic(self, topic: Topic, seal: Callable[[Topic], Awaitable[None]] | None) -> None:
        """Stop serving `topic` here. Clients are told to look it up again: producers' sends get UNAVAILABLE,
        consumers' health checks CLOSE and their streams end. With `seal` (a graceful move), cursors are
        flushed through the topic's fence and `seal` runs before the WAL is deleted; without it (the
        ownership was lost) nothing is written and the WAL stays on disk for orphan recovery."""
        topic.fence.close()
        await topic.fence.settle()
        self.topics.pop(topic.full, None)
        now = time.monotonic()
        self.moved_topics = {k: t for k, t in self.moved_topics.items() if now - t < MOVED_SECONDS}
        self.moved_producers = {k: t for k, t in self.moved_producers.items() if now - t < MOVED_SECONDS}
        self.moved_topics[topic.full] = now
        for entry in topic.producers.values():
            self.producers.pop(entry.producer_id, None)
            self.moved_producers[entry.producer_id] = now
        for sub in list(topic.subscriptions.values()):
            for c in list(sub.consumers):
                self._remove_consumer(c)
            try:
                await sub.dispatcher.close(save=seal is not None)
            except Exception as e:  # the cursor stays where it was last saved: at least once
                log.warning("closing subscription %s of %s: %s", sub.name, topic.full, e)
        topic.subscriptions.clear()
        if topic.wal is not None:
            await topic.wal.sync()
        try:
            if seal is not None:
                await seal(topic)
        finally:
            await self._close_storage(topic)
        if seal is not None and topic.wal is not None:
            await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, topic.wal.directory)
        log.info("unloaded %s (%s)", topic.full, "sealed" if seal is not None else "ownership lost")

    def _policy(self, name: TopicName) -> Policy:
        kv = self._cache.get(keys.namespace_policy(name.namespace))
        return Policy.from_json(kv.value, key=kv.key) if kv is not None else self._config.policy

    # -- topics --------------------------------------------------------------------------------------

    def namespace_exists(self, namespace: str) -> bool:
        return self._cache.get(keys.namespace_policy(namespace)) is not None

    def find(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def exists(self, name: TopicName) -> bool:
        """The topic exists in the metadata (hosted here, elsewhere, or not yet assigned)."""
        return name.full in self.topics or self._cache.get(
            keys.namespace_topic(name.namespace, name.topic)) is not None

    def partitions(self, name: TopicName) -> list[str]:
        """TopicPartitions (docs/WIRE.md C.3): [name] for a topic, else its `-part-N` topics in index order,
        wherever in the cluster they are hosted."""
        if self.exists(name):
            return [name.full]
        found = []
        for kv in self._cache.get_prefix(keys.namespace_topics_prefix(name.namespace)):
            with contextlib.suppress(ValueError):
                ns, short = keys.parse_namespace_topic(kv.key)
                if ns == name.namespace and names.is_partition_of(short, name.topic):
                    found.append(short)
        found.sort(key=names.partition_index)
        return [TopicName(name.namespace, short).full for short in found]

    async def topic_for_producer(self, name: TopicName, delivery: DeliveryMode) -> Topic:
        """The topic, created with `delivery` if it does not exist (producers auto-create, docs/WIRE.md
        C.4)."""
        topic = self.topics.get(name.full)
        if topic is None:
            self.check_loadable(name)
        if topic is None and self.placement.clustered and self.exists(name):
            raise self.placement.taken(name)
        if topic is None:
            lock = self._creating.setdefault(name.full, asyncio.Lock())
            async with lock:
                topic = self.topics.get(name.full) or await self._create(name, delivery)
            self._creating.pop(name.full, None)
        if topic.delivery != delivery:
            raise precondition(f"Producer requested dispatch strategy does not match topic strategy: "
                               f"{name} is {topic.delivery.value}, the producer asked for {delivery.value}")
        return topic

    def topic_for_consumer(self, name: TopicName) -> Topic:
        topic = self.topics.get(name.full)
        if topic is None:
            self.check_loadable(name)
        if topic is None and self.placement.clustered and self.exists(name):
            raise self.placement.taken(name)
        if topic is None:
            raise invalid(f"topic {name} does not exist: consumers never create topics (create it with a "
                          "producer or the admin API first)")
        return topic

    async def _create(self, name: TopicName, delivery: DeliveryMode) -> Topic:
        """All or nothing: the metadata is written, then the WAL opened; should that fail, the metadata and
        whatever the WAL left on disk are removed before the error is answered."""
        names.check_topic(name)  # dead-letter and partition names are made here, not parsed
        ns, short = name.namespace, name.topic
        if not self.namespace_exists(ns):
            raise unavailable(f"Unable to find the namespace {ns}, the topic can be created only for an "
                              "existing namespace")
        base = names.partition_base(short)
        if base is not None and TopicName(ns, base).full in self.topics:
            raise ApiError("ALREADY_EXISTS", f"Cannot create partitioned topic {name}: "
                                             f"{TopicName(ns, base)} exists as a non-partitioned topic")
        if base is None and self.partitions(name):
            raise ApiError("ALREADY_EXISTS", f"Cannot create topic {name}: partitioned topics with this base "
                                             "name already exist")
        root = keys.topic_root(ns, short)
        # Standalone assigns the topic to itself; in a cluster the leader's load manager places it (C.4).
        place = self.placement.place_new(name)
        txn = await self._store.transaction(
            [Compare(root, "version", "==", 0)],
            [Put(root, TopicRoot(0).to_json()), Put(keys.namespace_topic(ns, short), NULL),
             Put(keys.topic_delivery(ns, short), TopicDelivery(delivery).to_json()), place], [])
        if not txn.succeeded:
            raise self.placement.taken(name)

        async def open_here() -> Topic:
            try:
                topic = await self._open_topic(name, delivery)
                if topic.wal is not None and self.tier is not None:
                    await self.tier.attach(topic, None)
            except BaseException as e:
                await self._undo_create(name, e)
                raise
            return topic

        topic = await self.placement.created(name, open_here, self.topics.get)
        log.info("created topic %s (%s)", name, delivery.value)
        return topic

    async def _undo_create(self, name: TopicName, cause: BaseException) -> None:
        """Take back a creation whose storage failed, so that no restart trips over a half-made topic."""
        log.error("creating topic %s failed, undoing it: %s", name, cause)
        await self._discard(name)
        ns, short = name.namespace, name.topic
        try:
            await self._store.transaction([], [
                Delete(keys.topic_prefix(ns, short), prefix=True), Delete(keys.topic_root(ns, short)),
                Delete(keys.namespace_topic(ns, short)),
                Delete(keys.broker_topic(self.broker_id, ns, short))], [])
        except MetadataError as e:  # the topic then fails to load at the next start, alone (see _load)
            log.error("undoing the creation of %s: its metadata stays: %s", name, e)
        directory = self.wal_dir(name)
        await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(shutil.rmtree, directory, ignore_errors=True))

    async def create_topic(self, name: TopicName, delivery: DeliveryMode) -> Topic:
        """The admin API's CreateTopic: like a producer's auto-creation, but an existing topic is an error."""
        if name.full in self.topics:
            raise ApiError("ALREADY_EXISTS", f"topic {name} already exists")
        return await self.topic_for_producer(name, delivery)

    async def delete_topic(self, topic: Topic) -> None:
        """Remove the topic, its subscriptions, cursors and stored messages. Producers and consumers go with
        it: their health checks answer CLOSE and consumer streams end with OK, so clients notice (C.12)."""
        ns, short = topic.name.namespace, topic.name.topic
        await self._store.transaction([], [
            Delete(keys.topic_prefix(ns, short), prefix=True), Delete(keys.topic_root(ns, short)),
            Delete(keys.namespace_topic(ns, short)), Delete(keys.unassigned(ns, short)),
            Delete(keys.storage_topic_prefix(ns, short), prefix=True),
            Delete(keys.broker_topic(self.broker_id, ns, short))], [])
        self.topics.pop(topic.full, None)
        for entry in topic.producers.values():
            self.producers.pop(entry.producer_id, None)
        for sub in list(topic.subscriptions.values()):
            for c in list(sub.consumers):
                self._remove_consumer(c)
            await sub.dispatcher.close(save=False)
        topic.subscriptions.clear()
        await self._close_storage(topic)  # the uploader stops before the topic's objects go
        if topic.wal is not None:
            await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, topic.wal.directory)
            if self.tier is not None:
                await self.tier.forget(topic.name)
        log.info("deleted topic %s", topic.full)

    async def _close_storage(self, topic: Topic) -> None:
        """The uploader stops (an upload in progress is abandoned; its data stays in the WAL), then the WAL
        is fsynced and closed."""
        if self.tier is not None:
            await self.tier.detach(topic)
        if topic.wal is not None:
            await topic.wal.close()

    async def unsubscribe(self, topic: Topic, name: str) -> None:
        sub = topic.subscriptions.get(name)
        if sub is None:
            raise not_found(f"subscription {names.clip(name)!r} does not exist on {topic.full}")
        if any(c.active for c in sub.consumers):
            raise not_found(f"subscription {name!r} on {topic.full} has active consumers")
        await self._delete_subscription(topic, sub)

    async def create_namespace(self, namespace: str) -> None:
        key = keys.namespace_policy(namespace)
        txn = await self._store.transaction([Compare(key, "version", "==", 0)],
                                            [Put(key, self._config.policy.to_json())], [])
        if not txn.succeeded:
            raise ApiError("ALREADY_EXISTS", f"namespace {namespace} already exists")
        await self._cache.wait_for_revision(txn.revision, CACHE_WAIT, key=key)

    async def delete_namespace(self, namespace: str) -> None:
        if not self.namespace_exists(namespace):
            raise not_found(f"namespace {namespace} does not exist")
        if any(t.name.namespace == namespace for t in self.topics.values()):
            raise precondition(f"namespace {namespace} still has topics: delete them first")
        txn = await self._store.transaction([], [Delete(keys.namespace_prefix(namespace), prefix=True)], [])
        await self._cache.wait_for_revision(txn.revision, CACHE_WAIT)

    def namespaces(self) -> list[str]:
        found = []
        for kv in self._cache.get_prefix(keys.namespaces_prefix()):
            with contextlib.suppress(ValueError):
                found.append(keys.parse_namespace_policy(kv.key))
        return sorted(found)

    def namespace_policy(self, namespace: str) -> Policy:
        kv = self._cache.get(keys.namespace_policy(namespace))
        if kv is None:
            raise not_found(f"namespace {namespace} does not exist")
        return Policy.from_json(kv.value, key=kv.key)

    # -- producers -----------------------------------------------------------------------------------

    async def add_producer(self, topic: Topic, producer_name: str, access_mode: int) -> int:
        """The producer's id; the existing one for a name already on the topic (docs/WIRE.md C.5)."""
        names.check_name(producer_name, "producer name")
        entry = topic.producers.get(producer_name)
        if entry is not None:
            return entry.producer_id
        limit = topic.policy.max_producers_per_topic
        if limit and len(topic.producers) >= limit:
            raise exhausted(f"topic {topic.full} has reached max_producers_per_topic ({limit})")
        pid = new_id(self.producers)
        mode = ProducerAccessMode(access_mode) if access_mode in (0, 1) else ProducerAccessMode.SHARED
        record = Producer(mode, pid, producer_name, True, topic.full)
        key = keys.topic_producer(topic.name.namespace, topic.name.topic, pid)
        await self._store.put(key, record.to_json())
        entry = ProducerEntry(pid, producer_name, topic)
        topic.producers[producer_name] = entry
        self.producers[pid] = entry
        return pid

    def producer(self, producer_id: int) -> ProducerEntry:
        entry = self.producers.get(producer_id)
        if entry is None and producer_id in self.moved_producers:
            raise unavailable(f"the topic of producer {producer_id} moved to another broker: redo the lookup")
        if entry is None:
            raise not_found(f"The producer with id {producer_id} does not exist")
        return entry

    # -- consumers -----------------------------------------------------------------------------------

    async def subscribe(self, topic: Topic, req: pb.ConsumerRequest) -> int:
        names.check_name(req.subscription, "ConsumerRequest.subscription", slash=False)
        names.check_name(req.consumer_name, "ConsumerRequest.consumer_name")
        if len(req.key_filters) > MAX_KEY_FILTERS:
            raise invalid(f"ConsumerRequest.key_filters has {len(req.key_filters)} filters: at most "
                          f"{MAX_KEY_FILTERS}")
        for pattern in req.key_filters:
            if len(pattern) > names.MAX_NAME_BYTES:
                raise invalid(f"a key filter of {len(pattern)} characters: at most {names.MAX_NAME_BYTES}")
        if req.subscription_type not in (0, 1, 2, 3):
            raise invalid(f"unknown subscription type {req.subscription_type} (0..3: Exclusive, Shared, "
                          "Failover, KeyShared)")
        sub = topic.subscriptions.get(req.subscription)
        if sub is not None:
            await self._per_message(topic, sub)
            existing = sub.by_name(req.consumer_name)
            if existing is not None:  # takeover by name (docs/WIRE.md C.7 step 2)
                existing.key_filters = list(req.key_filters)
                sub.takeover(existing)
                self._expect_stream(existing)
                return existing.id
        policy = topic.policy
        if sub is None and policy.max_subscriptions_per_topic and \
                len(topic.subscriptions) >= policy.max_subscriptions_per_topic:
            raise denied(f"Not allowed to create the subscription for the topic: {topic.full} (it has "
                         f"reached max_subscriptions_per_topic, {policy.max_subscriptions_per_topic})")
        if policy.max_consumers_per_topic and topic.consumer_count() >= policy.max_consumers_per_topic:
            raise exhausted(f"topic {topic.full} has reached max_consumers_per_topic "
                            f"({policy.max_consumers_per_topic})")
        if sub is None:
            sub = await self._create_subscription(topic, req.subscription,
                                                  SubscriptionType(req.subscription_type), req.consumer_name)
        for old in sub.check_admits(req.consumer_name, policy.max_consumers_per_subscription):
            self._remove_consumer(old)
        cid = new_id(self.consumers)
        consumer = Consumer(cid, req.consumer_name, sub, list(req.key_filters), self._config.dispatch.window)
        self.consumers[cid] = consumer
        sub.add(consumer)
        self._expect_stream(consumer)
        return cid

    def _expect_stream(self, consumer: Consumer) -> None:
        """A consumer starts active so that messages queue for it before its stream opens (docs/WIRE.md C.7);
        one that never opens a stream (its process died after Subscribe) must not hold an Exclusive or
        Failover subscription, nor its messages, for ever."""
        generation = consumer.generation

        def check() -> None:
            if consumer.generation == generation and not consumer.streaming and consumer.active \
                    and not consumer.removed:
                consumer.active = False
                consumer.subscription.stream_ended(consumer)

        asyncio.get_running_loop().call_later(STREAM_WAIT, check)

    def consumer(self, consumer_id: int) -> Consumer:
        c = self.consumers.get(consumer_id)
        if c is None:
            raise not_found(f"The consumer with the id {consumer_id} does not exist")
        return c

    def _remove_consumer(self, consumer: Consumer) -> None:
        self.consumers.pop(consumer.id, None)
        consumer.subscription.remove(consumer)
        now = time.monotonic()
        self.gone[consumer.id] = (now, asyncio.Event())
        for cid in [cid for cid, (when, _) in self.gone.items() if now - when > TOMBSTONE_SECONDS]:
            del self.gone[cid]

    def told_close(self, consumer_id: int) -> None:
        """A health check answered CLOSE for `consumer_id`."""
        entry = self.gone.get(consumer_id)
        if entry is not None:
            entry[1].set()

    async def _create_subscription(self, topic: Topic, name: str, kind: SubscriptionType,
                                   consumer_name: str) -> Subscription:
        """Persist the subscription and its start before Subscribe answers (docs/WIRE.md C.7): a new one
        starts at the latest offset, written as the cursor `latest - 1` so that a restart cannot move it
        forward."""
        ns, short = topic.name.namespace, topic.name.topic
        start = topic.wal.committed_offset if topic.wal is not None else 0
        record = SubscriptionRecord(None, consumer_name, name, kind)
        ops = [Put(keys.topic_subscription(ns, short, name), record.to_json())]
        if start > 0:
            cursor = SubscriptionCursor(start - 1)
            ops.append(Put(keys.subscription_cursor(ns, short, name), cursor.to_json()))
        await self._store.transaction([], ops, [])
        return self._attach_subscription(topic, name, kind, start)

    def _attach_subscription(self, topic: Topic, name: str, kind: SubscriptionType, start: int
                             ) -> Subscription:
        sub = Subscription(topic.full, name, kind)
        if topic.wal is not None:
            sub.dispatcher = self._reliable(topic, sub, start)
        else:
            dispatch = self._config.dispatch
            sub.dispatcher = LiveDispatcher(sub, dispatch.buffer, dispatch.window_bytes, self.budget)
        topic.subscriptions[name] = sub
        return sub

    def _cursor_saver(self, topic: Topic, name: str) -> Callable[[int], Awaitable[None]]:
        cursor_key = keys.subscription_cursor(topic.name.namespace, topic.name.topic, name)

        async def save_cursor(offset: int) -> None:
            value = SubscriptionCursor(offset).to_json()
            await topic.fence.write([Put(cursor_key, value)])  # fenced: a deposed owner cannot move it

        return save_cursor

    def _reliable(self, topic: Topic, sub: Subscription, start: int) -> ReliableDispatcher:
        assert topic.log is not None

        async def dead_letter(msg: pb.StreamMessage) -> None:
            await self._dead_letter(topic, msg)

        return ReliableDispatcher(sub, topic.log, self._config.dispatch, max(start, topic.log.start_offset),
                                  self._cursor_saver(topic, sub.name), dead_letter,
                                  topic.policy.max_subscription_dispatch_rate, self.budget)

    async def subscribe_batches(self, topic: Topic, name: str, consumer_name: str) -> BatchDispatcher:
        """The fast API's consumer: the subscription `name` served by batches to one stream. An existing
        per-message subscription is taken over (same cursor) when none of its consumers is active."""
        if topic.log is None:
            raise precondition(f"topic {topic.full} is NonReliable: the fast API consumes Reliable topics")
        names.check_name(name, "Subscribe.subscription", slash=False)
        names.check_name(consumer_name, "Subscribe.consumer_name")
        sub = topic.subscriptions.get(name)
        if sub is None:
            sub = await self._create_subscription(topic, name, SubscriptionType.EXCLUSIVE, consumer_name)
        current = sub.dispatcher
        if isinstance(current, BatchDispatcher):
            if current.holder:
                raise denied(f"Not able to subscribe to the topic {topic.full} due to: subscription "
                             f"{name!r} is held by another fast consumer")
            return current
        if any(c.active for c in sub.consumers):
            raise denied(f"Not able to subscribe to the topic {topic.full} due to: subscription {name!r} "
                         "has active Danube API consumers")
        assert isinstance(current, ReliableDispatcher)  # a topic with a WAL has no live dispatchers
        for c in list(sub.consumers):
            self._remove_consumer(c)
        await current.close()
        start = max(current.cursor + 1, topic.log.start_offset)
        batches = BatchDispatcher(sub, topic.log, self._config.dispatch, start,
                                  self._cursor_saver(topic, name), self.budget)
        sub.dispatcher = batches
        return batches

    async def _per_message(self, topic: Topic, sub: Subscription) -> None:
        """A Danube API consumer joins a subscription last served by batches: back to per-message
        dispatch from the same cursor, unless a fast consumer still streams from it."""
        current = sub.dispatcher
        if not isinstance(current, BatchDispatcher):
            return
        if current.holder:
            raise denied(f"Not able to subscribe to the topic {topic.full} due to: subscription "
                         f"{sub.name!r} is held by a fast-API consumer")
        await current.close()
        sub.dispatcher = self._reliable(topic, sub, current.cursor + 1)

    async def _dead_letter(self, topic: Topic, msg: pb.StreamMessage) -> None:
        dlq = await self.topic_for_producer(names.dead_letter_topic(topic.name), DeliveryMode.RELIABLE)
        await dlq.publish(msg)

    async def _delete_subscription(self, topic: Topic, sub: Subscription) -> None:
        ns, short = topic.name.namespace, topic.name.topic
        await self._store.transaction([], [Delete(keys.subscription_cursor(ns, short, sub.name)),
                                           Delete(keys.topic_subscription(ns, short, sub.name))], [])
        for c in list(sub.consumers):
            self._remove_consumer(c)
        topic.subscriptions.pop(sub.name, None)
        await sub.dispatcher.close(save=False)

    async def _reap_idle(self) -> None:
        """NonReliable subscriptions without an active consumer for `idle_subscription_ms` go (C.9): nothing
        is stored for them, so nothing is lost; Reliable ones keep their cursor until unsubscribed."""
        idle = self._config.dispatch.idle_subscription_ms / 1000
        while True:
            await asyncio.sleep(max(1.0, idle / 2))
            now = time.monotonic()
            for topic in list(self.topics.values()):
                if topic.reliable:
                    continue
                for sub in list(topic.subscriptions.values()):
                    if sub.idle_since is not None and now - sub.idle_since > idle:
                        try:
                            await self._delete_subscription(topic, sub)
                            log.info("reaped idle subscription %s on %s", sub.name, topic.full)
                        except Exception as e:
                            log.warning("reaping subscription %s on %s: %s", sub.name, topic.full, e)

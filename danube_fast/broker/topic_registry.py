"""The topics this broker serves: their life (load, create, unload, delete) and how services find them.

TopicRegistry owns the map of served topics, the creation locks and the topics whose load failed; its parts
are given to it: the namespaces (namespaces.py), the WALs (storage/log_manager.py), the object tier
(tiering.py), the placement (ownership.py) and the producers and consumers by id (clients.py). It builds the
subscriptions (subscriptions.py), which need it back for dead letters. Services find topics through `find`,
`served` and `names`, never through the map itself.

Ownership: everything here lives on the event loop; the metadata store is written first and memory changed
after the write succeeded, so a failed write leaves nothing half-made. Standalone mode serves every topic of
the store: on start it loads their WALs, producers, subscriptions and cursors, which is how a restart (after
SIGTERM or SIGKILL) picks up where the last run stopped. In cluster mode the reconciler loads what the
placement assigns here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from danube_fast import names
from danube_fast.broker.clients import Clients
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.dispatch.budget import ByteBudget
from danube_fast.broker.dispatch.cursor import Delayed
from danube_fast.broker.keyed_locks import KeyedLocks
from danube_fast.broker.namespaces import Namespaces
from danube_fast.broker.ownership import Fence, Placement, Unfenced
from danube_fast.broker.subscriptions import Subscriptions
from danube_fast.broker.tiering import Tier, WalOnly
from danube_fast.broker.topic import ProducerEntry, ReliableTopic, Topic, check_served, new_topic, stored
from danube_fast.errors import ApiError, exhausted, invalid, not_found, precondition, unavailable
from danube_fast.meta import keys
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import (
    JSON,
    NULL,
    DeliveryMode,
    Producer,
    ProducerAccessMode,
    SubscriptionCursor,
    SubscriptionDelayed,
    SubscriptionRecord,
    TopicDelivery,
    TopicRoot,
)
from danube_fast.meta.store import Compare, Delete, KeyValue, MetadataError, MetadataStore, Put
from danube_fast.names import TopicName
from danube_fast.storage.gaps import Gap
from danube_fast.storage.log_manager import LogManager

log = logging.getLogger("danube_fast.broker")


def partition_prefix(name: TopicName) -> str:
    """The namespace-topic keys that can be `name`'s partitions (`{topic}-part-...`)."""
    return keys.namespace_topic(name.namespace, f"{name.topic}-part-")


def partitions_in(found: Sequence[KeyValue], name: TopicName) -> list[str]:
    """The full names of `name`'s partitions among the keys under partition_prefix(name), in index order."""
    shorts = []
    for kv in found:
        with contextlib.suppress(ValueError):
            ns, short = keys.parse_namespace_topic(kv.key)
            if ns == name.namespace and names.is_partition_of(short, name.topic):
                shorts.append(short)
    shorts.sort(key=names.partition_index)
    return [TopicName(name.namespace, short).full for short in shorts]


class TopicRegistry:
    def __init__(self, config: BrokerConfig, store: MetadataStore, cache: LocalCache, namespaces: Namespaces,
                 logs: LogManager, tier: Tier | WalOnly, placement: Placement, clients: Clients,
                 budget: ByteBudget, broker_id: int) -> None:
        """`cache` watches `/namespaces/` (where topics are listed); `budget`: the bytes every dispatcher
        holds for delivery, against [dispatch] broker_bytes (dispatch/budget.py)."""
        self._config = config
        self._store = store
        self._cache = cache
        self._namespaces = namespaces
        self._logs = logs
        self._tier = tier
        self._placement = placement
        self._clients = clients
        self.broker_id = broker_id
        self._topics: dict[str, Topic] = {}
        self._creating = KeyedLocks()  # topic names being created
        self._adding = KeyedLocks()  # (topic, producer name) being registered
        self._deleting: dict[str, asyncio.Event] = {}  # topics whose delete runs here, set when it ends
        # Topics whose load failed (their WAL cannot be opened, their metadata cannot be read) -> why. They
        # are logged and refused with FAILED_PRECONDITION; every other topic is served.
        self._broken: dict[str, str] = {}
        self.subscriptions = Subscriptions(config, store, clients, budget, self.topic_for_producer,
                                           self.served)

    async def start(self) -> None:
        """Standalone mode (`LocalPlacement`) loads every topic of the store here; in cluster mode the
        reconciler loads the topics assigned to this broker once it is a member."""
        if not self._placement.clustered:
            await self._load()
        self.subscriptions.start()
        self._logs.start()

    def stop_streams(self) -> None:
        self.subscriptions.stop_streams()

    async def close(self) -> None:
        """Stop dispatching, persist every cursor, fsync and close every WAL."""
        await self.subscriptions.stop()
        await self._logs.stop()
        for c in self._clients.consumers():
            c.end_streams()
        for topic in self._topics.values():
            for sub in topic.subscriptions.values():
                async with sub.swapping:  # a seek in progress ends first
                    sub.closed = True
                    try:
                        await sub.dispatcher.close()
                    except Exception as e:  # keep closing the others; the WAL still holds the data
                        log.error("closing subscription %s on %s: %s", sub.name, topic.full, e)
            await self._close_storage(topic)

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
                if topic is not None:
                    await self._attach_tier(topic)
            except Exception as e:
                if isinstance(e, MetadataError) and e.retriable:
                    raise  # the store itself is down: no topic can load
                await self.mark_broken(name, e)
        if self._broken:
            log.error("%d topics could not be loaded: %s", len(self._broken), ", ".join(sorted(self._broken)))

    async def mark_broken(self, name: TopicName, error: Exception) -> None:
        """One topic's storage failed to load: it must not keep the broker from serving the others."""
        log.error("cannot load topic %s, serving the other topics without it: %s", name, error)
        self._broken[name.full] = str(error)
        await self._discard(name)

    def forget_broken(self, name: TopicName) -> None:
        self._broken.pop(name.full, None)

    def broken(self) -> list[str]:
        """The topics whose load failed, by full name."""
        return sorted(self._broken)

    async def _discard(self, name: TopicName) -> None:
        """Forget what a failed load of `name` set up. Its consumers are removed as at an unload (their
        streams end, health checks say CLOSE), so their clients look the topic up again instead of waiting
        on an instance that is gone; nothing is saved."""
        topic = self._topics.pop(name.full, None)
        if topic is None:
            return
        topic.gone = "broken"
        self._clients.forget_producers(topic)
        with contextlib.suppress(Exception):
            await self.subscriptions.close(topic, save=False)
        with contextlib.suppress(Exception):
            await self._close_storage(topic)

    def check_loadable(self, name: TopicName) -> None:
        """FAILED_PRECONDITION for a topic whose load failed at start, saying why."""
        why = self._broken.get(name.full)
        if why is not None:
            raise precondition(f"topic {name} could not be loaded on this broker ({names.clip(why)}); the "
                               "broker serves its other topics: see its log")

    async def load_topic(self, name: TopicName, fence: Fence | None = None, initial_offset: int = 0,
                         gaps: Sequence[Gap] = (), sequences: JSON = None,
                         prepare: Callable[[Topic], Awaitable[None]] | None = None) -> Topic | None:
        """Serve `name` from its metadata: the WAL (recovered, or new at `initial_offset`), its producers,
        subscriptions and cursors, and the idempotent producers' table a move carried (`sequences`); with
        `prepare`, what must hold before anyone finds the topic (its schema configuration), awaited before
        it is served. None when the topic has no delivery key (a half-made topic)."""
        ns, short = name.namespace, name.topic
        delivery_kv = await self._store.get(keys.topic_delivery(ns, short))
        if delivery_kv is None:
            log.warning("topic %s has no delivery key; not loaded", name)
            return None
        delivery = TopicDelivery.from_json(delivery_kv.value, key=delivery_kv.key).mode
        producers = await self._store.get_prefix(keys.topic_producers_prefix(ns, short))
        subscriptions = await self._store.get_prefix(keys.topic_subscriptions_prefix(ns, short))
        topic = await self._open_topic(name, delivery, fence, initial_offset, gaps, sequences, prepare)
        for kv in producers:
            p = Producer.from_json(kv.value, key=kv.key)
            entry = ProducerEntry(p.producer_id, p.producer_name, topic)
            topic.add_producer(entry)
            self._clients.add_producer(entry)
        cursors: dict[str, int] = {}
        delays: dict[str, Delayed] = {}
        records: list[SubscriptionRecord] = []
        for kv in subscriptions:  # keys by their shape: a subscription may be named "cursor"
            if (sub_name := _named(keys.parse_subscription_cursor, kv.key)) is not None:
                cursors[sub_name] = SubscriptionCursor.from_json(kv.value, key=kv.key).offset
            elif (sub_name := _named(keys.parse_subscription_delayed, kv.key)) is not None:
                state = SubscriptionDelayed.from_json(kv.value, key=kv.key)
                delays[sub_name] = Delayed(state.from_offset, state.from_time)
            else:
                records.append(SubscriptionRecord.from_json(kv.value, key=kv.key))
        for rec in records:
            start = cursors[rec.subscription_name] + 1 if rec.subscription_name in cursors else 0
            self.subscriptions.attach(topic, rec.subscription_name, rec.subscription_type, start,
                                      delays.get(rec.subscription_name))
        self._clients.came_back(topic.full)
        self._broken.pop(topic.full, None)
        log.info("loaded %s (%s): %d producers, %d subscriptions%s", name, delivery.value,
                 len(topic.producers), len(topic.subscriptions), topic.describe())
        return topic

    async def _open_topic(self, name: TopicName, delivery: DeliveryMode, fence: Fence | None = None,
                          initial_offset: int = 0, gaps: Sequence[Gap] = (), sequences: JSON = None,
                          prepare: Callable[[Topic], Awaitable[None]] | None = None) -> Topic:
        """`fence` None: standalone's (Unfenced)."""
        wal = readable = None
        if delivery == DeliveryMode.RELIABLE:
            wal = await self._logs.open(name, initial_offset)
            readable = await self._tier.log_for(name, wal, gaps)
        policy = await self._namespaces.read_topic_policy(name)
        topic = new_topic(name, delivery, policy, fence or Unfenced(self._store), wal, readable)
        if readable is not None:
            reliable = topic.require_stored("a topic with a WAL")
            if sequences is not None:
                reliable.sequences.restore(sequences)  # before the topic is served: no batch can come first
            reliable.sequences.with_tier(readable, self._config.cluster.producer_gap_wait_ms / 1000)
        if prepare is not None:
            try:
                await prepare(topic)
            except BaseException:
                await self._close_storage(topic)  # nobody found it: nothing else would close its WAL
                raise
        self._topics[name.full] = topic
        return topic

    async def unload_topic(self, topic: Topic, seal: Callable[[Topic], Awaitable[bool]] | None) -> None:
        """Stop serving `topic` here. Clients are told to look it up again: producers' sends get UNAVAILABLE,
        consumers' health checks CLOSE and their streams end. With `seal` (a graceful move), cursors are
        flushed through the topic's fence and `seal` runs before the WAL is deleted (unless it returns
        True: the caller keeps the closed WAL); without it (the ownership was lost) nothing is written and
        the WAL stays on disk for orphan recovery."""
        topic.gone = "unloaded"
        topic.fence.close()
        await topic.fence.settle()
        self._topics.pop(topic.full, None)
        self._clients.moved_away(topic)
        await self.subscriptions.close(topic, save=seal is not None)
        reliable = stored(topic)
        if reliable is not None:
            await reliable.wal.sync()
        kept = False
        try:
            if seal is not None:
                kept = await seal(topic)
        finally:
            await self._close_storage(topic)
        if seal is not None and reliable is not None and not kept:
            await self._logs.remove(topic.name)
        log.info("unloaded %s (%s)", topic.full, "sealed" if seal is not None else "ownership lost")

    # -- topics --------------------------------------------------------------------------------------

    def find(self, name: str) -> Topic | None:
        return self._topics.get(name)

    def served(self) -> list[Topic]:
        """The topics this broker serves now."""
        return list(self._topics.values())

    def stored(self) -> list[ReliableTopic]:
        """The served topics that keep their records (Reliable)."""
        return [r for t in self._topics.values() if (r := stored(t)) is not None]

    def names(self) -> list[str]:
        """The full names of the topics this broker serves now, sorted."""
        return sorted(self._topics)

    def exists(self, name: TopicName) -> bool:
        """The topic exists in the metadata (hosted here, elsewhere, or not yet assigned)."""
        return name.full in self._topics or self._cache.get(
            keys.namespace_topic(name.namespace, name.topic)) is not None

    def partitions(self, name: TopicName) -> list[str]:
        """TopicPartitions (docs/WIRE.md C.3): [name] for a topic, else its `-part-N` topics in index order,
        wherever in the cluster they are hosted."""
        if self.exists(name):
            return [name.full]
        # Only the keys that can be this topic's partitions (`{topic}-part-...`): a creation must not scan the
        # whole namespace, or creating N topics costs N^2.
        return partitions_in(self._cache.get_prefix(partition_prefix(name)), name)

    async def topic_for_producer(self, name: TopicName, delivery: DeliveryMode) -> Topic:
        """The topic, created with `delivery` if it does not exist (producers auto-create, docs/WIRE.md
        C.4)."""
        return await self._topic(name, delivery, new=False)

    async def _topic(self, name: TopicName, delivery: DeliveryMode, new: bool) -> Topic:
        """The topic, created with `delivery` if it does not exist; `new`: ALREADY_EXISTS if it does (also
        when another call created it meanwhile)."""
        topic = self._topics.get(name.full)
        if topic is None and self._placement.clustered:
            # A moved topic's producers come as soon as a lookup names this broker, some ms before its
            # load ends: they wait for it here rather than retry later (the client backs off 20 ms, 40 ms).
            self.check_loadable(name)
            topic = await self._placement.loading_here(name, self._topics.get)
        if topic is None:
            topic = self._served_here(name)
        if topic is None:
            async with self._creating.hold(name.full):
                topic = self._topics.get(name.full)
                if topic is None:
                    return await self._create(name, delivery)
        if new:
            raise ApiError("ALREADY_EXISTS", f"topic {name} already exists")
        if topic.delivery != delivery:
            raise precondition(f"Producer requested dispatch strategy does not match topic strategy: "
                               f"{name} is {topic.delivery.value}, the producer asked for {delivery.value}")
        return topic

    def _served_here(self, name: TopicName) -> Topic | None:
        """The topic if this broker serves it; None if it may be made here; else why not (its load failed,
        or another broker serves it)."""
        topic = self._topics.get(name.full)
        if topic is None:
            self.check_loadable(name)
            if self._placement.clustered and self.exists(name):
                raise self._placement.taken(name)
        return topic

    def topic_for_consumer(self, name: TopicName) -> Topic:
        topic = self._served_here(name)
        if topic is None:
            raise invalid(f"topic {name} does not exist: consumers never create topics (create it with a "
                          "producer or the admin API first)")
        return topic

    async def _create(self, name: TopicName, delivery: DeliveryMode) -> Topic:
        """All or nothing: the metadata is written, then the WAL opened; should that fail, the metadata and
        whatever the WAL left on disk are removed before the error is answered."""
        names.check_topic(name)  # dead-letter and partition names are made here, not parsed
        ns, short = name.namespace, name.topic
        if not self._namespaces.exists(ns):
            raise unavailable(f"Unable to find the namespace {ns}, the topic can be created only for an "
                              "existing namespace")
        base = names.partition_base(short)
        if base is not None and TopicName(ns, base).full in self._topics:
            raise ApiError("ALREADY_EXISTS", f"Cannot create partitioned topic {name}: "
                                             f"{TopicName(ns, base)} exists as a non-partitioned topic")
        if base is None and self.partitions(name):
            raise ApiError("ALREADY_EXISTS", f"Cannot create topic {name}: partitioned topics with this base "
                                             "name already exist")
        root = keys.topic_root(ns, short)
        # The checks above read memory; these compares make them hold against a creation elsewhere (another
        # broker, another call) and a namespace deleted meanwhile.
        other = _counterpart_root(ns, short, base)
        compares = [Compare(root, "version", "==", 0), Compare(keys.namespace_policy(ns), "version", ">", 0),
                    Compare(other, "version", "==", 0)]
        # Standalone assigns the topic to itself; in a cluster the leader's load manager places it (C.4).
        place = self._placement.place_new(name)
        txn = await self._store.transaction(
            compares,
            [Put(root, TopicRoot(0).to_json()), Put(keys.namespace_topic(ns, short), NULL),
             Put(keys.topic_delivery(ns, short), TopicDelivery(delivery).to_json()), place], [])
        if not txn.succeeded:
            raise await self._refused_creation(name, base, other)

        async def open_here() -> Topic:
            try:
                topic = await self._open_topic(name, delivery)
                await self._attach_tier(topic)
            except BaseException as e:
                await self._undo_create(name, e)
                raise
            return topic

        topic = await self._placement.created(name, open_here, self._topics.get)
        log.info("created topic %s (%s)", name, delivery.value)
        return topic

    async def _refused_creation(self, name: TopicName, base: str | None, other: str) -> ApiError:
        """Why the creation's transaction failed, from what the store holds now."""
        ns, short = name.namespace, name.topic
        if await self._store.get(keys.topic_root(ns, short)) is not None:
            return self._placement.taken(name)
        if await self._store.get(keys.namespace_policy(ns)) is None:
            return unavailable(f"Unable to find the namespace {ns}, the topic can be created only for an "
                               "existing namespace")
        if base is not None:
            return ApiError("ALREADY_EXISTS", f"Cannot create partitioned topic {name}: "
                                              f"{TopicName(ns, base)} exists as a non-partitioned topic")
        return ApiError("ALREADY_EXISTS", f"Cannot create topic {name}: partitioned topics with this base "
                                          f"name already exist ({other})")

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
        await self._logs.remove(name, best_effort=True)

    async def create_topic(self, name: TopicName, delivery: DeliveryMode) -> Topic:
        """The admin API's CreateTopic: like a producer's auto-creation, but an existing topic is an error."""
        return await self._topic(name, delivery, new=True)

    async def delete_topic(self, topic: Topic) -> None:
        """Remove the topic, its subscriptions, cursors and stored messages. Producers and consumers go with
        it: their health checks answer CLOSE and consumer streams end with OK, so clients notice (C.12)."""
        if topic.gone == "deleted":
            raise not_found(f"topic {topic.full} is being deleted")
        if topic.gone is not None:  # a move's seal or a lost ownership is taking it apart: not twice
            raise unavailable(f"topic {topic.full} is being {topic.gone} here: look it up again")
        topic.gone = "deleted"  # before the write: a subscription or producer written meanwhile is undone
        self._deleting[topic.full] = done = asyncio.Event()
        try:
            await self._delete(topic)
        finally:
            del self._deleting[topic.full]
            done.set()

    async def settled(self, name: TopicName) -> None:
        """Once no delete of `name` runs here (at once when none does): the cluster's reconciler, which
        hears of the deleted assignment while the delete still runs, leaves the topic to it."""
        done = self._deleting.get(name.full)
        if done is not None:
            await done.wait()

    async def _delete(self, topic: Topic) -> None:
        ns, short = topic.name.namespace, topic.name.topic
        try:
            await self._store.transaction([], [
                Delete(keys.topic_prefix(ns, short), prefix=True), Delete(keys.topic_root(ns, short)),
                Delete(keys.namespace_topic(ns, short)), Delete(keys.unassigned(ns, short)),
                Delete(keys.storage_topic_prefix(ns, short), prefix=True), Delete(keys.replicas(ns, short)),
                Delete(keys.broker_topic(self.broker_id, ns, short))], [])
        except BaseException:
            topic.gone = None
            raise
        self._topics.pop(topic.full, None)
        self._clients.forget_producers(topic)
        await self.subscriptions.close(topic, save=False)
        await self._close_storage(topic)  # the uploader stops before the topic's objects go
        if stored(topic) is not None:
            await self._logs.remove(topic.name)
            await self._tier.forget(topic.name)
        log.info("deleted topic %s", topic.full)

    async def _attach_tier(self, topic: Topic) -> None:
        """A stored topic's uploader starts, from what the object tier's descriptors say it holds."""
        reliable = stored(topic)
        if reliable is not None:
            await self._tier.attach(reliable, None)

    async def _close_storage(self, topic: Topic) -> None:
        """The uploader stops (an upload in progress is abandoned; its data stays in the WAL), then the WAL
        is fsynced and closed."""
        reliable = stored(topic)
        if reliable is not None:
            await self._tier.detach(reliable)
            await self._logs.close(reliable.wal)

    # -- producers -----------------------------------------------------------------------------------

    async def add_producer(self, topic: Topic, producer_name: str, access_mode: int) -> int:
        """The producer's id; the existing one for a name already on the topic (docs/WIRE.md C.5), also when
        two calls for a new name come at once (the second waits for the first's store write)."""
        names.check_name(producer_name, "producer name")
        entry = topic.producers.get(producer_name)
        if entry is not None:
            return entry.producer_id
        async with self._adding.hold((topic.full, producer_name)):
            entry = topic.producers.get(producer_name)
            if entry is not None:
                return entry.producer_id
            limit = topic.policy.max_producers_per_topic
            if limit and len(topic.producers) >= limit:
                raise exhausted(f"topic {topic.full} has reached max_producers_per_topic ({limit})")
            pid = self._clients.new_producer_id()
            mode = ProducerAccessMode(access_mode) if access_mode in (0, 1) else ProducerAccessMode.SHARED
            record = Producer(mode, pid, producer_name, True, topic.full)
            key = keys.topic_producer(topic.name.namespace, topic.name.topic, pid)
            await self._store.put(key, record.to_json())
            await check_served(topic, self._store, [key])
            entry = ProducerEntry(pid, producer_name, topic)
            topic.add_producer(entry)
            self._clients.add_producer(entry)
            return pid


def _counterpart_root(ns: str, short: str, base: str | None) -> str:
    """The root key whose existence rules out creating `short`: its base topic's for a partition, its first
    partition's for a topic (partitions are created from -part-0 up)."""
    return keys.topic_root(ns, base if base is not None else f"{short}-part-0")


def _named(parse: Callable[[str], tuple[str, str, str]], key: str) -> str | None:
    """The subscription a key of the shape `parse` reads names; None for a key of another shape."""
    try:
        return parse(key)[2]
    except ValueError:
        return None

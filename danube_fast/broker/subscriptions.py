"""The subscriptions of this broker's topics: subscribing and unsubscribing, the dispatcher that serves each
one, dead letters, the idle reaper, and the end of every stream when the broker stops.

The topic builds a subscription's dispatcher (topic.py: a NonReliable topic a LiveDispatcher, a Reliable one
a Cursor and a ReliableDispatcher). A Reliable subscription is served per message (Danube API consumers) or
by whole batches to one fast-API stream (BatchDispatcher); it switches between the two here, keeping its
cursor, when a consumer of the other kind subscribes while nobody of the current kind streams.

Ownership: this module adds and removes a topic's subscriptions (through the Topic's methods) and the
consumers in Clients (clients.py); the metadata store is written first and memory changed after the write
succeeded. Everything runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from danube_fast import names
from danube_fast.broker.clients import Clients
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.consumer import Consumer
from danube_fast.broker.dispatch.batches import BatchDispatcher
from danube_fast.broker.dispatch.budget import ByteBudget
from danube_fast.broker.dispatch.cursor import Delayed, Keep, Saver
from danube_fast.broker.dispatch.dispatcher import Dispatcher
from danube_fast.broker.keyed_locks import KeyedLocks
from danube_fast.broker.subscription import Subscription
from danube_fast.broker.topic import DispatchParts, ReliableTopic, Topic, check_served
from danube_fast.errors import already_exists, denied, exhausted, invalid, not_found, unavailable
from danube_fast.meta import keys
from danube_fast.meta.resources import (
    DeliveryMode,
    SubscriptionCursor,
    SubscriptionDelayed,
    SubscriptionRecord,
    SubscriptionType,
)
from danube_fast.meta.store import Delete, MetadataStore, Put
from danube_fast.names import TopicName
from danube_fast.proto import DanubeApi_pb2 as pb

log = logging.getLogger("danube_fast.broker")

STREAM_WAIT = 10.0  # seconds a subscribed consumer may go without opening its stream before it counts as gone
MAX_KEY_FILTERS = 64  # Key-Shared filters per consumer: each is matched against every routing key

TopicForProducer = Callable[[TopicName, DeliveryMode], Awaitable[Topic]]


class Subscriptions:
    def __init__(self, config: BrokerConfig, store: MetadataStore, clients: Clients, budget: ByteBudget,
                 topic_for_producer: TopicForProducer, served: Callable[[], Iterable[Topic]]) -> None:
        """`topic_for_producer`: where dead letters go (created on first use); `served`: the topics this
        broker serves (for the idle reaper)."""
        self._config = config
        self._store = store
        self._clients = clients
        self._budget = budget
        self._topic_for_producer = topic_for_producer
        self._served = served
        self._parts = DispatchParts(config.dispatch, budget, self._cursor_saver, self._dead_letter)
        self._reaper: asyncio.Task[None] | None = None
        self._creating = KeyedLocks()  # (topic, subscription) being written to the store
        self.stopping = False  # the broker is shutting down: fast consumer streams end with UNAVAILABLE

    def start(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_idle(), name="reap-idle-subscriptions")

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None

    def stop_streams(self) -> None:
        """The broker is stopping: every consumer stream ends (with OK, so clients notice and look the topic
        up again, docs/WIRE.md C.8), fast consumers' streams with UNAVAILABLE."""
        self.stopping = True
        for c in self._clients.consumers():
            c.end_streams()
        for topic in self._served():
            for sub in topic.subscriptions.values():
                sub.dispatcher.stop_streams()

    async def close(self, topic: Topic, *, save: bool) -> None:
        """Remove every consumer of `topic` and stop its dispatchers (saving cursors if `save`); a failure to
        save one is logged, and its cursor stays where it was last saved (at least once)."""
        for sub in list(topic.subscriptions.values()):
            for c in list(sub.consumers):
                self._clients.remove_consumer(c)
            async with sub.swapping:
                sub.closed = True
                try:
                    await sub.dispatcher.close(save=save)
                except Exception as e:
                    log.warning("closing subscription %s of %s: %s", sub.name, topic.full, e)
        topic.clear_subscriptions()

    async def subscribe(self, topic: Topic, req: pb.ConsumerRequest, initial: str | None = None) -> int:
        """`initial`: where a subscription this creates starts (earliest, latest or an offset; latest when
        None); an existing one goes on from its cursor."""
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
        policy = topic.policy
        sub = topic.subscriptions.get(req.subscription)
        if sub is None:
            if policy.max_subscriptions_per_topic and \
                    len(topic.subscriptions) >= policy.max_subscriptions_per_topic:
                raise denied(f"Not allowed to create the subscription for the topic: {topic.full} (it has "
                             f"reached max_subscriptions_per_topic, {policy.max_subscriptions_per_topic})")
            self._check_consumers(topic)
            # (or the one a concurrent Subscribe made meanwhile: then it is joined like any existing one)
            sub = await self._create_subscription(topic, req.subscription,
                                                  SubscriptionType(req.subscription_type), req.consumer_name,
                                                  _initial(topic, initial))
        await self._per_message(topic, sub)
        existing = sub.by_name(req.consumer_name)
        if existing is not None:  # takeover by name (docs/WIRE.md C.7 step 2)
            existing.key_filters = list(req.key_filters)
            sub.takeover(existing)
            self._expect_stream(existing)
            return existing.id
        self._check_consumers(topic)
        for old in sub.check_admits(req.consumer_name, policy.max_consumers_per_subscription):
            self._clients.remove_consumer(old)
        cid = self._clients.new_consumer_id()
        consumer = Consumer(cid, req.consumer_name, sub, list(req.key_filters), self._config.dispatch.window)
        self._clients.add_consumer(consumer)
        sub.add(consumer)
        self._expect_stream(consumer)
        return cid

    @staticmethod
    def _check_consumers(topic: Topic) -> None:
        limit = topic.policy.max_consumers_per_topic
        if limit and topic.consumer_count() >= limit:
            raise exhausted(f"topic {topic.full} has reached max_consumers_per_topic ({limit})")

    def _expect_stream(self, consumer: Consumer) -> None:
        """A consumer starts active so that messages queue for it before its stream opens (docs/WIRE.md C.7);
        one that never opens a stream (its process died after Subscribe) must not hold an Exclusive or
        Failover subscription, nor its messages, for ever."""
        generation = consumer.generation

        def check() -> None:
            if consumer.went_quiet(generation):
                consumer.subscription.stream_ended(consumer)

        asyncio.get_running_loop().call_later(STREAM_WAIT, check)

    async def unsubscribe(self, topic: Topic, name: str) -> None:
        sub = topic.subscriptions.get(name)
        if sub is None:
            raise not_found(f"subscription {names.clip(name)!r} does not exist on {topic.full}")
        if any(c.active for c in sub.consumers):
            raise not_found(f"subscription {name!r} on {topic.full} has active consumers")
        await self.delete(topic, sub)

    async def create(self, topic: Topic, name: str, kind: SubscriptionType, start: int) -> Subscription:
        """An operator's subscription, made before its first consumer, whose first delivery is `start`
        (earliest, latest or an offset, resolved by the caller: broker/positions.py)."""
        reliable = topic.require_stored("only a Reliable topic keeps a position to start a subscription at")
        names.check_name(name, "subscription", slash=False)
        if name in reliable.subscriptions or (reliable.full, name) in self._creating:
            raise already_exists(f"subscription {name!r} of {topic.full} exists: move it with seek instead")
        return await self._create_subscription(reliable, name, kind, "", start)

    async def move(self, topic: Topic, sub: Subscription, offset: int) -> None:
        """An operator's seek or skip: `sub` goes on from `offset`, persisted before anything else changes.
        What its consumers hold goes back. Danube API consumers keep their streams and get the records from
        `offset` on them; a fast-API stream ends with UNAVAILABLE, saying why, and its client subscribes
        again at the new position (a batch is delivered whole, so the client must learn where to start)."""
        reliable = topic.require_stored("only a Reliable topic keeps a position to move")
        assert sub.cursor is not None
        async with sub.swapping:
            if sub.closed:
                raise not_found(f"subscription {sub.name!r} of {topic.full} was deleted or its topic left "
                                "this broker meanwhile")
            await self._move(reliable, sub, offset)

    async def _move(self, topic: ReliableTopic, sub: Subscription, offset: int) -> None:
        assert sub.cursor is not None
        current = sub.dispatcher
        again: Callable[[], Dispatcher]
        if isinstance(current, BatchDispatcher):  # replaced by the same kind (kinds switch only here)
            current.moved = (f"subscription {sub.name!r} of {topic.full} was moved to offset {offset} by an "
                             "operator: subscribe again")
            cursor = sub.cursor

            def again() -> Dispatcher:
                return BatchDispatcher(sub, topic.log, self._config.dispatch, cursor, self._budget)
        else:
            def again() -> Dispatcher:
                return topic.per_message(sub, self._parts)
        await current.close(save=False)
        for c in sub.consumers:
            c.drain_queue()
            c.settled_all()
        try:
            await sub.cursor.move_to(offset)
        finally:  # moved or not (the store refused the write), the subscription is served again
            sub.dispatcher = again()
            sub.dispatcher.consumer_changed()

    async def _create_subscription(self, topic: Topic, name: str, kind: SubscriptionType,
                                   consumer_name: str, start: int | None = None) -> Subscription:
        """Persist the subscription and its start before Subscribe answers (docs/WIRE.md C.7): a new one
        starts at the latest offset (or `start`), written as the cursor `start - 1` so that a restart cannot
        move it forward.

        Calls for one new name at once get one subscription: the later ones wait for the first's write and
        return what it made (or make it themselves if that write failed). Each making its own would leave two
        dispatchers delivering the same records, and acks reaching only the one the topic lists."""
        async with self._creating.hold((topic.full, name)):
            sub = topic.subscriptions.get(name)
            if sub is not None:
                return sub
            ns, short = topic.name.namespace, topic.name.topic
            if start is None:
                start = topic.start_offset
            record = SubscriptionRecord(None, consumer_name, name, kind)
            ops = [Put(keys.topic_subscription(ns, short, name), record.to_json())]
            if start > 0:
                cursor = SubscriptionCursor(start - 1)
                ops.append(Put(keys.subscription_cursor(ns, short, name), cursor.to_json()))
            await self._store.transaction([], ops, [])
            await check_served(topic, self._store, [op.key for op in ops])
            return self.attach(topic, name, kind, start)

    def attach(self, topic: Topic, name: str, kind: SubscriptionType, start: int,
               delayed: Delayed | None = None) -> Subscription:
        """`delayed`: its delayed records' stored state (a loaded topic's)."""
        sub = Subscription(topic.full, name, kind)
        sub.dispatcher = topic.dispatcher_for(sub, start, self._parts, delayed)
        topic.add_subscription(sub)
        return sub

    def _cursor_saver(self, topic: Topic, name: str) -> Saver:
        cursor_key = keys.subscription_cursor(topic.name.namespace, topic.name.topic, name)
        delayed_key = keys.subscription_delayed(topic.name.namespace, topic.name.topic, name)

        async def save_cursor(offset: int, delayed: Delayed | Keep | None) -> None:
            # Fenced: a deposed owner cannot move it. No cursor means "from offset 0" (a seek back there).
            ops = [Delete(cursor_key) if offset < 0
                   else Put(cursor_key, SubscriptionCursor(offset).to_json())]
            if delayed is None:
                ops.append(Delete(delayed_key))
            elif isinstance(delayed, Delayed):  # with the floor, in one write: docs/SUBSCRIPTIONS.md
                ops.append(Put(delayed_key, SubscriptionDelayed(delayed.from_offset,
                                                                delayed.from_time).to_json()))
            await topic.fence.write(ops)

        return save_cursor

    async def subscribe_batches(self, topic: Topic, name: str, consumer_name: str,
                                earliest: bool = False) -> BatchDispatcher:
        """The fast API's consumer: the subscription `name` served by batches to one stream. An existing
        per-message subscription is taken over (same cursor) when none of its consumers is active. A new
        one starts at the latest offset, or at the first one kept when `earliest`."""
        reliable = topic.require_stored("the fast API consumes Reliable topics")
        names.check_name(name, "Subscribe.subscription", slash=False)
        names.check_name(consumer_name, "Subscribe.consumer_name")
        sub = reliable.subscriptions.get(name)
        if sub is None:
            start = reliable.log.start_offset if earliest else None
            sub = await self._create_subscription(reliable, name, SubscriptionType.EXCLUSIVE, consumer_name,
                                                  start)
        async with sub.swapping:
            return await self._to_batches(reliable, sub)

    async def _to_batches(self, topic: ReliableTopic, sub: Subscription) -> BatchDispatcher:
        name = sub.name
        if sub.closed:
            raise unavailable(f"subscription {name!r} of {topic.full} is closing here: subscribe again")
        current = sub.dispatcher
        # Which of the two ways a Reliable subscription is served decides what a new consumer may do: the
        # switch between them is this module's, so it asks the dispatcher's type (here and in _per_message).
        if isinstance(current, BatchDispatcher):
            if current.holder:
                raise denied(f"Not able to subscribe to the topic {topic.full} due to: subscription "
                             f"{name!r} is held by another fast consumer")
            return current
        if any(c.active for c in sub.consumers):
            raise denied(f"Not able to subscribe to the topic {topic.full} due to: subscription {name!r} "
                         "has active Danube API consumers")
        for c in list(sub.consumers):
            self._clients.remove_consumer(c)
        await current.close()
        assert sub.cursor is not None
        batches = BatchDispatcher(sub, topic.log, self._config.dispatch, sub.cursor, self._budget)
        sub.dispatcher = batches
        return batches

    async def _per_message(self, topic: Topic, sub: Subscription) -> None:
        """A Danube API consumer joins a subscription last served by batches: back to per-message
        dispatch from the same cursor, unless a fast consumer still streams from it."""
        async with sub.swapping:
            await self._to_per_message(topic, sub)

    async def _to_per_message(self, topic: Topic, sub: Subscription) -> None:
        if sub.closed:
            raise unavailable(f"subscription {sub.name!r} of {topic.full} is closing here: subscribe again")
        current = sub.dispatcher
        if not isinstance(current, BatchDispatcher):  # served per message already (see subscribe_batches)
            return
        if current.holder:
            raise denied(f"Not able to subscribe to the topic {topic.full} due to: subscription "
                         f"{sub.name!r} is held by a fast-API consumer")
        await current.close()
        sub.dispatcher = topic.require_stored("only a Reliable topic is served by batches").per_message(
            sub, self._parts)

    async def _dead_letter(self, topic: Topic, msg: pb.StreamMessage) -> None:
        dlq = await self._topic_for_producer(names.dead_letter_topic(topic.name), DeliveryMode.RELIABLE)
        await dlq.publish(msg)

    async def delete(self, topic: Topic, sub: Subscription) -> None:
        ns, short = topic.name.namespace, topic.name.topic
        await self._store.transaction([], [Delete(keys.subscription_cursor(ns, short, sub.name)),
                                           Delete(keys.subscription_delayed(ns, short, sub.name)),
                                           Delete(keys.topic_subscription(ns, short, sub.name))], [])
        for c in list(sub.consumers):
            self._clients.remove_consumer(c)
        topic.remove_subscription(sub.name)
        async with sub.swapping:
            sub.closed = True
            await sub.dispatcher.close(save=False)

    async def _reap_idle(self) -> None:
        """NonReliable subscriptions without an active consumer for `idle_subscription_ms` go (C.9): nothing
        is stored for them, so nothing is lost; Reliable ones keep their cursor until unsubscribed."""
        idle = self._config.dispatch.idle_subscription_ms / 1000
        while True:
            await asyncio.sleep(max(1.0, idle / 2))
            now = time.monotonic()
            for topic in list(self._served()):
                if topic.reliable:
                    continue
                for sub in list(topic.subscriptions.values()):
                    if sub.idle_since is not None and now - sub.idle_since > idle:
                        try:
                            await self.delete(topic, sub)
                            log.info("reaped idle subscription %s on %s", sub.name, topic.full)
                        except Exception as e:
                            log.warning("reaping subscription %s on %s: %s", sub.name, topic.full, e)


def _initial(topic: Topic, initial: str | None) -> int | None:
    """The first offset of a new subscription asked `initial`; None for the default (latest)."""
    if initial is None or initial == "latest":
        return None
    reliable = topic.require_stored("only a Reliable topic keeps records to start a subscription at "
                                    f"(initial position {names.clip(initial)!r})")
    log = reliable.log
    if initial == "earliest":
        return log.start_offset
    if not initial.isascii() or not initial.isdigit():
        raise invalid(f"initial position {names.clip(initial)!r}: expected earliest, latest or an offset")
    offset = int(initial)
    if not log.start_offset <= offset <= log.committed_offset:
        raise invalid(f"initial position {offset} is outside what {topic.full} holds "
                      f"({log.start_offset}..{log.committed_offset})")
    return offset

"""SubscriptionAdmin on the admin port (proto/SubscriptionAdmin.proto, docs/SUBSCRIPTIONS.md): seek, skip,
peek, create and describe a Reliable topic's subscriptions, and browse its records without one.

A partitioned topic's base name stands for its partitions: each is answered by the broker that serves it
(in a cluster the others are asked through `elsewhere`, cluster/admin/subscriptions.py), one row per
partition. A request's targets are all resolved and checked before any subscription moves, so a position
one partition refuses moves none of this broker's partitions; partitions served by other brokers are moved
by them, each on its own.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from operator import attrgetter

from danube_fast.broker import positions
from danube_fast.broker.context import BrokerContext
from danube_fast.broker.services.forward import is_forwarded
from danube_fast.broker.services.status import Context, unary
from danube_fast.broker.subscription import Subscription
from danube_fast.broker.topic import ReliableTopic, Topic, stored
from danube_fast.client.rpc import M, WireMessage
from danube_fast.errors import invalid, not_found, unavailable
from danube_fast.meta.resources import SubscriptionType
from danube_fast.names import clip, parse_topic
from danube_fast.proto import SubscriptionAdmin_pb2 as pb
from danube_fast.storage.tiered import records_between

MAX_PEEK = 1000
_STORED = attrgetter("stored_topic")
_STORED_AND_NAME = attrgetter("stored_topic", "subscription")
FUTURE_SLACK_MS = 1000  # a seek "to now" from a clock slightly ahead of the broker's is not in the future
TYPES = {SubscriptionType.EXCLUSIVE: "Exclusive", SubscriptionType.SHARED: "Shared",
         SubscriptionType.FAILOVER: "Failover", SubscriptionType.KEY_SHARED: "KeyShared"}


class SubscriptionAdminService:
    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self._topics = ctx.topics
        self._subscriptions = ctx.subscriptions

    # -- the calls -------------------------------------------------------------------------------------

    @unary
    async def Seek(self, request: pb.SeekRequest, context: Context) -> pb.PositionsResponse:
        which = request.WhichOneof("to")
        if which is None:
            raise invalid("SeekRequest needs one of offset, time_ms, earliest, latest or shift")
        if which == "time_ms":
            _not_in_future(request.time_ms)

        async def target(topic: ReliableTopic, sub: Subscription) -> int:
            log = topic.log
            low, start, end = _position(sub), log.start_offset, log.committed_offset
            if which == "offset":
                return _within(topic, request.offset, start, end, "offset")
            if which == "time_ms":
                return await positions.offset_at_time(log, request.time_ms)
            if which == "earliest":
                return start
            if which == "latest":
                return end
            return _within(topic, low + request.shift, start, end,
                           f"shift {request.shift:+d} from position {low}")

        return await self._moves(request, context, "Seek", target, request.dry_run)

    @unary
    async def Skip(self, request: pb.SkipRequest, context: Context) -> pb.PositionsResponse:
        which = request.WhichOneof("count")
        if which is None:
            raise invalid("SkipRequest needs records or all")

        async def target(topic: ReliableTopic, sub: Subscription) -> int:
            if which == "all":
                return topic.log.committed_offset
            return await positions.after_records(topic.log, _position(sub), request.records)

        return await self._moves(request, context, "Skip", target, request.dry_run)

    @unary
    async def Create(self, request: pb.CreateRequest, context: Context) -> pb.PositionsResponse:
        if request.subscription_type not in TYPES:
            raise invalid(f"unknown subscription type {request.subscription_type} (0..3: Exclusive, Shared, "
                          "Failover, KeyShared)")
        kind = SubscriptionType(request.subscription_type)
        which = request.WhichOneof("position") or "latest"

        here, there = await self._split(request, context)
        out: list[pb.Position] = []
        for topic in here:
            reliable = topic.require_stored("only a Reliable topic keeps a position to start a subscription "
                                            "at")
            log = reliable.log
            start = {"earliest": log.start_offset, "latest": log.committed_offset}.get(which)
            if start is None:
                start = _within(reliable, request.offset, log.start_offset, log.committed_offset, "offset")
            await self._subscriptions.create(reliable, request.subscription, kind, start)
            out.append(pb.Position(stored_topic=topic.full, from_offset=start, to_offset=start, moved=True))
        for answer in await self.elsewhere(there, "Create", request, pb.PositionsResponse, context):
            out += answer.positions
        return pb.PositionsResponse(positions=sorted(out, key=_STORED))

    @unary
    async def Peek(self, request: pb.PeekRequest, context: Context) -> pb.PeekResponse:
        if request.count > MAX_PEEK:
            raise invalid(f"count {request.count} is more than {MAX_PEEK} records")
        count = request.count or 1

        here, there = await self._split(request, context)
        out: list[pb.PeekedRecord] = []
        for topic in here:
            reliable, sub = self._subscription(topic, request.subscription)
            assert sub.cursor is not None
            got = await positions.peek(reliable.log, sub.cursor.low, count, set(sub.cursor.acked))
            out += [_peeked(topic.full, p) for p in got]
        for answer in await self.elsewhere(there, "Peek", request, pb.PeekResponse, context):
            out += answer.records
        return pb.PeekResponse(records=out)

    @unary
    async def Browse(self, request: pb.BrowseRequest, context: Context) -> pb.BrowseResponse:
        which = request.WhichOneof("from")
        if which is None:
            raise invalid("BrowseRequest needs one of offset, time_ms, earliest or latest")
        if request.count > MAX_PEEK:
            raise invalid(f"count {request.count} is more than {MAX_PEEK} records")
        if which == "time_ms":
            _not_in_future(request.time_ms)
        count = request.count or 1

        here, there = await self._split(request, context)
        records: list[pb.PeekedRecord] = []
        ranges: list[pb.Range] = []
        for topic in here:
            log = topic.require_stored("there is nothing to browse").log
            start, end = log.start_offset, log.committed_offset
            if which == "offset":
                at = _within(topic, request.offset, start, end, "offset")
            elif which == "time_ms":
                at = await positions.offset_at_time(log, request.time_ms)
            else:
                at = start if which == "earliest" else end
            if request.backward:
                got = await positions.before(log, at, count)
            else:
                got = await positions.peek(log, at, count, end=end)
            records += [_peeked(topic.full, p) for p in got]
            ranges.append(pb.Range(stored_topic=topic.full, start_offset=start, end_offset=end))
        for answer in await self.elsewhere(there, "Browse", request, pb.BrowseResponse, context):
            records += answer.records
            ranges += answer.ranges
        return pb.BrowseResponse(records=sorted(records, key=_STORED), ranges=sorted(ranges, key=_STORED))

    @unary
    async def Describe(self, request: pb.DescribeRequest, context: Context) -> pb.DescribeResponse:
        here, there = await self._split(request, context)
        out: list[pb.SubscriptionState] = []
        for topic in here:
            out.append(_state(topic, self._find(topic, request.subscription)))
        for answer in await self.elsewhere(there, "Describe", request, pb.DescribeResponse, context):
            out += answer.partitions
        return pb.DescribeResponse(partitions=sorted(out, key=_STORED))

    @unary
    async def List(self, request: pb.ListRequest, context: Context) -> pb.DescribeResponse:
        here, there = await self._split(request, context)
        out: list[pb.SubscriptionState] = []
        for topic in here:
            out += [_state(topic, sub) for sub in topic.subscriptions.values()]
        for answer in await self.elsewhere(there, "List", request, pb.DescribeResponse, context):
            out += answer.partitions
        return pb.DescribeResponse(partitions=sorted(out, key=_STORED_AND_NAME))

    # -- shared ------------------------------------------------------------------------------------------

    async def _moves(self, request: pb.SeekRequest | pb.SkipRequest, context: Context, method: str,
                     target: Callable[[ReliableTopic, Subscription], Awaitable[int]],
                     dry_run: bool) -> pb.PositionsResponse:
        """Resolve `target` for each partition served here, check them all, then move each (unless
        `dry_run`); the other partitions are asked of their owners."""
        here, there = await self._split(request, context)
        planned = []
        for topic in here:
            reliable, sub = self._subscription(topic, request.subscription)
            planned.append((reliable, sub, await target(reliable, sub)))
        out: list[pb.Position] = []
        for reliable, sub, to in planned:
            low = _position(sub)
            between = records_between(reliable.log, min(low, to), max(low, to))
            moved = not dry_run and to != low
            if moved:
                await self._subscriptions.move(reliable, sub, to)
            out.append(pb.Position(stored_topic=reliable.full, from_offset=low, to_offset=to,
                                   records=between if to >= low else -between, moved=moved))
        for answer in await self.elsewhere(there, method, request, pb.PositionsResponse, context):
            out += answer.positions
        return pb.PositionsResponse(positions=sorted(out, key=_STORED))

    async def _split(self, request: WireMessage, context: Context) -> tuple[list[Topic], list[str]]:
        """The partitions of the request's topic served here, and the others (which a forwarded call, or a
        standalone broker, cannot answer)."""
        name = parse_topic(request.topic)  # type: ignore[attr-defined]
        stored = self._topics.partitions(name)
        if not stored:
            raise not_found(f"topic {name.full} does not exist (as a topic or as a partitioned topic)")
        here = [t for t in map(self._topics.find, stored) if t is not None]
        there = [s for s in stored if self._topics.find(s) is None]
        if there and is_forwarded(context):
            raise unavailable(f"{', '.join(there)} is not served by this broker (any more): try again")
        return here, there

    def _subscription(self, topic: Topic, name: str) -> tuple[ReliableTopic, Subscription]:
        reliable = topic.require_stored(f"{topic.full} is NonReliable: it keeps no records, so its "
                                        "subscriptions have no position to move or look at")
        return reliable, self._find(reliable, name)

    def _find(self, topic: Topic, name: str) -> Subscription:
        sub = topic.subscriptions.get(name)
        if sub is None:
            raise not_found(f"subscription {clip(name)!r} does not exist on {topic.full}")
        return sub

    async def elsewhere(self, stored: list[str], method: str, request: WireMessage, reply: type[M],
                        context: Context) -> list[M]:
        """The answers for `stored` topics this broker does not serve, from their owners (cluster mode:
        cluster/admin/subscriptions.py). A standalone broker serves every topic it has loaded, so these
        are topics that failed to load."""
        if stored:
            raise unavailable(f"{', '.join(stored)} is not loaded on this broker (see its log)")
        return []


def _state(topic: Topic, sub: Subscription) -> pb.SubscriptionState:
    """`sub` as Describe and List show it; a NonReliable topic's has no position or end (0)."""
    dispatcher = sub.dispatcher
    reliable = stored(topic)
    return pb.SubscriptionState(
        stored_topic=topic.full, subscription=sub.name, type=TYPES[sub.kind],
        position=sub.cursor.low if sub.cursor is not None else 0,
        end_offset=reliable.log.committed_offset if reliable is not None else 0, backlog=dispatcher.backlog,
        unacked=dispatcher.counters().get("unacked", 0), served_by=dispatcher.kind,
        delayed=dispatcher.counters().get("delayed", 0),
        consumers=[pb.Consumer(name=c.name, active=c.active) for c in sub.consumers])


def _position(sub: Subscription) -> int:
    assert sub.cursor is not None  # a Reliable topic's subscription
    return sub.cursor.low


def _not_in_future(time_ms: int) -> None:
    if time_ms > time.time() * 1000 + FUTURE_SLACK_MS:
        raise invalid(f"time_ms {time_ms} is in the future: no record was published then yet")


def _within(topic: Topic, offset: int, start: int, end: int, what: str) -> int:
    if not start <= offset <= end:
        raise invalid(f"{what} gives offset {offset}, outside what {topic.full} holds: {start} (the first "
                      f"kept) to {end} (the end, where the next record goes)")
    return offset


def _peeked(stored: str, p: positions.Peeked) -> pb.PeekedRecord:
    r = p.record
    out = pb.PeekedRecord(stored_topic=stored, offset=r.offset, publish_time_ms=r.publish_time,
                          producer_name=p.producer_name, payload=bytes(r.payload),
                          attributes=dict(r.attributes or {}))
    if r.routing_key is not None:
        out.key = r.routing_key
    if r.schema_id is not None:
        out.schema_id = r.schema_id
    if r.schema_version is not None:
        out.schema_version = r.schema_version
    return out

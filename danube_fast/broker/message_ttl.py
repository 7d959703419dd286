"""Message expiry (docs/SUBSCRIPTIONS.md, "Message expiry"): a policy's `messageTTLInSeconds` acknowledges, on
every subscription's behalf, the records published longer ago than that, so a subscription nobody reads no
longer holds a backlog for ever. It moves positions only: what the topic keeps is retention's
(docs/RETENTION.md).

Applied by the owner's retention pass (broker/retention.py), every `retention_check_ms`, per Reliable topic
with a TTL: when the lowest position among its subscriptions holds a record published before the cut, the
first offset published at or after the cut is found by binary search (positions.offset_at_time, once per
topic and pass), and each subscription below it moves there (Subscriptions.move: persisted first, its
consumers told). Each subscription counts what expired for it (`Subscription.expired`, a metric).
"""

from __future__ import annotations

import logging

from danube_fast.broker import positions
from danube_fast.broker.subscriptions import Subscriptions
from danube_fast.broker.topic import ReliableTopic
from danube_fast.storage.tiered import records_between

log = logging.getLogger("danube_fast.retention")


class MessageTtl:
    def __init__(self, subscriptions: Subscriptions) -> None:
        self._subscriptions = subscriptions

    async def apply(self, topic: ReliableTopic, ttl_seconds: int, now_ms: int) -> int:
        """Expire what `topic`'s subscriptions hold from before `now_ms - ttl_seconds`; how many records."""
        if ttl_seconds <= 0:
            return 0
        log_ = topic.log
        end = log_.committed_offset
        behind = [s for s in topic.subscriptions.values() if s.cursor is not None and s.cursor.low < end]
        if not behind:
            return 0
        cut_ms = now_ms - ttl_seconds * 1000
        lowest = min(s.cursor.low for s in behind if s.cursor is not None)
        oldest = await positions.publish_time_at(log_, lowest)
        if oldest is None or oldest >= cut_ms:
            return 0
        target = await positions.offset_at_time(log_, cut_ms)
        expired = 0
        for sub in behind:
            assert sub.cursor is not None
            low = sub.cursor.low
            if low >= target:
                continue
            count = records_between(log_, low, target)
            await self._subscriptions.move(topic, sub, target)
            sub.expired += count
            expired += count
            log.info("%s: message expiry acknowledged offsets %d..%d of subscription %s (%d records older "
                     "than %d s)", topic.full, low, target - 1, sub.name, count, ttl_seconds)
        return expired

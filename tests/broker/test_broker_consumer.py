"""Consumer sessions (stream attach, takeover, end) and subscription admission (docs/WIRE.md C.7, C.8)."""

from __future__ import annotations

import asyncio

import pytest
from broker_support import Run, message, payloads

from danube_fast.broker.consumer import Consumer
from danube_fast.broker.dispatch.live import LiveDispatcher
from danube_fast.broker.subscription import Subscription
from danube_fast.errors import ApiError
from danube_fast.meta.resources import SubscriptionType


def live_subscription(kind: SubscriptionType) -> Subscription:
    sub = Subscription("/default/t", "sub", kind)
    sub.dispatcher = LiveDispatcher(sub, 10)
    return sub


def test_messages_queued_before_the_stream_opens_are_delivered_to_it(run: Run) -> None:
    async def main() -> None:
        c = Consumer(1, "c", live_subscription(SubscriptionType.SHARED), [], 10)
        assert c.active  # a new consumer starts active (C.7)
        for i in range(3):
            c.push(message(i))
        token = c.attach()
        assert payloads(await c.take(token, limit=2)) == [b"m0", b"m1"]
        assert payloads(await c.take(token)) == [b"m2"]
        assert c.delivered == 3 and c.queued == 0

    run(main())


def test_a_new_stream_takes_over_and_the_old_one_ends(run: Run) -> None:
    async def main() -> None:
        c = Consumer(1, "c", live_subscription(SubscriptionType.SHARED), [], 10)
        old = c.attach()
        waiting = asyncio.ensure_future(c.take(old))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        new = c.attach()
        assert await asyncio.wait_for(waiting, 1) == []  # the old stream ends with OK (C.8)
        assert not c.is_current(old) and c.is_current(new)
        c.push(message(5))
        assert payloads(await asyncio.wait_for(c.take(new), 1)) == [b"m5"]
        assert await c.take(old) == []
        assert not c.detach(old)  # a stale stream's end does not make the consumer inactive
        assert c.active
        assert c.detach(new)
        assert not c.active and not c.streaming

    run(main())


def test_removal_ends_the_current_stream(run: Run) -> None:
    async def main() -> None:
        c = Consumer(1, "c", live_subscription(SubscriptionType.SHARED), [], 10)
        token = c.attach()
        waiting = asyncio.ensure_future(c.take(token))
        await asyncio.sleep(0.01)
        c.end_streams()
        assert await asyncio.wait_for(waiting, 1) == []
        assert not c.active and c.removed
        c.push(message(1))
        assert await c.take(token) == []

    run(main())


def test_takeover_by_name_ends_the_stream_and_keeps_the_consumer_active(run: Run) -> None:
    async def main() -> None:
        sub = live_subscription(SubscriptionType.EXCLUSIVE)
        c = Consumer(1, "c", sub, [], 10)
        sub.add(c)
        token = c.attach()
        sub.stream_started(c)
        waiting = asyncio.ensure_future(c.take(token))
        await asyncio.sleep(0.01)
        sub.takeover(c)
        assert await asyncio.wait_for(waiting, 1) == []
        assert c.active and not c.streaming
        assert sub.by_name("c") is c and sub.by_name("d") is None

    run(main())


def test_exclusive_refuses_a_second_active_consumer() -> None:
    sub = live_subscription(SubscriptionType.EXCLUSIVE)
    holder = Consumer(1, "holder", sub, [], 10)
    sub.add(holder)
    with pytest.raises(ApiError) as info:
        sub.check_admits("intruder", 0)
    assert info.value.grpc_code == "PERMISSION_DENIED"
    assert str(info.value).startswith("Not able to subscribe to the topic /default/t due to")
    assert "holder" in str(info.value)
    holder.active = False  # its stream went away: it no longer blocks a newcomer (unlike v0.7.3, D.16)
    assert sub.check_admits("intruder", 0) == [holder]  # to be replaced


@pytest.mark.parametrize("kind", [SubscriptionType.SHARED, SubscriptionType.FAILOVER,
                                  SubscriptionType.KEY_SHARED])
def test_non_exclusive_subscriptions_admit_up_to_the_limit(kind: SubscriptionType) -> None:
    sub = live_subscription(kind)
    for i in range(3):
        assert sub.check_admits(f"c{i}", 3) == []
        sub.add(Consumer(i, f"c{i}", sub, [], 10))
    with pytest.raises(ApiError) as info:
        sub.check_admits("c3", 3)
    assert info.value.grpc_code == "PERMISSION_DENIED"
    assert "3" in str(info.value)
    assert sub.check_admits("c3", 0) == []  # 0 = unlimited


def test_idle_tracking() -> None:
    sub = live_subscription(SubscriptionType.SHARED)
    assert sub.idle_since is not None
    c = Consumer(1, "c", sub, [], 10)
    sub.add(c)
    assert sub.idle_since is None
    token = c.attach()
    assert c.detach(token)
    sub.stream_ended(c)
    assert sub.idle_since is not None
    c.attach()
    sub.stream_started(c)
    assert sub.idle_since is None
    sub.remove(c)
    assert sub.consumers == [] and c.removed and sub.idle_since is not None


def test_key_filters_given_on_takeover_apply() -> None:
    """Subscribe again under the same name with other `key_filters`: Topics.subscribe assigns the list and
    takes the consumer over; from then on the new filters decide (docs/WIRE.md D.9: honour key_filters)."""
    sub = live_subscription(SubscriptionType.KEY_SHARED)
    c = Consumer(1, "c", sub, ["a-*"], 10)
    sub.add(c)
    c.key_filters = ["b-*"]  # as Topics.subscribe does on a takeover by name
    sub.takeover(c)
    assert c.accepts("b-1")
    assert not c.accepts("a-1")

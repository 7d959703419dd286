"""NonReliable dispatch (docs/WIRE.md C.9): fan-out to every subscription, per type; bounded per-consumer
buffers that drop for the slow consumer only; no active consumer → dropped and counted."""

from __future__ import annotations

from broker_support import Run, attach_subscription, message, payloads, receive

from danube_fast.broker.consumer import Consumer
from danube_fast.broker.dispatch.live import LiveDispatcher
from danube_fast.broker.ownership import Unfenced
from danube_fast.broker.subscription import Subscription
from danube_fast.broker.topic import NonReliableTopic, Topic
from danube_fast.meta.resources import Policy, SubscriptionType
from danube_fast.names import TopicName


def topic() -> Topic:
    return NonReliableTopic(TopicName("default", "live"), Policy(), Unfenced(None))


def subscribe(t: Topic, name: str, kind: SubscriptionType, buffer: int = 100) -> Subscription:
    return attach_subscription(t, name, kind, buffer)


def join(sub: Subscription, cid: int, filters: list[str] | None = None) -> tuple[Consumer, int]:
    c = Consumer(cid, f"{sub.name}-{cid}", sub, filters or [], 100)
    sub.add(c)
    token = c.attach()
    sub.stream_started(c)
    return c, token


def dropped(sub: Subscription) -> int:
    assert isinstance(sub.dispatcher, LiveDispatcher)
    return sub.dispatcher.dropped


def test_every_subscription_gets_every_message_by_its_type(run: Run) -> None:
    async def main() -> None:
        t = topic()
        excl = subscribe(t, "excl", SubscriptionType.EXCLUSIVE)
        e1, e1t = join(excl, 1)
        shared = subscribe(t, "shared", SubscriptionType.SHARED)
        s1, s1t = join(shared, 2)
        s2, s2t = join(shared, 3)
        failover = subscribe(t, "failover", SubscriptionType.FAILOVER)
        f1, f1t = join(failover, 4)
        f2, f2t = join(failover, 5)
        keyed = subscribe(t, "keyed", SubscriptionType.KEY_SHARED)
        k1, k1t = join(keyed, 6, ["a*"])
        k2, k2t = join(keyed, 7, ["b*"])
        keys = ["a1", "b1", "a2", "b2", "a3", "b3"]

        for i in range(2):
            await t.publish(message(i, key=keys[i]))
        assert f1.detach(f1t)  # the failover's active consumer goes: the standby takes over
        failover.stream_ended(f1)
        for i in range(2, 6):
            await t.publish(message(i, key=keys[i]))

        assert payloads(await receive(e1, e1t, 6)) == [b"m%d" % i for i in range(6)]
        assert payloads(await receive(s1, s1t, 3)) == [b"m0", b"m2", b"m4"]
        assert payloads(await receive(s2, s2t, 3)) == [b"m1", b"m3", b"m5"]
        assert f1.queued == 0  # what it had not taken (m0, m1) was dropped with its stream, and counted
        assert payloads(await receive(f2, f2t, 4)) == [b"m2", b"m3", b"m4", b"m5"]
        assert [m.routing_key for m in await receive(k1, k1t, 3)] == ["a1", "a2", "a3"]
        assert [m.routing_key for m in await receive(k2, k2t, 3)] == ["b1", "b2", "b3"]
        assert [dropped(s) for s in (excl, shared, failover, keyed)] == [0, 0, 2, 0]
        assert (t.messages_in, t.bytes_in) == (6, 12)
        assert all(c.queued == 0 for c in (e1, s1, s2, f1, f2, k1, k2))

    run(main())


def test_a_full_buffer_drops_for_that_consumer_only(run: Run) -> None:
    async def main() -> None:
        t = topic()
        slow_sub = subscribe(t, "slow", SubscriptionType.EXCLUSIVE, buffer=2)
        slow, slow_token = join(slow_sub, 1)
        fast_sub = subscribe(t, "fast", SubscriptionType.EXCLUSIVE, buffer=2)
        fast, fast_token = join(fast_sub, 2)
        got = []
        for i in range(5):
            await t.publish(message(i))
            got.extend(await receive(fast, fast_token, 1))
        assert payloads(got) == [b"m%d" % i for i in range(5)]
        assert dropped(fast_sub) == 0
        assert slow.queued == 2 and dropped(slow_sub) == 3
        assert payloads(await receive(slow, slow_token, 2)) == [b"m0", b"m1"]  # the oldest are kept
        assert slow_sub.dispatcher.backlog == 0
        await t.publish(message(5))  # room again
        assert payloads(await receive(slow, slow_token, 1)) == [b"m5"]
        assert dropped(slow_sub) == 3

    run(main())


def test_shared_skips_a_full_consumer(run: Run) -> None:
    async def main() -> None:
        t = topic()
        shared = subscribe(t, "shared", SubscriptionType.SHARED, buffer=1)
        slow, _ = join(shared, 1)
        fast, fast_token = join(shared, 2)
        await t.publish(message(0))  # round-robin starts with the first consumer, which is then full
        got = []
        for i in range(1, 5):
            await t.publish(message(i))
            got.extend(await receive(fast, fast_token, 1))
        assert slow.queued == 1 and shared.dispatcher.backlog == 1
        assert payloads(got) == [b"m1", b"m2", b"m3", b"m4"]
        assert dropped(shared) == 0
        await t.publish(message(5))  # fast's buffer takes one
        await t.publish(message(6))  # nobody has room: dropped
        await t.publish(message(7))
        assert dropped(shared) == 2
        assert shared.dispatcher.backlog == 2
        assert payloads(slow.drain_queue()) == [b"m0"]
        assert payloads(await receive(fast, fast_token, 1)) == [b"m5"]

    run(main())


def test_key_shared_full_owner_drops_its_key_only(run: Run) -> None:
    async def main() -> None:
        t = topic()
        keyed = subscribe(t, "keyed", SubscriptionType.KEY_SHARED, buffer=1)
        ka, _ = join(keyed, 1, ["a*"])
        kb, kb_token = join(keyed, 2, ["b*"])
        await t.publish(message(0, key="a1"))
        await t.publish(message(1, key="a2"))  # ka is full
        await t.publish(message(2, key="b1"))
        assert dropped(keyed) == 1
        assert payloads(await receive(kb, kb_token, 1)) == [b"m2"]
        assert payloads(ka.drain_queue()) == [b"m0"]
        await t.publish(message(3, key="zzz"))  # no filter accepts it
        assert dropped(keyed) == 2
        await t.publish(message(4, producer="b-producer"))  # no routing key: the producer name is the key
        assert payloads(await receive(kb, kb_token, 1)) == [b"m4"]

    run(main())


def test_no_active_consumer_drops_and_counts(run: Run) -> None:
    async def main() -> None:
        t = topic()
        empty = subscribe(t, "empty", SubscriptionType.SHARED)
        gone_sub = subscribe(t, "gone", SubscriptionType.EXCLUSIVE)
        gone, token = join(gone_sub, 1)
        await t.publish(message(0))
        assert gone.queued == 1
        assert gone.detach(token)
        gone_sub.stream_ended(gone)
        assert gone.queued == 0  # a lost stream's buffer goes
        await t.publish(message(1))
        await t.publish(message(2))
        assert dropped(empty) == 3
        assert dropped(gone_sub) == 3  # the lost stream's buffered message, then two with nobody there
        assert gone.queued == 0
        assert gone_sub.idle_since is not None

    run(main())


def test_acks_and_nacks_are_accepted_and_ignored() -> None:
    t = topic()
    sub = subscribe(t, "s", SubscriptionType.SHARED)
    assert sub.dispatcher.ack(12) is True
    assert sub.dispatcher.nack(12, 5) is True

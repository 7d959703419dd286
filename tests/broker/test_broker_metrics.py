"""The Prometheus exposition: per-topic and per-subscription samples from real topics, escaped labels."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from broker_support import Run, attach_subscription, message, offsets, receive
from prometheus_client.parser import text_string_to_metric_families

from danube_fast.broker import metrics
from danube_fast.broker.config import DispatchConfig
from danube_fast.broker.consumer import Consumer
from danube_fast.broker.dispatch.budget import ByteBudget
from danube_fast.broker.dispatch.cursor import Cursor
from danube_fast.broker.dispatch.reliable import ReliableDispatcher
from danube_fast.broker.ownership import Unfenced
from danube_fast.broker.subscription import Subscription
from danube_fast.broker.topic import NonReliableTopic, ProducerEntry, ReliableTopic, Topic
from danube_fast.codec import frames
from danube_fast.meta.resources import Policy, SubscriptionType
from danube_fast.names import TopicName
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.storage import SyncPolicy, Wal, WalConfig
from danube_fast.storage.tail_cache import CacheBudget


def topics_of(*topics: Topic, cache_budget: CacheBudget | None = None) -> Any:
    """What `render` reads of a broker's context, holding just these topics (no store behind them)."""
    registry = SimpleNamespace(served=lambda: list(topics), broken=lambda: [],
                               stored=lambda: [t for t in topics if isinstance(t, ReliableTopic)])
    logs = SimpleNamespace(released=lambda: 0, cache_budget=cache_budget or CacheBudget(1 << 20))
    return SimpleNamespace(topics=registry, budget=ByteBudget(1 << 20), logs=logs)


def samples(text: str) -> dict[str, float]:
    """Series (name and raw label values, as `name{label="value"}`) -> value, read back by prometheus-client's
    own parser; every series once."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation, family.name
        for sample in family.samples:
            # Written as the tests below spell them: topic first (the exposition sorts labels by name).
            ordered = sorted(sample.labels.items(), key=lambda kv: kv[0] != "topic")
            labels = ",".join(f'{k}="{v}"' for k, v in ordered)
            series = f"{sample.name}{{{labels}}}" if labels else sample.name
            assert series not in out, f"duplicate series {series}"
            out[series] = sample.value
    return out


def test_nonreliable_topic_samples_with_escaped_labels(run: Run) -> None:
    async def main() -> None:
        t = NonReliableTopic(TopicName("default", 'we"ird\\name'), Policy(), Unfenced(None))
        t.add_producer(ProducerEntry(1, "p", t))
        sub = attach_subscription(t, "sub\nline", SubscriptionType.EXCLUSIVE, buffer=2)
        c = Consumer(1, "c", sub, [], 10)
        sub.add(c)
        token = c.attach()
        for i in range(3):
            await t.publish(message(i))  # the third finds the buffer full
        await receive(c, token, 1)

        text = metrics.render(topics_of(t), time.monotonic() - 1.5)
        assert 'subscription="sub\\nline",topic="/default/we\\"ird\\\\name"' in text  # escaped on the wire
        got = samples(text)
        tl = 'topic="/default/we"ird\\name"'
        sl = tl + ',subscription="sub\nline"'
        assert got == {
            f"danube_topic_messages_in_total{{{tl}}}": 3,
            f"danube_topic_bytes_in_total{{{tl}}}": 6,
            f"danube_topic_producers{{{tl}}}": 1,
            f"danube_subscription_messages_out_total{{{sl}}}": 1,
            f"danube_subscription_bytes_out_total{{{sl}}}": 2,  # its payload
            f"danube_subscription_lag{{{sl}}}": 1,
            f"danube_subscription_consumers{{{sl}}}": 1,
            f"danube_subscription_dropped_total{{{sl}}}": 1,
            "danube_broker_uptime_seconds": got["danube_broker_uptime_seconds"],
            "danube_dispatch_held_bytes": 0,  # the registry's budget: these dispatchers have their own
            "danube_topics_idle_released": 0,
            "danube_wal_cache_bytes": 0,  # a NonReliable topic has no WAL
        }
        assert 1.5 <= got["danube_broker_uptime_seconds"] < 60

    run(main())


def test_reliable_topic_samples(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        cache_budget = CacheBudget(1 << 20)
        wal = await Wal.open(tmp_path / "w", WalConfig(sync=SyncPolicy("none")), cache_budget=cache_budget)
        t = ReliableTopic(TopicName("default", "rel"), Policy(), Unfenced(None), wal)
        sub = Subscription(t.full, "s", SubscriptionType.SHARED)

        async def save_cursor(offset: int, _delayed: object = None) -> None:
            pass

        async def dead_letter(msg: pb.StreamMessage) -> None:
            pass

        cfg = DispatchConfig(nack_base_delay_ms=5, cursor_flush_ms=60_000)
        dispatcher = ReliableDispatcher(sub, wal, cfg, Cursor(0, save_cursor, cfg), dead_letter)
        sub.dispatcher = dispatcher
        t.add_subscription(sub)
        try:
            active = Consumer(1, "a", sub, [], 10)
            sub.add(active)
            idle = Consumer(2, "b", sub, [], 10)
            sub.add(idle)
            assert idle.detach(idle.attach())
            sub.stream_ended(idle)
            token = active.attach()
            for i in range(3):
                await t.publish(message(i))
            assert offsets(await receive(active, token, 3)) == [0, 1, 2]
            assert dispatcher.nack(1, None)
            assert offsets(await receive(active, token, 1)) == [1]
            assert dispatcher.ack(0)
            assert dispatcher.nack(2, 30_000)  # due again in 30 s: unacknowledged, not in flight

            got = samples(metrics.render(topics_of(t, cache_budget=cache_budget), time.monotonic()))
            stored = {}  # offset -> its one-record batch's bytes, as stored
            for offset in range(3):
                read = await wal.read(offset)
                assert read is not None
                stored[offset] = frames.parse_header(read[0]).length
            tl = 'topic="/default/rel"'
            sl = tl + ',subscription="s"'
            assert {k: v for k, v in got.items() if k != "danube_broker_uptime_seconds"} == {
                f"danube_topic_messages_in_total{{{tl}}}": 3,
                f"danube_topic_bytes_in_total{{{tl}}}": 6,
                f"danube_topic_producers{{{tl}}}": 0,
                f"danube_topic_committed_offset{{{tl}}}": 3,
                f"danube_topic_behind_retention_total{{{tl}}}": 0,
                f"danube_subscription_messages_out_total{{{sl}}}": 4,
                f"danube_subscription_bytes_out_total{{{sl}}}": sum(stored[o] for o in (0, 1, 2, 1)),
                f"danube_subscription_lag{{{sl}}}": 2,  # committed 3, floor 0
                f"danube_subscription_consumers{{{sl}}}": 1,
                f"danube_subscription_redelivered_total{{{sl}}}": 1,
                f"danube_subscription_dead_lettered_total{{{sl}}}": 0,
                f"danube_subscription_unacked{{{sl}}}": 2,
                f"danube_subscription_delayed{{{sl}}}": 0,  # a Shared subscription: none waits
                "danube_dispatch_held_bytes": 0,  # the registry's budget: this dispatcher has its own
                "danube_topics_idle_released": 0,
                "danube_wal_cache_bytes": wal._cache.nbytes,  # the three batches published, held
            }
            assert wal._cache.nbytes > 0
        finally:
            await dispatcher.close()
            await wal.close()

    run(main())


def test_every_family_is_described_once_even_without_topics() -> None:
    text = metrics.render(topics_of(), time.monotonic())
    got = samples(text)
    assert list(got) == ["danube_broker_uptime_seconds", "danube_dispatch_held_bytes",
                         "danube_topics_idle_released", "danube_wal_cache_bytes"]
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert len(helps) == len(set(helps)) >= 12
    assert "# TYPE danube_subscription_redelivered_total counter" in text
    assert "# TYPE danube_subscription_lag gauge" in text


def test_delivered_counter_does_not_go_down_when_a_consumer_leaves(run: Run) -> None:
    """A counter may only grow (a drop reads as a counter reset to `rate()`)."""

    async def main() -> None:
        t = NonReliableTopic(TopicName("default", "t"), Policy(), Unfenced(None))
        sub = attach_subscription(t, "s", SubscriptionType.SHARED, buffer=10)
        c = Consumer(1, "c", sub, [], 10)
        sub.add(c)
        token = c.attach()
        for i in range(2):
            await t.publish(message(i))
        await receive(c, token, 2)
        key = 'danube_subscription_messages_out_total{topic="/default/t",subscription="s"}'
        assert samples(metrics.render(topics_of(t), time.monotonic()))[key] == 2
        sub.remove(c)
        assert samples(metrics.render(topics_of(t), time.monotonic()))[key] >= 2

    run(main())

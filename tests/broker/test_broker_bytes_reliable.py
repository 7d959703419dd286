"""Reliable dispatch bounded by bytes: per consumer by [dispatch] window_bytes (one message
bigger than that still goes, alone), per broker by a ByteBudget shared by every subscription (beyond it the
data waits in the WAL), and every byte taken is given back: by acks, dead letters, dropped keys, consumer
removal and close, so that the budget returns to zero."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

from broker_support import TOPIC, Rig, Run, message, offsets, receive, until

from danube_fast.broker import messages
from danube_fast.broker.config import DispatchConfig
from danube_fast.broker.consumer import Consumer
from danube_fast.broker.dispatch.budget import ByteBudget
from danube_fast.broker.dispatch.cursor import Cursor
from danube_fast.broker.dispatch.reliable import PARK_WINDOWS, READ_BYTES, ReliableDispatcher, record_sizes
from danube_fast.broker.subscription import Subscription
from danube_fast.codec import frames
from danube_fast.meta.resources import SubscriptionType
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.storage import SyncPolicy, Wal, WalConfig

EXCLUSIVE = SubscriptionType.EXCLUSIVE
SHARED = SubscriptionType.SHARED
KEY_SHARED = SubscriptionType.KEY_SHARED

PAYLOAD = 100_000
BASE = DispatchConfig(window=100, ack_timeout_ms=60_000, nack_base_delay_ms=5, nack_max_delay_ms=20,
                      max_redeliveries=5, cursor_flush_acks=1000, cursor_flush_ms=60_000,
                      window_bytes=1 << 30, broker_bytes=1 << 40)


def big(i: int, size: int = PAYLOAD, key: str | None = None) -> pb.StreamMessage:
    m = message(i, key)
    m.payload = b"%08d" % i + b"x" * (size - 8)
    return m


def size(i: int) -> int:
    """What big(i) holds: its one-record batch in the WAL (a few bytes vary with i)."""
    return len(messages.encode(big(i)))


SIZE = max(size(i) for i in range(100))


def config(**changes: int) -> DispatchConfig:
    return replace(BASE, **changes)


@contextlib.asynccontextmanager
async def subscriptions(tmp_path: Path, kind: SubscriptionType, cfg: DispatchConfig, budget: ByteBudget,
                        count: int = 1, preload: Sequence[pb.StreamMessage] = ()) -> AsyncIterator[list[Rig]]:
    """`count` Reliable subscriptions of `kind` on one WAL holding `preload`, sharing `budget`; closed (and
    so holding nothing) when the block ends."""
    wal = await Wal.open(tmp_path / "wal", WalConfig(sync=SyncPolicy("none")))
    rigs: list[Rig] = []
    try:
        for m in preload:
            await wal.append(messages.encode(m))
        for n in range(count):
            sub = Subscription(TOPIC, f"sub{n}", kind)
            rig = Rig(wal, sub, None)  # type: ignore[arg-type]  # the dispatcher needs the rig's lists

            async def save(offset: int, _delayed: object = None, rig: Rig = rig) -> None:
                rig.saved.append(offset)

            async def dead_letter(msg: pb.StreamMessage, rig: Rig = rig) -> None:
                rig.dead.append(msg)

            rig.dispatcher = ReliableDispatcher(sub, wal, cfg, Cursor(0, save, cfg), dead_letter,
                                                budget=budget)
            sub.dispatcher = rig.dispatcher
            rigs.append(rig)
        yield rigs
    finally:
        for rig in rigs:
            await rig.dispatcher.close()
        await wal.close()


def stalled(rig: Rig, cid: int, window: int = 100, filters: Sequence[str] = ()) -> Consumer:
    """A consumer whose stream is open and never reads."""
    c, _ = rig.consumer(cid, filters=filters, window=window)
    return c


async def settle() -> None:
    await asyncio.sleep(0.05)


def held(*consumers: Consumer) -> list[int]:
    return [c.inflight_bytes for c in consumers]


def test_record_sizes_share_a_batch_and_add_up_to_what_was_read() -> None:
    one = [bytearray(messages.encode(big(i, 50 + i))) for i in range(3)]
    for i, b in enumerate(one):
        frames.stamp_base_offset(b, i)
    data = b"".join(one)
    assert record_sizes(data, 0, 3) == [len(b) for b in one]  # one record per batch: exact
    assert record_sizes(data, 1, 2) == [len(b) for b in one[1:]]
    several = bytearray(frames.encode_payloads([b"p" * 10] * 4))
    frames.stamp_base_offset(several, 10)
    data = b"".join(one) + bytes(several)  # offsets 0..2, then 10..13 in one batch
    share = len(several) // 4
    assert record_sizes(data, 0, 7) == [len(b) for b in one] + [share] * 4
    assert record_sizes(data, 12, 2) == [share] * 2  # a batch partly below the start


def test_a_stalled_consumer_holds_at_most_its_byte_window(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        budget = ByteBudget(1 << 40)
        cfg = config(window_bytes=3 * SIZE + SIZE // 2)
        three = size(0) + size(1) + size(2)
        async with subscriptions(tmp_path, EXCLUSIVE, cfg, budget, preload=[big(i) for i in range(30)]) as (
                rig,):
            c, token = rig.consumer(1)
            await settle()
            assert c.inflight == 3 and held(c) == [three] and c.queued_bytes == three
            assert offsets(await receive(c, token, 3)) == [0, 1, 2]
            await settle()
            assert c.queued == 0 and held(c) == [three]  # taken but not acknowledged: still in flight
            assert rig.dispatcher.held_bytes <= cfg.window_bytes + READ_BYTES + SIZE  # + one read ahead
            assert budget.held == rig.dispatcher.held_bytes
            assert rig.dispatcher.ack(1)
            assert offsets(await receive(c, token, 1)) == [3]
            await settle()
            assert c.queued == 0 and held(c) == [three - size(1) + size(3)]

    run(main())


def test_a_message_bigger_than_the_window_goes_alone(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        budget = ByteBudget(1 << 40)
        msgs = [big(0, 5000), big(1, 5000), message(2), message(3)]
        async with subscriptions(tmp_path, EXCLUSIVE, config(window_bytes=1000), budget, preload=msgs) as (
                rig,):
            c, token = rig.consumer(1)
            assert offsets(await receive(c, token, 1)) == [0]
            await settle()
            assert c.queued == 0 and held(c)[0] > 1000  # alone, over the window, not stuck
            assert rig.dispatcher.ack(0)
            assert offsets(await receive(c, token, 1)) == [1]
            await settle()
            assert c.queued == 0
            assert rig.dispatcher.ack(1)
            assert offsets(await receive(c, token, 2)) == [2, 3]  # small ones share the window again
            assert rig.dispatcher.ack(2) and rig.dispatcher.ack(3)
            await until(lambda: budget.held == 0, what="every byte given back")

    run(main())


def test_shared_consumers_each_have_a_byte_window(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        budget = ByteBudget(1 << 40)
        async with subscriptions(tmp_path, SHARED, config(window_bytes=2 * SIZE), budget,
                                 preload=[big(i) for i in range(10)]) as (rig,):
            c1, c2 = stalled(rig, 1), stalled(rig, 2)
            await settle()
            assert (c1.queued, c2.queued) == (2, 2)
            assert held(c1, c2) == [size(0) + size(2), size(1) + size(3)]

    run(main())


def test_the_broker_budget_leaves_data_in_the_wal_but_never_stops_a_subscription(tmp_path: Path,
                                                                                 run: Run) -> None:
    """Two subscriptions with stalled consumers spend the budget; a third, whose consumer acks, still gets
    every message (one read at a time); once the stalled ones ack, they get everything that waited in the
    WAL; the budget returns to zero."""

    async def main() -> None:
        budget = ByteBudget(4 * SIZE)
        async with subscriptions(tmp_path, EXCLUSIVE, config(), budget, count=3,
                                 preload=[big(i) for i in range(20)]) as rigs:
            slow = [stalled(rigs[0], 1), stalled(rigs[1], 2)]
            await settle()
            assert budget.held >= budget.limit
            assert budget.held <= budget.limit + 2 * (READ_BYTES + SIZE)  # each read once past the limit
            assert sum(c.queued for c in slow) < 2 * 20  # most of it waits in the WAL
            lively, token = rigs[2].consumer(3)
            for i in range(20):
                (m,) = await receive(lively, token, 1)
                assert m.msg_id.topic_offset == i
                assert rigs[2].dispatcher.ack(i)
            for rig, c in zip(rigs, slow, strict=False):
                token = c.attach()
                rig.sub.stream_started(c)
                for i in range(20):
                    (m,) = await receive(c, token, 1)
                    assert m.msg_id.topic_offset == i
                    assert rig.dispatcher.ack(i)
            await until(lambda: budget.held == 0, what="the budget back to zero")
            assert [r.dispatcher.floor for r in rigs] == [19, 19, 19]
            assert held(*slow, lively) == [0, 0, 0]

    run(main())


def test_nacks_timeouts_losses_and_acks_give_every_byte_back(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        budget = ByteBudget(1 << 40)
        cfg = config(window_bytes=3 * SIZE, ack_timeout_ms=300)
        async with subscriptions(tmp_path, SHARED, cfg, budget, preload=[big(i) for i in range(12)]) as (
                rig,):
            d = rig.dispatcher
            c1, t1 = rig.consumer(1)
            c2, t2 = rig.consumer(2)
            first = await receive(c1, t1, 3)
            assert offsets(first) == [0, 2, 4]
            assert d.nack(0, None)
            assert held(c1) == [size(2) + size(4)]  # a nack frees the consumer's window, not the memory
            assert budget.held == d.held_bytes >= sum(size(i) for i in range(6))
            rig.lose(c1, t1)  # its other messages go to c2
            assert held(c1) == [0] and c1.queued_bytes == 0
            acked: set[int] = set()
            seen: list[int] = []
            while len(acked) < 12:
                (m,) = await receive(c2, t2, 1, timeout=5)
                off = m.msg_id.topic_offset
                seen.append(off)
                if off == 5 and seen.count(5) == 1:
                    continue  # not acknowledged in time: the ack timeout sends it again
                if off not in acked:
                    assert d.ack(off)
                    acked.add(off)
            assert seen.count(5) == 2
            await until(lambda: budget.held == 0, what="the budget back to zero")
            assert d.held_bytes == 0 and held(c1, c2) == [0, 0] and c2.queued_bytes == 0
            assert d.floor == 11

    run(main())


def test_dead_letters_and_keys_nobody_accepts_give_their_bytes_back(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        budget = ByteBudget(1 << 40)
        cfg = config(max_redeliveries=1)
        msgs = [big(0, key="a-1"), big(1, key="nobody"), big(2, key="a-2")]
        async with subscriptions(tmp_path, KEY_SHARED, cfg, budget, preload=msgs) as (rig,):
            d = rig.dispatcher
            c, token = rig.consumer(1, filters=["a-*"])
            assert offsets(await receive(c, token, 2)) == [0, 2]
            assert d.ack(2)
            assert d.nack(0, None)
            assert offsets(await receive(c, token, 1)) == [0]
            assert d.nack(0, None)  # one failure more than max_redeliveries
            await until(lambda: len(rig.dead) == 1, what="the dead letter")
            await until(lambda: budget.held == 0, what="the budget back to zero")
            assert d.floor == 2

    run(main())


def test_removal_and_close_give_every_byte_back(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        budget = ByteBudget(1 << 40)
        cfg = config(window_bytes=4 * SIZE)
        async with subscriptions(tmp_path, KEY_SHARED, cfg, budget, count=2,
                                 preload=[big(i, key=f"k{i % 3}") for i in range(12)]) as rigs:
            keyed = [stalled(rigs[0], 1), stalled(rigs[0], 2)]
            exclusive = stalled(rigs[1], 3)
            await settle()
            assert budget.held > 0 and sum(held(*keyed, exclusive)) > 0
            for c in keyed:
                rigs[0].sub.remove(c)  # messages wait for a consumer that never comes: still held
            assert held(*keyed) == [0, 0] and budget.held > 0
            await rigs[0].dispatcher.close()
            await rigs[1].dispatcher.close()
            assert budget.held == 0 and rigs[0].dispatcher.held_bytes == 0
            assert not rigs[0].dispatcher.ack(0)  # nothing is held any more: nothing to give back twice
            assert budget.held == 0

    run(main())


def test_key_shared_parks_at_most_its_windows_of_bytes(tmp_path: Path, run: Run) -> None:
    """A full consumer's messages are parked so that other keys go on, but only PARK_WINDOWS windows of
    bytes of them; then reads stop until it acknowledges."""

    async def main() -> None:
        budget = ByteBudget(1 << 40)
        cfg = config(window_bytes=SIZE)  # one message in flight per consumer: PARK_WINDOWS messages parked
        msgs = [big(i, key="a") for i in range(PARK_WINDOWS + 5)] + [big(100 + i, key="b") for i in range(3)]
        async with subscriptions(tmp_path, KEY_SHARED, cfg, budget, preload=msgs) as (rig,):
            d = rig.dispatcher
            ca, ta = rig.consumer(1, filters=["a"])
            cb, tb = rig.consumer(2, filters=["b"])
            await settle()
            assert ca.queued == 1 and cb.queued == 0  # b's messages are behind more than the parking allows
            assert d.held_bytes <= (1 + PARK_WINDOWS + 1) * SIZE + READ_BYTES
            for i in range(PARK_WINDOWS + 5):
                assert offsets(await receive(ca, ta, 1)) == [i]
                assert d.ack(i)
            for i in range(3):
                (m,) = await receive(cb, tb, 1)
                assert m.payload[:8] == b"%08d" % (100 + i)
                assert d.ack(m.msg_id.topic_offset)
            await until(lambda: budget.held == 0, what="the budget back to zero")

    run(main())

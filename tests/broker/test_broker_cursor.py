"""A Reliable subscription's Cursor (dispatch/cursor.py): one position that both dispatchers move, saved by
its flush policy and only ever forward."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from danube_fast.broker.config import DispatchConfig
from danube_fast.broker.consumer import Consumer
from danube_fast.broker.dispatch.batches import BatchDispatcher
from danube_fast.broker.dispatch.cursor import Cursor
from danube_fast.broker.dispatch.reliable import ReliableDispatcher
from danube_fast.broker.subscription import Subscription
from danube_fast.codec import frames
from danube_fast.meta.resources import SubscriptionType
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.storage import SyncPolicy, Wal, WalConfig

Run = Callable[..., Any]


def test_flush_policy_and_forward_only_saves(run: Run) -> None:
    async def main() -> None:
        saved: list[int] = []

        async def save(floor: int, _delayed: object = None) -> None:
            saved.append(floor)

        cursor = Cursor(10, save, DispatchConfig(cursor_flush_acks=3, cursor_flush_ms=60_000))
        loop = asyncio.get_running_loop()
        assert cursor.floor == 9 and not cursor.due(loop.time())
        assert cursor.acknowledge(None, [12, 11], limit=20) == 2 and cursor.floor == 9  # 10 still out
        assert not cursor.due(loop.time())
        assert cursor.acknowledge(10, [], limit=20) == 1 and cursor.floor == 12  # 10 closes the gap
        assert cursor.due(loop.time())  # three acknowledgements
        await cursor.save()
        await cursor.save()  # nothing new: no second write
        assert saved == [12] and not cursor.due(loop.time())
        assert cursor.acknowledge(25, [], limit=20) == 7 and cursor.floor == 19  # not past what was sent
        cursor.skip_to(15)  # behind the floor: no move back
        assert cursor.floor == 19
        cursor.skip_to(30)  # retention deleted up to 29
        await cursor.save()
        assert saved == [12, 29]
        assert cursor.due(loop.time() + 61)  # the time limit

    run(main(), timeout=10)


def test_the_position_survives_a_switch_between_the_two_dispatchers(tmp_path: Path, run: Run) -> None:
    """A fast-API stream acknowledges 0..9 and 15 individually; the per-message dispatcher that takes the
    subscription over starts at 10 (15 comes again: at least once) and its acks move the same cursor."""

    async def main() -> None:
        wal = await Wal.open(tmp_path, WalConfig(sync=SyncPolicy.parse("none")))
        for i in range(20):
            await wal.append(frames.encode_payloads([b"m%d" % i]))
        saved: list[int] = []

        async def save(floor: int, _delayed: object = None) -> None:
            saved.append(floor)

        async def dead_letter(msg: pb.StreamMessage) -> None:
            raise AssertionError("nothing is dead-lettered here")

        config = DispatchConfig(cursor_flush_ms=60_000)
        sub = Subscription("/default/t", "s", SubscriptionType.EXCLUSIVE)
        sub.cursor = Cursor(0, save, config)
        batches = BatchDispatcher(sub, wal, config, sub.cursor)
        sub.dispatcher = batches
        _, first, last = await asyncio.wait_for(batches.next_records(window=1 << 20), 2)  # type: ignore[misc]
        assert (first, last) == (0, 19)
        assert batches.acknowledge(9, [15]) == 11 and batches.floor == 9
        await batches.close()
        assert saved == [9]

        per_message = ReliableDispatcher(sub, wal, config, sub.cursor, dead_letter)
        sub.dispatcher = per_message
        consumer = Consumer(1, "c", sub, [], window=100)
        sub.add(consumer)
        token = consumer.attach()
        got: list[pb.StreamMessage] = []
        while len(got) < 10:
            got += await asyncio.wait_for(consumer.take(token), 2)
        assert [m.msg_id.topic_offset for m in got] == list(range(10, 20))
        assert consumer.inflight == 10 and consumer.inflight_bytes > 0
        for m in got[:6]:
            assert per_message.ack(m.msg_id.topic_offset)
        assert per_message.floor == 15 == sub.cursor.floor and consumer.inflight == 4
        await per_message.close()
        assert saved == [9, 15]  # saved again on close, further on
        await wal.close()

    run(main(), timeout=20)


RESERVATION = 10_000_000  # offsets a topic taken over after a crash skips (docs/TOPIC_MOVE.md)


@pytest.mark.timeout(10)
def test_the_floor_settles_over_a_reservation_gap_at_once(run: Run) -> None:
    """The per-message dispatcher's floor crosses the gap between two owners' offsets without walking it
    (it held the event loop for seconds per ack, and the broker lost its lease), and stops at the first
    offset still held on either side of the gap, wherever it is."""
    async def main() -> None:
        async def save(floor: int, _delayed: object = None) -> None:
            pass

        cursor = Cursor(5, save, DispatchConfig())
        far = 5 + 1000 * RESERVATION  # walked one by one, this would outlast the test's timeout
        cursor.settle_below(far + 10, pending={far + 3}, waiting=set())
        assert cursor.low == far + 3
        cursor.settle_below(far + 10, pending=set(), waiting={far + 7, far + 5})
        assert cursor.low == far + 5
        cursor.settle_below(far + 10, pending=set(), waiting=set())
        assert cursor.low == far + 10
        cursor.settle_below(far + 10 + 3 * RESERVATION, pending={far + 11}, waiting=set())
        assert cursor.low == far + 11  # a held offset just past the floor: no walk, no jump
        cursor.settle_below(far + 3 * RESERVATION, pending={far + 2 * RESERVATION}, waiting={far + 200})
        assert cursor.low == far + 200  # the first held one, not the last

    run(main())

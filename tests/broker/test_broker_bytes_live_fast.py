"""Byte bounds outside the per-message Reliable path: NonReliable buffers bounded by
window_bytes per consumer and by the broker's ByteBudget (beyond either, a drop for that consumer), the fast
API's window capped at window_bytes with its unacknowledged bytes in the budget, and the budget itself."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from broker_support import Run, message, payloads, receive

from danube_fast.broker.config import ConfigError, DispatchConfig, load
from danube_fast.broker.consumer import Consumer
from danube_fast.broker.dispatch.batches import BatchDispatcher
from danube_fast.broker.dispatch.budget import ByteBudget
from danube_fast.broker.dispatch.cursor import Cursor
from danube_fast.broker.dispatch.live import LiveDispatcher
from danube_fast.broker.memory import UsableMemory
from danube_fast.broker.subscription import Subscription
from danube_fast.codec import frames
from danube_fast.meta.resources import SubscriptionType
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.storage import SyncPolicy, Wal, WalConfig

EXCLUSIVE = SubscriptionType.EXCLUSIVE


def sized(i: int, size: int) -> pb.StreamMessage:
    m = message(i)
    m.payload = bytes([65 + i % 26]) * size
    return m


def live(name: str, budget: ByteBudget, window_bytes: int, buffer: int = 100
         ) -> tuple[Subscription, Consumer, int]:
    sub = Subscription("/default/live", name, EXCLUSIVE)
    sub.dispatcher = LiveDispatcher(sub, buffer, window_bytes, budget)
    c = Consumer(1, name, sub, [], 100)
    sub.add(c)
    token = c.attach()
    sub.stream_started(c)
    return sub, c, token


def dispatcher(sub: Subscription) -> LiveDispatcher:
    assert isinstance(sub.dispatcher, LiveDispatcher)
    return sub.dispatcher


def test_the_byte_settings_are_read_and_checked(tmp_path: Path) -> None:
    defaults = load(None, {}, usable=lambda: UsableMemory(64 << 30, "physical memory")).dispatch
    assert (defaults.window_bytes, defaults.broker_bytes) == (16 << 20, 256 << 20)
    path = tmp_path / "broker.toml"
    path.write_text("[dispatch]\nwindow_bytes = 4096\nbroker_bytes = 65536\n")
    read = load(str(path), {}).dispatch
    assert (read.window_bytes, read.broker_bytes) == (4096, 65536)
    for name in ("window_bytes", "broker_bytes"):
        path.write_text(f"[dispatch]\n{name} = 0\n")
        with pytest.raises(ConfigError, match=f"{name} must be at least 1"):
            load(str(path), {})


def test_budget_wakes_its_waiters_once_it_has_room() -> None:
    budget = ByteBudget(10)
    woken: list[str] = []
    budget.take(12)
    assert budget.spent and not budget.room_for(0)
    budget.wait(lambda: woken.append("a"))
    budget.wait(lambda: woken.append("b"))
    gone = lambda: woken.append("gone")  # noqa: E731
    budget.wait(gone)
    budget.forget(gone)
    budget.give(1)
    assert woken == []  # still spent
    budget.give(2)
    assert woken == ["a", "b"] and budget.held == 9 and budget.room_for(1) and not budget.room_for(2)
    budget.give(9)
    assert woken == ["a", "b"]  # once
    assert budget.held == 0


def test_live_buffers_are_bounded_by_bytes_and_drop_beyond(run: Run) -> None:
    async def main() -> None:
        budget = ByteBudget(1 << 30)
        sub, c, token = live("s", budget, window_bytes=250)
        d = dispatcher(sub)
        for i in range(4):
            d.publish(sized(i, 100))
        assert c.queued == 2 and c.queued_bytes == 200 and d.dropped == 2  # a third would make 300 > 250
        assert budget.held == d.held_bytes == 200
        assert payloads(await receive(c, token, 2)) == [b"A" * 100, b"B" * 100]
        assert budget.held == 0 and c.queued_bytes == 0
        d.publish(sized(4, 1000))  # bigger than the window: goes when the buffer is empty, alone
        d.publish(sized(5, 1))
        assert c.queued == 1 and d.dropped == 3
        assert payloads(await receive(c, token, 1)) == [b"E" * 1000]
        assert budget.held == 0

    run(main())


def test_live_drops_beyond_the_broker_budget_but_an_empty_buffer_takes_one(run: Run) -> None:
    async def main() -> None:
        budget = ByteBudget(300)
        one, c1, t1 = live("one", budget, window_bytes=1 << 20)
        two, c2, t2 = live("two", budget, window_bytes=1 << 20)
        for i in range(4):
            dispatcher(one).publish(sized(i, 100))
        assert c1.queued == 3 and dispatcher(one).dropped == 1 and budget.held == 300
        dispatcher(two).publish(sized(9, 100))  # the budget is spent; c2's buffer is empty
        dispatcher(two).publish(sized(10, 100))
        assert c2.queued == 1 and dispatcher(two).dropped == 1 and budget.held == 400
        await receive(c2, t2, 1)
        assert budget.held == 300
        assert c1.detach(t1)
        one.stream_ended(c1)  # its stream went before taking anything: the queue is dropped and given back
        assert c1.queued == 0 and dispatcher(one).dropped == 4 and budget.held == 0
        dispatcher(two).publish(sized(11, 100))
        two.remove(c2)
        await dispatcher(two).close()
        assert budget.held == 0

    run(main())


async def wal_with(tmp_path: Path, batches: int, records: int = 10, size: int = 1000) -> Wal:
    wal = await Wal.open(tmp_path, WalConfig(sync=SyncPolicy.parse("none")))
    for b in range(batches):
        await wal.append(frames.encode_payloads([b"%d" % b * size for _ in range(records)]))
    return wal


def batches(wal: Wal, budget: ByteBudget, **config: int) -> BatchDispatcher:
    async def save(offset: int, _delayed: object = None) -> None:
        pass

    sub = Subscription("/default/t", "s", EXCLUSIVE)
    cfg = DispatchConfig(**config)
    d = BatchDispatcher(sub, wal, cfg, Cursor(0, save, cfg), budget)
    sub.dispatcher = d
    return d


def test_fast_window_is_capped_and_its_bytes_return_to_the_budget(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal = await wal_with(tmp_path, 8)
        one_batch = len(frames.encode_payloads([b"0" * 1000] * 10))
        budget = ByteBudget(1 << 30)
        d = batches(wal, budget, window_bytes=2 * one_batch)
        sent = 0
        while True:  # the client asks for 1 GiB: it gets window_bytes
            more = asyncio.ensure_future(d.next_records(1 << 30))
            await asyncio.sleep(0.05)
            if not more.done():
                break
            got = more.result()
            assert got is not None
            sent = got[2] + 1
        assert 2 * one_batch <= d.held_bytes < 3 * one_batch and sent < 80
        # The next read, started ahead (dispatch/read_ahead.py), holds the size it asked for.
        assert budget.held == d.held_bytes + d.read_ahead.held and d.read_ahead.held == 2 * one_batch
        d.acknowledge(sent - 1, [])
        got = await asyncio.wait_for(more, 2)
        assert got is not None and got[1] == sent
        assert budget.held == d.held_bytes + d.read_ahead.held
        d.nack(got[1], None)  # delivery goes back: what was sent from there is read again
        assert budget.held == d.held_bytes == 0
        await asyncio.wait_for(d.next_records(1 << 30), 2)
        d.consumer_lost()  # the stream went
        assert budget.held == 0
        await asyncio.wait_for(d.next_records(1 << 30), 2)
        await d.close()
        assert budget.held == 0 and d.held_bytes == 0
        await wal.close()

    run(main())


def test_fast_stream_waits_for_the_budget_unless_it_holds_nothing(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal = await wal_with(tmp_path, 4)
        one_batch = len(frames.encode_payloads([b"0" * 1000] * 10))
        budget = ByteBudget(3 * one_batch)
        budget.take(3 * one_batch)  # spent by someone else
        d = batches(wal, budget, window_bytes=1 << 20)
        got = await asyncio.wait_for(d.next_records(1), 2)  # holds nothing: one delivery goes anyway
        assert got is not None and d.held_bytes == one_batch
        more = asyncio.ensure_future(d.next_records(1 << 20))
        await asyncio.sleep(0.05)
        assert not more.done()  # the budget is spent and this stream holds something
        budget.give(3 * one_batch)  # someone else acknowledged: room again, and the stream is woken
        assert await asyncio.wait_for(more, 2) is not None
        d.acknowledge(39, [])
        assert budget.held == 0
        await d.close()
        await wal.close()

    run(main())

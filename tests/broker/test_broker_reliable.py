"""Reliable dispatch from a real WAL: the window per consumer, the contiguous ack floor and its saves, nack
backoff, ack timeout, consumer loss, dead letters, the start position, and Key-Shared routing."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest
from broker_support import (
    CLOCK_SLACK,
    TOPIC,
    Run,
    message,
    offsets,
    payloads,
    quiet,
    receive,
    reliable,
    until,
)

from danube_fast.broker.config import DispatchConfig
from danube_fast.errors import ApiError
from danube_fast.meta.resources import SubscriptionType

EXCLUSIVE = SubscriptionType.EXCLUSIVE
SHARED = SubscriptionType.SHARED
FAILOVER = SubscriptionType.FAILOVER
KEY_SHARED = SubscriptionType.KEY_SHARED

# Nothing time-driven happens unless a test asks for it.
BASE = DispatchConfig(window=100, ack_timeout_ms=60_000, nack_base_delay_ms=20, nack_max_delay_ms=1000,
                      max_redeliveries=5, cursor_flush_acks=1000, cursor_flush_ms=60_000, buffer=100)


def config(**changes: int) -> DispatchConfig:
    return replace(BASE, **changes)


# -- window and acks -------------------------------------------------------------------------------------


def test_window_limits_unacked_messages_per_consumer(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, EXCLUSIVE, config(), preload=5) as rig:
            c, token = rig.consumer(1, window=3)
            assert offsets(await receive(c, token, 3)) == [0, 1, 2]
            await quiet(c)
            assert c.inflight == 3 and rig.dispatcher.unacked == 3
            assert rig.dispatcher.ack(0)
            assert offsets(await receive(c, token, 1)) == [3]
            await quiet(c)
            assert rig.dispatcher.ack(2)
            assert offsets(await receive(c, token, 1)) == [4]
            assert c.inflight == 3

    run(main())


def test_shared_round_robin_with_a_window_per_consumer(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, SHARED, config(), preload=5) as rig:
            c1, t1 = rig.consumer(1, window=2)
            c2, t2 = rig.consumer(2, window=2)
            assert offsets(await receive(c1, t1, 2)) == [0, 2]
            assert offsets(await receive(c2, t2, 2)) == [1, 3]
            await quiet(c1, c2)  # offset 4 waits for room
            assert rig.dispatcher.ack(1)
            assert offsets(await receive(c2, t2, 1)) == [4]  # c1 is still full
            await quiet(c1)

    run(main())


def test_acks_advance_the_cursor_only_contiguously(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, EXCLUSIVE, config(), preload=4) as rig:
            c, token = rig.consumer(1)
            assert offsets(await receive(c, token, 4)) == [0, 1, 2, 3]
            d = rig.dispatcher
            assert d.floor == -1 and d.backlog == 4
            assert d.ack(2)
            assert d.floor == -1  # 0 and 1 are not acknowledged yet
            assert d.ack(0)
            assert d.floor == 0
            assert d.ack(3)
            assert d.floor == 0
            assert d.ack(1)
            assert d.floor == 3 and d.backlog == 0 and d.unacked == 0
            assert not d.ack(1)  # a duplicate ack is no error, and changes nothing
            assert not d.ack(99)
            assert d.floor == 3 and c.inflight == 0

    run(main())


def test_cursor_is_saved_every_n_acks_and_on_close(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, EXCLUSIVE, config(cursor_flush_acks=3), preload=5) as rig:
            c, token = rig.consumer(1)
            assert offsets(await receive(c, token, 5)) == [0, 1, 2, 3, 4]
            d = rig.dispatcher
            d.ack(0)
            d.ack(1)
            await asyncio.sleep(0.03)
            assert rig.saved == []
            d.ack(2)
            await until(lambda: rig.saved == [2], what="a save after 3 acks")
            d.ack(4)
            d.ack(3)
            await asyncio.sleep(0.03)
            assert rig.saved == [2]  # 2 acks since the last save
            await d.close()
            assert rig.saved == [2, 4]  # the floor, at close
            await d.close()
            assert rig.saved == [2, 4]

    run(main())


def test_a_slow_cursor_save_does_not_hold_the_dispatching_back(tmp_path: Path, run: Run) -> None:
    """The save that acks made due runs beside the dispatch loop: while the store's write hangs, the acks'
    room goes to the next messages at once (a loop that awaited each save stalled there)."""
    async def main() -> None:
        hold = asyncio.Event()
        async with reliable(tmp_path, EXCLUSIVE, config(cursor_flush_acks=3), preload=8,
                            hold_saves=hold) as rig:
            c, token = rig.consumer(1, window=3)
            assert offsets(await receive(c, token, 3)) == [0, 1, 2]
            for o in (0, 1, 2):
                assert rig.dispatcher.ack(o)
            await until(lambda: rig.saved == [2], what="the save 3 acks made due, started")
            assert offsets(await receive(c, token, 3)) == [3, 4, 5]
            for o in (3, 4, 5):
                assert rig.dispatcher.ack(o)
            assert offsets(await receive(c, token, 2)) == [6, 7]  # while that save still writes
            assert rig.saved == [2]
            hold.set()
            for o in (6, 7):
                assert rig.dispatcher.ack(o)
            await rig.dispatcher.close()
            assert rig.saved == [2, 7]

    run(main())


def test_cursor_is_saved_after_the_flush_interval_when_it_moved(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, EXCLUSIVE, config(cursor_flush_ms=30), preload=2) as rig:
            c, token = rig.consumer(1)
            assert offsets(await receive(c, token, 2)) == [0, 1]
            await asyncio.sleep(0.07)
            assert rig.saved == []  # the floor did not move: nothing to write
            rig.dispatcher.ack(0)
            await until(lambda: rig.saved == [0], what="a timed save")
            rig.dispatcher.ack(1)
            await until(lambda: rig.saved == [0, 1], what="a second timed save")

    run(main())


def test_close_without_acks_saves_nothing(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, EXCLUSIVE, config(), preload=2, start=1) as rig:
            c, token = rig.consumer(1)
            assert offsets(await receive(c, token, 1)) == [1]
            await rig.dispatcher.close()
            assert rig.saved == []  # the floor is still start - 1, as loaded

    run(main())


# -- nack, ack timeout, dead letters ---------------------------------------------------------------------


def test_nack_redelivers_after_exponential_backoff(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, EXCLUSIVE, config(nack_base_delay_ms=40), preload=1) as rig:
            c, token = rig.consumer(1)
            d = rig.dispatcher
            assert offsets(await receive(c, token, 1)) == [0]
            elapsed = []
            for _ in range(2):
                started = time.monotonic()
                assert d.nack(0, None)
                assert not d.nack(0, None)  # no longer in flight
                (again,) = await receive(c, token, 1)
                elapsed.append(time.monotonic() - started)
                assert again.msg_id.topic_offset == 0 and again.payload == b"m0"
            assert elapsed[0] >= 0.040 - CLOCK_SLACK, elapsed
            assert elapsed[1] >= 0.080 - CLOCK_SLACK, elapsed  # base * 2^(n-1)
            assert d.redelivered == 2
            assert d.floor == -1 and d.unacked == 1
            assert d.ack(0)
            assert d.floor == 0
            await quiet(c)

    run(main())


def test_nack_waits_at_least_the_requested_delay(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, EXCLUSIVE, config(nack_base_delay_ms=10), preload=1) as rig:
            c, token = rig.consumer(1)
            await receive(c, token, 1)
            started = time.monotonic()
            assert rig.dispatcher.nack(0, 150)
            await receive(c, token, 1)
            assert time.monotonic() - started >= 0.150 - CLOCK_SLACK

    run(main())


def test_nack_delay_is_capped(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        cfg = config(nack_base_delay_ms=10, nack_max_delay_ms=50)
        async with reliable(tmp_path, EXCLUSIVE, cfg, preload=1) as rig:
            c, token = rig.consumer(1)
            await receive(c, token, 1)
            started = time.monotonic()
            assert rig.dispatcher.nack(0, 600_000)  # ten minutes asked, 50 ms allowed
            await receive(c, token, 1, timeout=2)
            assert time.monotonic() - started >= 0.050 - CLOCK_SLACK

    run(main())


def test_nack_of_unknown_offsets_is_refused(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, EXCLUSIVE, config(), preload=1) as rig:
            c, token = rig.consumer(1)
            await receive(c, token, 1)
            assert not rig.dispatcher.nack(1, None)
            assert rig.dispatcher.ack(0)
            assert not rig.dispatcher.nack(0, None)  # already acknowledged
            await quiet(c)

    run(main())


def test_ack_timeout_redelivers(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        cfg = config(ack_timeout_ms=60, nack_base_delay_ms=5)
        async with reliable(tmp_path, EXCLUSIVE, cfg, preload=1) as rig:
            c, token = rig.consumer(1)
            started = time.monotonic()
            assert offsets(await receive(c, token, 1)) == [0]
            (again,) = await receive(c, token, 1)
            assert again.msg_id.topic_offset == 0
            assert time.monotonic() - started >= 0.060 - CLOCK_SLACK
            assert rig.dispatcher.redelivered == 1
            assert rig.dispatcher.ack(0)
            assert rig.dispatcher.floor == 0
            await quiet(c, wait=0.1)  # acknowledged: not redelivered again

    run(main())


def test_a_late_ack_after_the_timeout_still_counts(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        cfg = config(ack_timeout_ms=20, nack_base_delay_ms=150)
        async with reliable(tmp_path, EXCLUSIVE, cfg, preload=1) as rig:
            c, token = rig.consumer(1)
            await receive(c, token, 1)
            await until(lambda: c.inflight == 0, what="the ack timeout")
            assert rig.dispatcher.ack(0)  # before the redelivery is due
            assert rig.dispatcher.floor == 0 and rig.dispatcher.unacked == 0
            await quiet(c, wait=0.2)
            assert rig.dispatcher.redelivered == 0

    run(main())


def test_dead_letter_after_max_redeliveries(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        cfg = config(max_redeliveries=2, nack_base_delay_ms=5, nack_max_delay_ms=20)
        async with reliable(tmp_path, SHARED, cfg, preload=2) as rig:
            c, token = rig.consumer(1)
            d = rig.dispatcher
            assert offsets(await receive(c, token, 2)) == [0, 1]
            assert d.ack(1)
            for _ in range(2):
                assert d.nack(0, None)
                assert offsets(await receive(c, token, 1)) == [0]
            assert rig.dead == [] and d.floor == -1
            assert d.nack(0, None)  # the third failure: more than max_redeliveries
            await until(lambda: len(rig.dead) == 1, what="the dead-letter callback")
            (dead,) = rig.dead
            assert (dead.msg_id.topic_offset, dead.msg_id.topic_name, dead.payload) == (0, TOPIC, b"m0")
            await until(lambda: d.floor == 1, what="the cursor past the dead letter")
            assert (d.dead_lettered, d.redelivered, d.unacked) == (1, 2, 0)
            await quiet(c)

    run(main())


def test_ack_timeouts_count_toward_the_dead_letter_limit(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        cfg = config(ack_timeout_ms=20, max_redeliveries=1, nack_base_delay_ms=1)
        async with reliable(tmp_path, EXCLUSIVE, cfg, preload=1) as rig:
            c, token = rig.consumer(1)
            assert offsets(await receive(c, token, 2)) == [0, 0]
            await until(lambda: len(rig.dead) == 1, what="the dead-letter callback")
            await until(lambda: rig.dispatcher.floor == 0, what="the cursor past the dead letter")
            await quiet(c)

    run(main())


# -- consumers coming and going --------------------------------------------------------------------------


def test_a_lost_shared_consumer_s_messages_go_to_another(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, SHARED, config(), preload=4) as rig:
            c1, t1 = rig.consumer(1)
            c2, t2 = rig.consumer(2)
            assert offsets(await receive(c1, t1, 1)) == [0]  # offset 2 stays queued, not yet written
            assert offsets(await receive(c2, t2, 2)) == [1, 3]
            rig.lose(c1, t1)
            moved = await receive(c2, t2, 2)
            assert sorted(offsets(moved)) == [0, 2]
            assert sorted(payloads(moved)) == [b"m0", b"m2"]
            assert c1.inflight == 0 and c1.queued == 0 and c2.inflight == 4
            assert rig.dispatcher.redelivered == 2
            for off in range(4):
                assert rig.dispatcher.ack(off)
            assert rig.dispatcher.floor == 3
            await rig.publish(message(4))
            assert offsets(await receive(c2, t2, 1)) == [4]
            assert c1.queued == 0

    run(main())


def test_a_lost_exclusive_consumer_gets_its_messages_back_on_reattach(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, EXCLUSIVE, config(), preload=2) as rig:
            c, old = rig.consumer(1)
            assert offsets(await receive(c, old, 2)) == [0, 1]
            rig.lose(c, old)
            await rig.publish(message(2))
            await quiet(c)  # nobody to deliver to: it waits (it is not dropped)
            assert rig.dispatcher.floor == -1
            new = c.attach()
            rig.sub.stream_started(c)
            assert offsets(await receive(c, new, 3)) == [0, 1, 2]
            assert await c.take(old) == []
            assert rig.dispatcher.redelivered == 2

    run(main())


def test_failover_standby_takes_over_the_unacked_messages(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, FAILOVER, config(), preload=3) as rig:
            primary, pt = rig.consumer(1)
            standby, st = rig.consumer(2)
            assert offsets(await receive(primary, pt, 3)) == [0, 1, 2]
            await quiet(standby)
            rig.dispatcher.ack(1)
            rig.lose(primary, pt)
            assert offsets(await receive(standby, st, 2)) == [0, 2]
            await rig.publish(message(3))
            assert offsets(await receive(standby, st, 1)) == [3]
            assert primary.queued == 0

    run(main())


def test_failover_back_to_the_first_consumer_takes_back_what_the_standby_holds(tmp_path: Path,
                                                                              run: Run) -> None:
    """The primary's stream is cut, the standby takes over and gets what the primary held; the primary comes
    back and is active again: it gets what the standby still holds before anything newer, so it never reads
    past an offset (the chaos campaign's poll-skip: 653, then 655 while the standby held 654)."""
    async def main() -> None:
        async with reliable(tmp_path, FAILOVER, config(), preload=3) as rig:
            primary, pt = rig.consumer(1)
            standby, st = rig.consumer(2)
            assert offsets(await receive(primary, pt, 3)) == [0, 1, 2]
            rig.dispatcher.ack(0)
            rig.lose(primary, pt)
            assert offsets(await receive(standby, st, 2)) == [1, 2]
            back = primary.attach()
            rig.sub.stream_started(primary)
            await rig.publish(message(3))
            assert offsets(await receive(primary, back, 3)) == [1, 2, 3]
            rig.dispatcher.ack(1)  # the standby's late ack of a message taken back still counts
            await rig.publish(message(4))
            assert offsets(await receive(primary, back, 1)) == [4]
            await quiet(standby)
            assert rig.dispatcher.floor == 1

    run(main())


def test_takeover_redelivers_to_the_same_consumer(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, EXCLUSIVE, config(), preload=2) as rig:
            c, old = rig.consumer(1)
            assert offsets(await receive(c, old, 2)) == [0, 1]
            rig.sub.takeover(c)  # Subscribe again with the same name (docs/WIRE.md C.7 step 2)
            assert await c.take(old) == []
            new = c.attach()
            rig.sub.stream_started(c)
            assert offsets(await receive(c, new, 2)) == [0, 1]
            assert c.inflight == 2

    run(main())


def test_messages_wait_for_a_first_consumer(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, SHARED, config(), preload=2) as rig:
            await asyncio.sleep(0.02)
            assert rig.dispatcher.floor == -1 and rig.dispatcher.backlog == 2
            c, token = rig.consumer(1)
            assert offsets(await receive(c, token, 2)) == [0, 1]
            await rig.publish(message(2), message(3))
            assert offsets(await receive(c, token, 2)) == [2, 3]

    run(main())


def test_exclusive_refuses_a_second_active_consumer(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, EXCLUSIVE, config(), preload=0) as rig:
            holder, token = rig.consumer(1, name="holder")
            with pytest.raises(ApiError) as info:
                rig.sub.check_admits("other", 0)
            assert info.value.grpc_code == "PERMISSION_DENIED"
            rig.lose(holder, token)
            assert rig.sub.check_admits("other", 0) == [holder]

    run(main())


# -- start position, Key-Shared --------------------------------------------------------------------------


def test_start_position_is_honoured(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, EXCLUSIVE, config(), preload=5, start=3) as rig:
            d = rig.dispatcher
            assert d.floor == 2 and d.backlog == 2
            c, token = rig.consumer(1)
            assert offsets(await receive(c, token, 2)) == [3, 4]
            await quiet(c)
            assert d.ack(3) and d.ack(4)
            assert d.floor == 4
            assert not d.ack(1)  # below the start: never delivered
            await rig.publish(message(5))
            assert offsets(await receive(c, token, 1)) == [5]

    run(main())


def test_key_shared_routes_by_key_and_skips_keys_no_filter_accepts(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, KEY_SHARED, config(nack_base_delay_ms=5)) as rig:
            ca, ta = rig.consumer(1, filters=["a-*"])
            cb, tb = rig.consumer(2, filters=["b-*"])
            await rig.publish(message(0, key="a-1"), message(1, key="nobody"), message(2, key="b-1"),
                              message(3, key="a-2"), message(4, producer="b-producer"))
            assert offsets(await receive(ca, ta, 2)) == [0, 3]
            assert offsets(await receive(cb, tb, 2)) == [2, 4]
            d = rig.dispatcher
            assert d.nack(3, None)
            assert offsets(await receive(ca, ta, 1)) == [3]  # the key keeps its consumer
            for off in (0, 2, 3, 4):
                assert d.ack(off)
            assert d.floor == 4  # offset 1 went to nobody and does not hold the floor back
            await quiet(ca, cb)

    run(main())


def test_key_shared_message_no_filter_accepts_moves_the_cursor(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, KEY_SHARED, config()) as rig:
            c, _ = rig.consumer(1, filters=["a-*"])
            await rig.publish(message(0, key="nobody"), message(1, key="nobody-either"))
            await until(lambda: rig.dispatcher.floor == 1, what="the cursor past unroutable keys")
            assert rig.dispatcher.unacked == 0
            await quiet(c)

    run(main())


def test_key_shared_messages_wait_for_their_only_consumer_to_come_back(tmp_path: Path, run: Run) -> None:
    """A Reliable subscription must not lose a key's messages while the one consumer whose filters accept
    it reconnects (as Exclusive and Shared subscriptions wait when nobody can take a message)."""

    async def main() -> None:
        async with reliable(tmp_path, KEY_SHARED, config()) as rig:
            ca, old = rig.consumer(1, filters=["a-*"])
            cb, tb = rig.consumer(2, filters=["b-*"])
            await rig.publish(message(0, key="a-1"))
            assert offsets(await receive(ca, old, 1)) == [0]
            rig.lose(ca, old)  # its stream breaks; the client reconnects (docs/WIRE.md C.8)
            await rig.publish(message(1, key="a-2"), message(2, key="b-1"))
            assert offsets(await receive(cb, tb, 1)) == [2]
            assert rig.dispatcher.ack(2)
            await asyncio.sleep(0.02)
            assert rig.dispatcher.floor == -1  # offsets 0 and 1 are not acknowledged
            new = ca.attach()
            rig.sub.stream_started(ca)
            assert offsets(await receive(ca, new, 2, timeout=1)) == [0, 1]

    run(main())


def test_key_shared_drops_a_removed_consumer_s_keys_no_one_else_accepts(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        async with reliable(tmp_path, KEY_SHARED, config()) as rig:
            ca, ta = rig.consumer(1, filters=["a-*"])
            cb, tb = rig.consumer(2, filters=["b-*"])
            await rig.publish(message(0, key="a-1"), message(1, key="b-1"))
            assert offsets(await receive(ca, ta, 1)) == [0]
            assert offsets(await receive(cb, tb, 1)) == [1]
            assert rig.dispatcher.ack(1)
            rig.sub.remove(ca)  # gone for good: no consumer accepts a-1 any more
            await until(lambda: rig.dispatcher.floor == 1, what="the cursor past the orphaned key")
            assert rig.dispatcher.unacked == 0
            await quiet(cb)

    run(main())


def test_key_shared_a_full_consumer_does_not_stop_other_keys(tmp_path: Path, run: Run) -> None:
    """One consumer's window is full: its key's messages are parked, in order, while the other key's
    consumer keeps receiving; an ack releases the parked ones, in offset order."""

    async def main() -> None:
        async with reliable(tmp_path, KEY_SHARED, config(window=1)) as rig:
            ca, ta = rig.consumer(1, filters=["a-*"])
            cb, tb = rig.consumer(2, filters=["b-*"])
            await rig.publish(message(0, key="a-1"), message(1, key="a-1"), message(2, key="b-1"),
                              message(3, key="a-1"), message(4, key="b-1"))
            assert offsets(await receive(ca, ta, 1)) == [0]
            assert offsets(await receive(cb, tb, 1)) == [2]  # not stuck behind offset 1
            assert rig.dispatcher.ack(2)
            assert offsets(await receive(cb, tb, 1)) == [4]
            assert rig.dispatcher.ack(0)
            assert offsets(await receive(ca, ta, 1)) == [1]
            assert rig.dispatcher.ack(1)
            assert offsets(await receive(ca, ta, 1)) == [3]
            assert rig.dispatcher.redelivered == 0  # parking is not a redelivery
            assert rig.dispatcher.ack(3) and rig.dispatcher.ack(4)
            await until(lambda: rig.dispatcher.floor == 4, what="the cursor over every offset")

    run(main())

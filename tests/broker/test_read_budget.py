"""The offset reader's share of the broker's byte budget (dispatch/budget.py ReadBudget): reads wait for
room, one read at a time may go over the budget (so stalled dispatchers holding all of it cannot stop
reads), and every reservation is given back once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from danube_fast.broker.dispatch.budget import ByteBudget, ReadBudget

Run = Callable[..., Any]


def test_reads_wait_for_room_and_one_may_go_over(run: Run) -> None:
    async def main() -> None:
        budget = ByteBudget(100)
        reads = ReadBudget(budget)
        first = await reads.reserve(60)
        assert not first.over and budget.held == 60
        second = await reads.reserve(60)  # no room, but nobody is over: this one may be
        assert second.over and budget.held == 120
        third = asyncio.ensure_future(reads.reserve(30))
        await asyncio.sleep(0.01)
        assert not third.done() and reads.waiting == 1  # no room and one read is over already
        second.release()
        got = await asyncio.wait_for(third, 1)  # 90 of 100: room
        assert not got.over and budget.held == 90
        second.release()  # twice: nothing more given back
        assert budget.held == 90
        first.release()
        got.release()
        assert budget.held == 0

    run(main())


def test_dispatchers_holding_the_whole_budget_do_not_stop_reads(run: Run) -> None:
    async def main() -> None:
        budget = ByteBudget(100)
        budget.take(100)  # stalled consumers' dispatchers hold everything
        reads = ReadBudget(budget)
        one = await reads.reserve(50)  # over: goes on
        assert one.over
        two = asyncio.ensure_future(reads.reserve(50))
        await asyncio.sleep(0.01)
        assert not two.done()
        one.release()  # the budget is still full, but no read is over it now: the next one goes
        assert (await asyncio.wait_for(two, 1)).over
        assert budget.held == 150

    run(main())


def test_a_response_larger_than_asked_grows_its_reservation(run: Run) -> None:
    async def main() -> None:
        budget = ByteBudget(1000)
        held = await ReadBudget(budget).reserve(100)
        held.grow(400)  # one batch larger than the room asked
        held.grow(50)  # never shrinks
        assert budget.held == 400
        held.release()
        assert budget.held == 0

    run(main())

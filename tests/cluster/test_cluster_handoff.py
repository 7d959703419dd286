"""Where offsets continue after a move (danube_fast/broker/cluster/handoff.py), on both metadata stores."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import pytest

from danube_fast.broker.cluster import handoff
from danube_fast.broker.cluster.guard import TopicGuard, Write
from danube_fast.errors import ApiError
from danube_fast.meta import keys
from danube_fast.meta.fencing import Ownership, OwnershipLost
from danube_fast.meta.resources import ObjectDescriptor, RetentionState, SealedState
from danube_fast.meta.store import MetadataStore, Op, Put, TxnResult
from danube_fast.storage.gaps import uncovered

pytestmark = [pytest.mark.timeout(30), pytest.mark.cluster]


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def descriptor(start: int, end: int) -> ObjectDescriptor:
    return ObjectDescriptor(f"data-{start}-{end}.dnb1", start, end, 100, True, 1)


async def put_objects(store: MetadataStore, *ranges: tuple[int, int]) -> None:
    for start, end in ranges:
        await store.put(keys.object_descriptor("ns", "t", start), descriptor(start, end).to_json())


async def put_state(store: MetadataStore, sealed: bool, last: int, broker: int,
                    gaps: list[list[int]] | None = None) -> None:
    extra: dict[str, Any] = {"gaps": gaps} if gaps else {}
    await store.put(keys.sealed_state("ns", "t"), SealedState(sealed, last, broker, 1, extra=extra).to_json())


def test_contiguous_end_and_open_gaps() -> None:
    found = [descriptor(0, 9), descriptor(10, 19), descriptor(30, 39)]
    assert handoff.uploaded_through(found) == 19
    assert handoff.uploaded_through([]) == -1
    assert handoff.open_gaps([(20, 29, 7)], found) == [(20, 29, 7)]
    assert handoff.open_gaps([(15, 29, 7)], found) == [(20, 29, 7)]  # partly covered
    assert handoff.open_gaps([(20, 29, 7)], [*found, descriptor(20, 29)]) == []
    # open_gaps stops at the first offset missing; uncovered lists every run no object covers
    assert uncovered(5, 50, found) == [(20, 29), (40, 50)]
    assert uncovered(20, 29, found) == [(20, 29)] and uncovered(0, 19, found) == []


def test_a_new_topic_starts_at_zero_and_keeps_a_local_wal(store: Any) -> None:
    async def body() -> None:
        async with store() as s:
            point = await handoff.load_point(s, "ns", "t", 1)
            assert point == handoff.LoadPoint(0, True, -1, ())
    run(body())


def test_sealed_state_continues_without_a_gap(store: Any) -> None:
    async def body() -> None:
        async with store() as s:
            await put_objects(s, (0, 21))
            await put_state(s, True, 21, 1)
            point = await handoff.load_point(s, "ns", "t", 2)
            assert (point.start, point.keep_local, point.uploaded, point.gaps) == (22, False, 21, ())
    run(body())


def test_a_dead_owners_reservation_is_skipped_and_its_range_is_a_gap(store: Any) -> None:
    async def body() -> None:
        async with store() as s:
            await put_objects(s, (0, 9))
            await put_state(s, False, 1_000_009, 1)  # broker 1 reserved through 1,000,009, then died
            point = await handoff.load_point(s, "ns", "t", 2)
            assert point.start == 1_000_010  # never an offset broker 1 may have acknowledged
            assert point.gaps == ((10, 1_000_009, 1),)
            assert not point.keep_local
            # the same broker back on its own reservation continues its local log
            mine = await handoff.load_point(s, "ns", "t", 1)
            assert mine.keep_local and mine.start == 1_000_010
    run(body())


def test_gaps_below_retentions_floor_are_not_waited_for(store: Any) -> None:
    """A dead owner's gap recovered and then deleted by retention (docs/RETENTION.md) looks open again to the
    descriptors; the retention state's floor says it is gone, not pending."""
    async def body() -> None:
        async with store() as s:
            await put_state(s, True, 99, 1, gaps=[[10, 19, 7], [30, 49, 8]])
            await put_objects(s, (50, 99))
            await s.put(keys.retention_state("ns", "t"), RetentionState(40).to_json())
            point = await handoff.load_point(s, "ns", "t", 2)
            assert point.gaps == ((40, 49, 8),)  # the first gone, the second cut at the floor
            await s.delete(keys.retention_state("ns", "t"))
            point = await handoff.load_point(s, "ns", "t", 2)
            assert point.gaps == ((10, 19, 7), (30, 49, 8))
    run(body())


def test_gaps_are_carried_until_descriptors_cover_them(store: Any) -> None:
    async def body() -> None:
        async with store() as s:
            await put_objects(s, (0, 9), (100, 149))
            await put_state(s, True, 149, 2, gaps=[[10, 99, 1]])
            assert (await handoff.load_point(s, "ns", "t", 3)).gaps == ((10, 99, 1),)
            await put_objects(s, (10, 40))  # broker 1 came back and uploaded what it had
            await s.put(keys.object_descriptor("ns", "t", 41),
                        ObjectDescriptor("", 41, 99, 0, True, 1).to_json())  # and declared the rest empty
            point = await handoff.load_point(s, "ns", "t", 3)
            assert point.gaps == () and point.start == 150 and point.uploaded == 149
    run(body())


def test_reservation_extends_ahead_and_state_ops(store: Any) -> None:
    async def body() -> None:
        async with store() as s:
            async def write(ops: list[Op]) -> TxnResult:
                return await s.transaction([], ops, [])

            r = handoff.Reservation("ns", "t", 5, write, 1000, [(3, 4, 9)])
            assert r.needs(0)
            await r.extend(0)
            assert r.through == 1000 and not r.needs(1000) and r.needs(1001)
            assert not r.low(400) and r.low(501)
            state = SealedState.from_json((await s.get(keys.sealed_state("ns", "t"))).value)  # type: ignore[union-attr]
            assert (state.sealed, state.last_committed_offset, state.broker_id) == (False, 1000, 5)
            assert state.extra["gaps"] == [[3, 4, 9]]
            # sealing with nothing ever committed deletes the key: the next owner starts at 0 unprompted
            ops = handoff.state_ops("ns", "t", 5, sealed=True, last=-1, gaps=[])
            await s.transaction([], ops, [])
            assert await s.get(keys.sealed_state("ns", "t")) is None
            assert handoff.state_ops("ns", "t", 5, sealed=False, last=-1, gaps=[]) == []
            assert isinstance(handoff.state_ops("ns", "t", 5, sealed=True, last=7, gaps=[])[0], Put)
    run(body())


async def _guard(s: MetadataStore, written: Callable[[], None] = lambda: None
                 ) -> tuple[TopicGuard, Ownership]:
    """A TopicGuard on a real assignment of topic ns/t to broker 5; `written` runs when a reservation write
    has just completed, before the guard goes on."""
    key = keys.broker_topic(5, "ns", "t")
    await s.put(key, b"null")
    ownership = await Ownership.acquire(s, 5, "ns", "t", lambda: float("inf"))
    def reservation(guard_write: Write) -> handoff.Reservation:
        async def write(ops: Sequence[Op]) -> TxnResult:
            result = await guard_write(ops)
            written()
            return result

        return handoff.Reservation("ns", "t", 5, write, 1000, [])

    guard = TopicGuard("/ns/t", ownership, lambda: (1, 0), lambda: False, reservation)
    return guard, ownership


async def _seal_here(s: MetadataStore, guard: TopicGuard) -> None:
    """What the placement does when an unload names this broker: fence on the marker, then close."""
    await s.put(keys.unassigned("ns", "t"), b"{}")
    kv = await s.get(keys.unassigned("ns", "t"))
    assert kv is not None
    guard.fence_on(Ownership(s, kv.key, kv.create_revision, lambda: float("inf")))
    guard.close()


def test_admissions_keep_their_order_while_the_reservation_is_written(store: Any) -> None:
    """An append that waits for the reservation holds back the ones after it: a producer's batches reach
    the WAL in the order it sent them. (The cluster bench found two batches swapped right after a load:
    appends that arrived as the load's reservation write completed went before one that had waited.)"""
    async def body() -> None:
        async with store() as s:
            order: list[int] = []
            later: list[asyncio.Task[None]] = []

            async def append(n: int) -> None:
                await guard.admit(10)
                order.append(n)  # the WAL takes the append right after admit, without awaiting
                guard.done()

            def arrive() -> None:
                if not later:
                    later.extend(asyncio.create_task(append(n)) for n in (1, 2))

            guard, _ = await _guard(s, arrive)
            loading = asyncio.create_task(guard.admit(0))  # what a load does first: write the reservation
            await asyncio.sleep(0)
            first = asyncio.create_task(append(0))  # waits for that reservation
            await asyncio.gather(loading, first)
            await asyncio.gather(*later)
            assert order == [0, 1, 2]
            assert guard.reservation is not None and guard._next == 30
    run(body())


def test_confirm_waits_for_the_seal_when_the_assignment_went(store: Any) -> None:
    """An unload deletes the assignment before the owner seals: an append written in between is in the
    sealed state, so it is confirmed once the seal's fence (the unload marker) replaced the lost ownership
    rather than refused (which would have its producer store it again at the next owner)."""
    async def body() -> None:
        async with store() as s:
            guard, ownership = await _guard(s)
            await guard.admit(1)
            guard.done()
            await s.delete(ownership.key)
            with pytest.raises(OwnershipLost):
                await ownership.write_fenced([Put("/x", b"1")])  # a cursor write finds the assignment gone
            confirming = asyncio.create_task(guard.confirm())
            await asyncio.sleep(0.05)
            assert not confirming.done()
            await _seal_here(s, guard)
            await asyncio.wait_for(confirming, 1)
            # dropped instead of sealed: refused
            guard2, ownership2 = await _guard(s)
            await guard2.admit(1)
            guard2.done()
            await s.delete(ownership2.key)
            with pytest.raises(OwnershipLost):
                await ownership2.write_fenced([Put("/x", b"1")])
            confirming = asyncio.create_task(guard2.confirm())
            await asyncio.sleep(0.05)
            guard2.close()
            with pytest.raises(ApiError) as refused:
                await asyncio.wait_for(confirming, 1)
            assert refused.value.grpc_code == "UNAVAILABLE"
    run(body())


def test_a_write_refused_before_the_seal_is_made_again_under_the_marker(store: Any) -> None:
    """The same window for the owner's metadata writes: an upload's descriptor refused because the
    assignment went is written under the unload marker once the seal begins (it used to stop the uploader
    for good, and the seal's drain failed)."""
    async def body() -> None:
        async with store() as s:
            guard, ownership = await _guard(s)
            await s.delete(ownership.key)
            writing = asyncio.create_task(guard.write([Put("/descriptor", b"1")]))
            await asyncio.sleep(0.05)
            assert not writing.done()
            await _seal_here(s, guard)
            assert (await asyncio.wait_for(writing, 1)).succeeded
            assert await s.get("/descriptor") is not None
    run(body())

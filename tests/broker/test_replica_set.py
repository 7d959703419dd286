"""The owner's side of a replicated topic (broker/cluster/replication/owner.py, docs/REPLICATION.md) on a
real WAL, its metadata writes recorded: the order of its steps is what makes a failover lose nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from danube_fast.broker.cluster.replication.owner import ReplicaSet
from danube_fast.codec import frames
from danube_fast.codec.replication_wire import FetchAnswer, decode_fetch_response
from danube_fast.errors import ApiError
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.resources import TopicReplicas
from danube_fast.meta.store import Op, Put, TxnResult
from danube_fast.names import TopicName
from danube_fast.proto import Replication_pb2 as pb
from danube_fast.storage import Wal
from danube_fast.storage.objects.folder import FolderStore
from danube_fast.storage.uploader import Uploader

Run = Callable[..., Any]
ME, F = 1, 2


class Topic(SimpleNamespace):
    def replicate(self, replicas: Any) -> None:
        self.replicas = replicas


async def replica_set(tmp_path: Path, needed: int, lag_s: float = 60.0
                      ) -> tuple[ReplicaSet, Wal, list[TopicReplicas]]:
    wal = await Wal.open(tmp_path)
    name = TopicName("default", "t")
    topic = Topic(wal=wal, name=name, full=name.full, uploader=None, replicas=None)
    written: list[TopicReplicas] = []

    async def write(ops: Sequence[Op]) -> TxnResult:
        for op in ops:
            assert isinstance(op, Put)
            written.append(TopicReplicas.from_json(op.value))
        return TxnResult(True, 1, [])

    rs = ReplicaSet(topic, ME, 7, write, 2, needed, lag_s)  # type: ignore[arg-type]
    await rs.start([F])
    return rs, wal, written


async def settle(rs: ReplicaSet) -> None:
    """Wait for the writes fetches scheduled to land."""
    await asyncio.gather(*rs._tasks)


def batch(n: int) -> bytes:
    return frames.encode_payloads([b"r%d" % i for i in range(n)])


async def fetch(rs: ReplicaSet, low: int, durable: int | None = None) -> FetchAnswer:
    """F's fetch from `low`, holding durably what it has (or up to `durable`: appends still being made), read
    as the follower reads it."""
    return decode_fetch_response((await rs.fetch(pb.FetchRequest(
        topic="/default/t", follower_id=F, epoch=7, from_offset=low,
        durable_offset=low if durable is None else durable), "grpc")).encode())


def test_a_follower_joins_in_memory_first_and_is_written_in_sync_once_it_holds_what_was_acknowledged(
        tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        rs, wal, written = await replica_set(tmp_path, needed=2)
        assert written == [TopicReplicas(ME, 7, (F,), (ME,))]  # the owner alone in sync at first
        refused = time.monotonic()
        with pytest.raises(ApiError, match="1 copies in sync, fewer than its minInSyncReplicas 2"):
            await rs.admit()  # after waiting a quarter of the lag (at most 1 s) for a copy to come
        assert time.monotonic() - refused >= 0.9
        await wal.append(batch(3))
        assert wal.committed_offset == 3  # no follower in sync: readers see what is durable here
        start = await fetch(rs, -1)
        assert (start.start_offset, start.data) == (0, b"")
        got = await fetch(rs, 0)  # it holds nothing of the 3 records yet: not caught up
        assert got.next_offset == 3 and F not in rs.isr
        await wal.append(batch(2))  # 5 here now
        await fetch(rs, 3)  # it holds what was durable here when it was sent 0..2: caught up, joins in memory
        assert F in rs.isr and rs.written == written[-1] == written[0]  # not written: it lacks 3..4
        await rs.admit()
        await wal.append(batch(1))  # offset 5, after it joined
        waiting = asyncio.create_task(rs.replicated(5))
        await asyncio.sleep(0.05)
        # Readers keep what they saw (0..4) and are held there: no follower has 5 yet.
        assert not waiting.done() and wal.committed_offset == 5
        await fetch(rs, 6, durable=4)  # it has 3..5, durably 3 alone (appends pipelined)
        await settle(rs)
        assert rs.written == written[0] and not waiting.done()
        await fetch(rs, 6, durable=5)  # it holds 0..4, all that was here when it joined: written in sync
        await settle(rs)
        assert written[-1] == TopicReplicas(ME, 7, (F,), (ME, F)) and not waiting.done()
        await fetch(rs, 6)  # and 5: the ack goes, readers see it
        await asyncio.wait_for(waiting, 1)
        assert wal.committed_offset == 6
        await fetch(rs, 0)  # its copy started again: it holds less than it said
        assert wal.committed_offset == 6  # readers are not moved back
        await rs.maintain({ME, F}, lambda n, taken: [])
        assert written[-1] == TopicReplicas(ME, 7, (F,), (ME,)) and F not in rs.isr  # out, and not eligible
        rs.close()
        await wal.close()

    run(main())


def test_an_acknowledgement_waiting_when_the_copies_stop_being_kept_fails(tmp_path: Path, run: Run) -> None:
    """The topic lost or unloaded while an acknowledgement waits for its follower: it must not go out with
    one copy (the fence alone may still pass)."""
    async def main() -> None:
        rs, wal, _ = await replica_set(tmp_path, needed=2)
        await wal.append(batch(3))
        await fetch(rs, 0)
        await fetch(rs, 3)
        await settle(rs)
        await wal.append(batch(2))
        held = asyncio.create_task(rs.replicated(2))  # on the follower already
        waiting = asyncio.create_task(rs.replicated(4))  # not yet
        await asyncio.sleep(0.02)
        rs.close()
        await asyncio.wait_for(held, 1)
        with pytest.raises(ApiError, match="stopped being replicated here before offset 4"):
            await asyncio.wait_for(waiting, 1)
        # Lost or unloaded, it may still be read until it goes, while a successor continues from the
        # follower's copy at 3: readers stay where they were. A policy back at one copy lets them on.
        assert wal.committed_offset == 3
        rs.close(release=True)
        assert wal.committed_offset == 5
        await wal.close()

    run(main())


def test_sends_waiting_for_copies_pass_together_in_order_once_a_follower_is_back(tmp_path: Path,
                                                                               run: Run) -> None:
    async def main() -> None:
        rs, wal, _ = await replica_set(tmp_path, needed=2)
        passed: list[int] = []

        async def send(n: int) -> None:
            await rs.admit()
            passed.append(n)

        sends = [asyncio.create_task(send(n)) for n in range(5)]
        await asyncio.sleep(0.05)
        assert passed == []  # waiting, not refused: a follower may be a moment away
        await fetch(rs, 0)  # it holds all there is (nothing): joins
        sends.append(asyncio.create_task(send(5)))  # arrives before the waiting ones resumed: after them
        await asyncio.wait_for(asyncio.gather(*sends), 1)
        assert passed == [0, 1, 2, 3, 4, 5]
        rs.close()
        await wal.close()

    run(main())


def test_sends_queued_behind_a_refused_one_are_refused_even_if_a_follower_joins_meanwhile(
        tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        rs, wal, _ = await replica_set(tmp_path, needed=2, lag_s=0.04)  # waits 10 ms for copies

        async def send() -> str:
            try:
                await rs.admit()
                return "in"
            except ApiError:
                return "refused"

        sends = [asyncio.create_task(send()) for _ in range(4)]
        # The moment the first is refused, the follower is back: the three queued behind it must not
        # overtake it (they arrived before the refusal).
        sends[0].add_done_callback(lambda _: rs._progress(F, rs.followers[F], 0, 0))
        assert await asyncio.wait_for(asyncio.gather(*sends), 1) == ["refused"] * 4
        assert F in rs.isr
        assert await send() == "in"  # one sent after the refusal, with the copies in sync
        rs.close()
        await wal.close()

    run(main())


def test_a_lagging_follower_is_written_out_first_and_stays_eligible_when_below_the_minimum(
        tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        rs, wal, written = await replica_set(tmp_path, needed=2, lag_s=0.05)
        await wal.append(batch(2))
        await fetch(rs, 0)
        await fetch(rs, 2)
        await settle(rs)
        assert written[-1].isr == (ME, F)
        await wal.append(batch(2))
        waiting = asyncio.create_task(rs.replicated(3))
        await asyncio.sleep(0.1)  # F fetches nothing: past the lag
        await rs.maintain({ME, F}, lambda n, taken: [])
        assert written[-1] == TopicReplicas(ME, 7, (F,), (ME,), (F,))  # written out, before memory
        assert F not in rs.isr
        with pytest.raises(ApiError, match="fewer than its minInSyncReplicas 2"):
            await asyncio.wait_for(waiting, 1)
        # F may still continue the topic (eligible) from its copy's end: readers see nothing it lacks, or
        # the record a reader saw at 2 could be another one after a failover to F.
        assert wal.committed_offset == 2
        await fetch(rs, 2)  # what it was sent long ago (past a quarter of the lag): not caught up
        assert F not in rs.isr and written[-1].eligible == (F,) and wal.committed_offset == 2
        await fetch(rs, 3, durable=3)  # an eligible follower's progress moves the readers' line
        assert F not in rs.isr and wal.committed_offset == 3
        await fetch(rs, 4)  # all that is here: joins, and holding it, is written in sync
        await settle(rs)
        assert written[-1] == TopicReplicas(ME, 7, (F,), (ME, F))  # back at the minimum: none eligible
        assert wal.committed_offset == 4
        rs.close()
        await wal.close()

    run(main())


def test_a_dead_follower_in_sync_stays_named_while_eligible_and_goes_once_its_replacement_is_in_sync(
        tmp_path: Path, run: Run) -> None:
    """F crashed (its registration expired) while in sync, minInSyncReplicas 2: its disk holds every
    acknowledged record, so it stays named, eligible, beside the broker that replaces it; should the owner's
    machine be lost before that one caught up, F continues the topic when it is back."""
    async def main() -> None:
        rs, wal, written = await replica_set(tmp_path, needed=2)
        await wal.append(batch(2))
        await fetch(rs, 0)
        await fetch(rs, 2)
        await settle(rs)
        assert written[-1].isr == (ME, F)
        await wal.append(batch(1))  # not on F
        await rs.maintain({ME, 3}, lambda n, taken: [3][:n])
        assert written[-1] == TopicReplicas(ME, 7, (F, 3), (ME,), (F,))
        assert wal.committed_offset == 2  # F may continue the topic: readers see nothing it lacks
        await rs.maintain({ME, 3}, lambda n, taken: [])  # nothing changed: nothing written
        assert len(written) == 3 and written[-1].eligible == (F,)
        await rs.fetch(pb.FetchRequest(topic="/default/t", follower_id=3, epoch=7, from_offset=0,
                                       durable_offset=0), "grpc")
        await rs.fetch(pb.FetchRequest(topic="/default/t", follower_id=3, epoch=7, from_offset=3,
                                       durable_offset=3), "grpc")
        await settle(rs)
        assert written[-1] == TopicReplicas(ME, 7, (F, 3), (ME, 3))  # back at the minimum
        await rs.maintain({ME, 3}, lambda n, taken: [])
        assert written[-1] == TopicReplicas(ME, 7, (3,), (ME, 3)) and set(rs.followers) == {3}
        rs.close()
        await wal.close()

    run(main())


def test_a_dead_follower_is_replaced_and_a_fetch_that_does_not_fit_resets(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        rs, wal, written = await replica_set(tmp_path, needed=1)
        await wal.append(batch(2))
        await fetch(rs, 0)
        await rs.maintain({ME, 3}, lambda n, taken: [3][:n])  # F's registration is gone
        assert written[-1] == TopicReplicas(ME, 7, (3,), (ME,)) and set(rs.followers) == {3}
        rs.followers[F] = type(rs.followers[3])()  # as if F came back and were named again
        reset = await fetch(rs, 5)  # past the owner's end: another log's copy
        assert reset.reset and reset.start_offset == 0
        await rs.replicated(1)  # needed 1: the owner alone acknowledges
        rs.close()
        await wal.close()

    run(main())


def test_a_planned_move_hands_over_to_a_follower_once_it_holds_every_record(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        rs, wal, _ = await replica_set(tmp_path, needed=1)
        await wal.append(batch(3))
        await fetch(rs, 0)
        await fetch(rs, 3)  # holds 0..2 durably: in sync, and written so
        await settle(rs)
        assert F in rs.isr and rs.written is not None and F in rs.written.isr
        await wal.append(batch(2))  # appends stop here: 5 records
        handing = asyncio.create_task(rs.hand_over(5.0))
        await asyncio.sleep(0.05)
        assert not handing.done()  # it holds 3 of 5: it could not continue the topic yet
        await fetch(rs, 5)  # now it holds all 5
        assert await asyncio.wait_for(handing, 1.0) == [F]
        rs.close()
        await wal.close()

    run(main())


def test_a_planned_move_hands_over_to_no_one_when_no_follower_catches_up_in_time(tmp_path: Path,
                                                                                 run: Run) -> None:
    async def main() -> None:
        rs, wal, _ = await replica_set(tmp_path, needed=1)
        await wal.append(batch(3))
        await fetch(rs, 0)
        await fetch(rs, 3)
        await settle(rs)
        await wal.append(batch(2))
        assert await rs.hand_over(0.1) == []  # the move uploads the tail instead
        rs.isr.clear()
        assert await rs.hand_over(0.1) == []  # a follower out of the in-sync set is never handed to
        rs.close()
        await wal.close()

    run(main())


def test_a_lowered_factor_drops_the_extra_followers_out_of_sync_first_never_below_the_minimum(
        tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        g, h = 3, 4
        wal = await Wal.open(tmp_path)
        name = TopicName("default", "t")
        topic = Topic(wal=wal, name=name, full=name.full, uploader=None, replicas=None)
        written: list[TopicReplicas] = []

        async def write(ops: Sequence[Op]) -> TxnResult:
            written.extend(TopicReplicas.from_json(op.value) for op in ops if isinstance(op, Put))
            return TxnResult(True, 1, [])

        rs = ReplicaSet(topic, ME, 7, write, 4, 3, 60.0)  # type: ignore[arg-type]
        await rs.start([F, g, h])
        await wal.append(batch(3))
        for follower in (F, g):  # h never fetches: out of sync
            for low in (0, 3):
                await rs.fetch(pb.FetchRequest(topic="/default/t", follower_id=follower, epoch=7,
                                               from_offset=low, durable_offset=low), "native")
        await settle(rs)
        assert written[-1].isr == (ME, F, g)
        rs.copies = 3
        await rs.maintain({ME, F, g, h}, lambda n, taken: [])
        assert written[-1] == TopicReplicas(ME, 7, (F, g), (ME, F, g))  # h went, out of sync
        rs.copies = 2  # one more would go, but that leaves 2 in sync, fewer than the minimum 3
        await rs.maintain({ME, F, g}, lambda n, taken: [])
        assert written[-1] == TopicReplicas(ME, 7, (F, g), (ME, F, g))
        rs.needed = 2
        await rs.maintain({ME, F, g}, lambda n, taken: [])
        assert len(written[-1].followers) == 1 and len(written[-1].isr) == 2
        assert rs.followers.keys() == set(written[-1].followers) and len(rs.isr) == 1
        rs.close()
        await wal.close()

    run(main())


def test_a_fetch_before_the_topics_uploader_started_starts_the_copy_at_the_wals_first_offset(
        tmp_path: Path, run: Run) -> None:
    """A follower may fetch from a new owner still loading the topic (its uploader not started: what the
    objects hold is not known yet): the answer says the objects hold nothing, so the copy starts at the
    WAL's first offset and keeps all of it. Once the uploader knows, fetches say what it knows."""
    async def main() -> None:
        rs, wal, _ = await replica_set(tmp_path, 1)
        meta = await EmbeddedStore.open(tmp_path / "meta.db")
        uploader = Uploader(wal, FolderStore(str(tmp_path / "objects")), meta, "default", "t")
        rs.topic.uploader = uploader
        await wal.append(batch(3))
        first = await rs.fetch(pb.FetchRequest(topic="/default/t", follower_id=F, epoch=7, from_offset=-1,
                                               durable_offset=-1), "native")
        got = decode_fetch_response(first.encode())
        assert (got.start_offset, got.uploaded_through) == (wal.start_offset, -1)
        await uploader.start()
        await uploader.drain()
        answer = await fetch(rs, 0)
        assert answer.uploaded_through == 2 and answer.start_offset == 3
        assert rs.sent_bytes == {"grpc": len(answer.data)}
        await uploader.close()
        await meta.close()
        rs.close()
        await wal.close()

    run(main())

"""ProducerSequences (broker/sequences.py): a sequenced batch the topic stored, or is storing, is answered
with the first copy's offsets and not appended again; failures, new sessions, the window and the rebuild
from a real WAL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from danube_fast.broker import sequences
from danube_fast.broker.ownership import Unfenced
from danube_fast.broker.sequences import Outcome, ProducerSequences
from danube_fast.broker.topic import ReliableTopic
from danube_fast.codec import frames
from danube_fast.errors import ApiError
from danube_fast.meta.resources import Policy
from danube_fast.names import TopicName
from danube_fast.storage import SyncPolicy, Wal, WalConfig

Run = Callable[..., Any]


class Appender:
    """Stands for the topic's publish: counts calls, answers consecutive offsets, can be held, fail before
    storing (the WAL away) or after (the fence cannot confirm the ownership)."""

    def __init__(self) -> None:
        self.calls = 0
        self.next = 0
        self.gate: asyncio.Event | None = None
        self.fail = False
        self.fail_after_store = False

    def __call__(self, records: int = 10) -> Callable[[Callable[[int, int], None]], Any]:
        async def append(stored: Callable[[int, int], None]) -> Outcome:
            self.calls += 1
            if self.gate is not None:
                await self.gate.wait()
            if self.fail:
                raise ApiError("UNAVAILABLE", "the WAL is away")
            first = self.next
            self.next += records
            stored(first, self.next - 1)
            if self.fail_after_store:
                raise ApiError("UNAVAILABLE", "the ownership could not be confirmed")
            return first, self.next - 1, records

        return append


class Fence:
    """Stands for the topic's fence: confirm() passes unless `lost`."""

    def __init__(self) -> None:
        self.lost = False
        self.confirms = 0

    async def confirm(self, stored: Outcome) -> None:
        self.confirms += 1
        if self.lost:
            raise ApiError("UNAVAILABLE", "the topic moved")


async def ok(stored: Outcome) -> None:
    """A fence that always confirms."""


def test_a_retry_gets_the_first_copys_offsets_and_is_not_appended(run: Run) -> None:
    async def main() -> None:
        table, append = ProducerSequences(), Appender()
        first = await table.publish("p", 7, 1, append(), ok)
        second = await table.publish("p", 7, 2, append(), ok)
        assert (first, second) == ((0, 9, 10), (10, 19, 10))
        assert await table.publish("p", 7, 1, append(), ok) == first  # stored: answered from memory
        assert await table.publish("p", 7, 2, append(), ok) == second
        assert append.calls == 2 and table.duplicates == 2
        # Another producer name, or a new session of the same name, has sequences of its own.
        assert await table.publish("q", 7, 1, append(), ok) == (20, 29, 10)
        assert await table.publish("p", 8, 1, append(), ok) == (30, 39, 10)
        assert await table.publish("p", 7, 1, append(), ok) == (40, 49, 10)  # session 7 was replaced by 8
        assert append.calls == 5

    run(main())


def test_a_retry_while_the_first_copy_is_appended_waits_for_it(run: Run) -> None:
    async def main() -> None:
        table, append = ProducerSequences(), Appender()
        append.gate = asyncio.Event()
        first = table.publish("p", 7, 1, append(), ok)
        retry = table.publish("p", 7, 1, append(), ok)
        await asyncio.sleep(0.01)
        assert not retry.done() and append.calls == 1
        retry.cancel()  # the retry's stream went: the first copy goes on
        append.gate.set()
        assert await first == (0, 9, 10)
        assert await table.publish("p", 7, 1, append(), ok) == (0, 9, 10)

    run(main())


def test_a_failed_append_is_forgotten_so_its_retry_is_stored(run: Run) -> None:
    async def main() -> None:
        table, append = ProducerSequences(), Appender()
        append.fail = True
        with pytest.raises(ApiError):
            await table.publish("p", 7, 1, append(), ok)
        append.fail = False
        assert await table.publish("p", 7, 1, append(), ok) == (0, 9, 10)
        assert append.calls == 2 and table.duplicates == 0

    run(main())


def test_a_batch_refused_before_storing_holds_back_the_later_ones_until_it_comes_again(run: Run) -> None:
    """A copy back in sync between two batches of one stream must not let the second be stored before the
    first: batches after a refused one are refused too, until the client resends from it."""
    async def main() -> None:
        table, append = ProducerSequences(), Appender()
        assert await table.publish("p", 7, 1, append(), ok) == (0, 9, 10)
        append.fail = True
        second = table.publish("p", 7, 2, append(), ok)  # refused before anything is stored
        await asyncio.sleep(0)
        append.fail = False  # the cause went away at once: the next would be stored, out of order
        third = table.publish("p", 7, 3, append(), ok)
        fourth = table.publish("p", 7, 4, append(), ok)
        for refused in (second, third, fourth):
            with pytest.raises(ApiError) as info:
                await refused
            assert info.value.grpc_code == "UNAVAILABLE" and info.value.retriable
        assert append.calls == 2, "only 2 reached the log, and stored nothing"
        # The client resends from 2, in order: stored in order.
        got = [await table.publish("p", 7, n, append(), ok) for n in (2, 3, 4)]
        assert got == [(10, 19, 10), (20, 29, 10), (30, 39, 10)]
        # Another producer, or a new session, is not held back by this one's refusal.
        append.fail = True
        with pytest.raises(ApiError):
            await table.publish("p", 7, 5, append(), ok)
        append.fail = False
        assert await table.publish("q", 1, 1, append(), ok) == (40, 49, 10)
        assert await table.publish("p", 8, 1, append(), ok) == (50, 59, 10)

    run(main())


def test_a_refusal_after_storing_holds_nothing_back(run: Run) -> None:
    async def main() -> None:
        table, append = ProducerSequences(), Appender()
        append.fail_after_store = True  # stored, then the ack failed: the retry finds it
        with pytest.raises(ApiError):
            await table.publish("p", 7, 1, append(), ok)
        append.fail_after_store = False
        assert await table.publish("p", 7, 2, append(), ok) == (10, 19, 10)

    run(main())


def test_out_of_order_sequences_within_the_window_and_too_old_ones(run: Run) -> None:
    async def main() -> None:
        table, append = ProducerSequences(), Appender()
        await table.publish("p", 7, 5, append(1), ok)
        await table.publish("p", 7, 3, append(1), ok)  # shipped after 5: new, not a retry
        assert append.calls == 2
        await table.publish("p", 7, 4 + sequences.WINDOW, append(1), ok)
        assert await table.publish("p", 7, 5, append(1), ok) == (0, 0, 1)  # within the window: a retry
        assert await table.publish("p", 7, 3, append(1), ok) == (1, 1, 1)
        await table.publish("p", 7, 5 + sequences.WINDOW, append(1), ok)  # 5 leaves the window
        for old in (5, 2):  # remembered no more, or never seen: below the window, cannot tell, refused
            with pytest.raises(ApiError, match="too old") as info:
                await table.publish("p", 7, old, append(1), ok)
            assert info.value.grpc_code == "FAILED_PRECONDITION"
        assert append.calls == 4

    run(main())


def test_the_table_is_rebuilt_from_the_wal(tmp_path: Path, run: Run) -> None:
    """What a restarted broker knows: the sequenced batches of the WAL's last two segments, with their
    offsets; unsequenced batches and older segments are passed over."""

    async def main() -> None:
        config = WalConfig(sync=SyncPolicy.parse("none"), segment_bytes=4096, cache_bytes=1)
        wal = await Wal.open(tmp_path, config)
        offsets = {}
        for seq in range(1, 41):
            data = frames.encode_payloads([b"x" * 300] * 2, producer_name="p", session=9, sequence=seq)
            offsets[seq] = await wal.append(data)
            await wal.append(frames.encode_payloads([b"plain"], producer_name="other"))
        await wal.close()
        wal = await Wal.open(tmp_path, config)
        assert len(wal.segment_bases) > 4
        table, append = ProducerSequences(), Appender()
        await table.ready(wal)
        await table.ready(wal)  # once only
        assert table.snapshot()[sequences.COMPLETE] == 1  # type: ignore[index]  # a move carries it complete
        last = wal.committed_offset
        assert await table.publish("p", 9, 40, append(), ok) == (*offsets[40], 2)
        assert await table.publish("p", 9, 39, append(), ok) == (*offsets[39], 2)
        assert append.calls == 0
        older = next(s for s in range(1, 41) if offsets[s][1] < wal.segment_bases[-2])
        await table.publish("p", 9, older, append(), ok)  # in an older segment: not known any more
        assert append.calls == 1 and last == wal.committed_offset
        await wal.close()

    run(main())


def test_a_table_a_move_carried_reads_nothing_before_the_first_producer(tmp_path: Path, run: Run) -> None:
    """A sealed move's table marked complete: `ready` answers at once instead of reading the WAL's last two
    segments (and the tier's tail), which cost every move a few hundred ms once the WAL was full, and the
    mark goes on with it. A table carried without the mark (its owner never rebuilt), or none, rebuilds,
    and a rebuild that failed marks nothing."""

    class Unread:
        segment_bases = [0]
        start_offset = 0
        committed_offset = 10

        async def read(self, offset: int, max_bytes: int) -> None:
            raise AssertionError("a carried table read the WAL")

    async def main() -> None:
        carried = ProducerSequences()
        carried.restore({"p": [7, [[1, 0, 9, 10]]], sequences.COMPLETE: 1})
        await carried.ready(Unread())  # type: ignore[arg-type]
        assert await carried.publish("p", 7, 1, Appender()(), ok) == (0, 9, 10)
        assert carried.snapshot()[sequences.COMPLETE] == 1  # type: ignore[index]  # and carries it on
        unmarked = ProducerSequences()
        unmarked.restore({"p": [7, [[1, 0, 9, 10]]]})  # its owner never rebuilt: not complete
        for table in (unmarked, ProducerSequences()):
            with pytest.raises(AssertionError, match="read the WAL"):
                await table.ready(Unread())  # type: ignore[arg-type]
            assert sequences.COMPLETE not in table.snapshot()  # type: ignore[operator]

    run(main())


def test_a_snapshot_carries_the_last_outcomes_of_the_last_producers_and_restores(run: Run) -> None:
    """What a move puts in the sealed state: stored outcomes only, the last CARRY per producer, the
    MAX_CARRIED producers used last; restore takes it back and leaves out whatever is malformed."""

    async def main() -> None:
        table, append = ProducerSequences(), Appender()
        for seq in range(1, sequences.CARRY + 11):
            await table.publish("p", 7, seq, append(1), ok)
        for i in range(sequences.MAX_CARRIED + 5):
            await table.publish(f"q{i}", 9, 1, append(1), ok)
        await table.publish("p", 7, 1000, append(1), ok)  # p used last: carried
        append.gate = asyncio.Event()
        pending = table.publish("p", 7, 1001, append(1), ok)  # being appended: not carried
        snap = table.snapshot()
        assert isinstance(snap, dict) and len(snap) == sequences.MAX_CARRIED
        assert "q0" not in snap and "p" in snap
        session, entries = snap["p"]  # type: ignore[misc]
        assert session == 7 and len(entries) == sequences.CARRY and entries[-1][0] == 1000
        append.gate.set()
        await pending
        moved = ProducerSequences()
        moved.restore(json.loads(json.dumps(snap)))  # through JSON, as the metadata store keeps it
        calls = append.calls
        assert await moved.publish("p", 7, 1000, append(1), ok) == tuple(entries[-1][1:])
        assert await moved.publish("q9", 9, 1, append(1), ok) == tuple(snap["q9"][1][0][1:])  # type: ignore[index]
        assert append.calls == calls
        broken = ProducerSequences()
        broken.restore({"a": [0, [[1, 0, 0, 1]]], "b": "x", "c": [5, [[1, -1, 0, 1], [2, 0, 0, True], "z",
                                                                  [3, 10, 19, 10]]], "d": [5, 7]})
        assert await broken.publish("c", 5, 3, append(), ok) == (10, 19, 10)  # the one good entry
        assert append.calls == calls
        await broken.publish("c", 5, 1, append(), ok)  # the malformed ones were left out: stored anew
        await broken.publish("c", 5, 2, append(), ok)
        await broken.publish("a", 1, 1, append(), ok)  # session 0 left out
        assert append.calls == calls + 3
        broken.restore(None)
        broken.restore([1, 2])

    run(main())


def test_a_batch_stored_whose_ack_failed_is_a_first_copy_all_the_same(run: Run) -> None:
    """The chaos campaign's case: the batch reached the WAL, then the fence could not confirm the ownership in
    time and the ack failed; the retry (on the same broker, the ownership confirmed again) must get the stored
    offsets, not be stored a second time. A retry that comes while the ownership is lost is refused."""

    async def main() -> None:
        table, append, fence = ProducerSequences(), Appender(), Fence()
        append.fail_after_store = True
        with pytest.raises(ApiError, match="could not be confirmed"):
            await table.publish("p", 7, 1, append(), fence.confirm)
        append.fail_after_store = False
        fence.lost = True
        with pytest.raises(ApiError, match="moved"):
            await table.publish("p", 7, 1, append(), fence.confirm)
        fence.lost = False
        assert await table.publish("p", 7, 1, append(), fence.confirm) == (0, 9, 10)
        assert append.calls == 1
        # A retry while the first copy is still being appended, which then fails after storing: the retry
        # waits for it and answers with the stored offsets.
        append.gate, append.fail_after_store = asyncio.Event(), True
        first = table.publish("p", 7, 2, append(), fence.confirm)
        retry = table.publish("p", 7, 2, append(), fence.confirm)
        append.gate.set()
        with pytest.raises(ApiError):
            await first
        assert await retry == (10, 19, 10)
        assert append.calls == 2

    run(main())


def test_a_retry_of_a_stored_batch_is_acknowledged_only_once_its_records_are_on_enough_copies(
        run: Run, tmp_path: Path) -> None:
    """The 5-minute chaos campaign's case: a replicated topic stored a batch, its follower fell out of sync
    and the first copy's acknowledgement failed (too few copies); the producer's retry must not be answered
    with the stored offsets on the fence's word alone: those records were on one disk, and the follower
    that took the topic over gave their offsets to others. The topic's confirm waits for the copies."""

    class Copies:
        def __init__(self) -> None:
            self.holds = 0  # offsets below this are on every copy

        async def admit(self) -> None:
            pass

        async def replicated(self, last: int) -> None:
            if last >= self.holds:
                raise ApiError("UNAVAILABLE", f"offset {last} is not on enough copies")

    async def main() -> None:
        wal = await Wal.open(str(tmp_path))
        topic = ReliableTopic(TopicName("default", "t"), Policy(), Unfenced(None), wal)
        copies = Copies()
        topic.replicate(copies)  # type: ignore[arg-type]
        await topic.ready_for_batches()
        data = frames.encode_payloads([b"r%d" % i for i in range(3)])

        def append(stored: Callable[[int, int], None]) -> Any:
            return topic.publish_batch(data, 3, stored)

        with pytest.raises(ApiError, match="not on enough copies"):
            await topic.publish_once("p", (7, 1), append)
        with pytest.raises(ApiError, match="not on enough copies"):  # the retry: stored, not on the copies
            await topic.publish_once("p", (7, 1), append)
        copies.holds = 3  # the follower caught up
        assert await topic.publish_once("p", (7, 1), append) == (0, 2, 3)
        assert wal.committed_offset == 3  # stored once
        await wal.close()

    run(main())

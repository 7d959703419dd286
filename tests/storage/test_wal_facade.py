"""The asyncio WAL facade: group commit, durability before acknowledgement, readers, retention, close."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from danube_fast.codec import frames
from danube_fast.errors import FrameCorrupt, OffsetOutOfRange, WalClosed
from danube_fast.storage import SyncPolicy, Wal, WalConfig, wal_engine
from danube_fast.storage.segmented_log import SegmentedLog

Run = Callable[..., Any]


def batch(first_seq: int, count: int = 3, size: int = 40) -> bytes:
    """A batch whose payloads carry their sequence numbers, so reads can be checked record by record."""
    return frames.encode_payloads(
        [seq.to_bytes(8, "little") * (size // 8) for seq in range(first_seq, first_seq + count)],
        publish_time=1_700_000_000_000 + first_seq,
    )


def seq_of(payload: bytes) -> int:
    return int.from_bytes(payload[:8], "little")


class CountingLog(SegmentedLog):  # type: ignore[misc]
    """The real engine, recording the next offset each fdatasync covered."""

    synced_up_to: list[int]

    def sync(self) -> int:
        covered: int = super().sync()
        self.synced_up_to.append(covered)
        return covered


async def open_counting(path: Path, config: WalConfig) -> tuple[Wal, CountingLog]:
    engine = CountingLog(str(path), segment_bytes=config.segment_bytes)
    engine.synced_up_to = []
    return Wal(engine, config, asyncio.get_running_loop()), engine


async def read_all(wal: Wal, start: int = 0) -> list[frames.Record]:
    out: list[frames.Record] = []
    async for buf in wal.reader(start, follow=False):
        out.extend(r for r in frames.decode_records(buf) if r.offset >= start)
    return out


def test_concurrent_appends_get_contiguous_ranges_in_call_order(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal = await Wal.open(tmp_path)
        ranges = await asyncio.gather(*[wal.append(batch(3 * i)) for i in range(200)])
        assert ranges == [(3 * i, 3 * i + 2) for i in range(200)]
        assert wal.committed_offset == 600
        records = await read_all(wal)
        assert [r.offset for r in records] == list(range(600))
        assert [seq_of(r.payload) for r in records] == list(range(600))
        await wal.close()

    run(main())


def test_always_acknowledges_only_what_an_fsync_covered(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal, engine = await open_counting(tmp_path, WalConfig())

        async def producer(k: int) -> None:
            for i in range(40):
                _, last = await wal.append(batch(1000 * k + i, count=2))
                assert engine.synced_up_to and last < engine.synced_up_to[-1]

        await asyncio.gather(*[producer(k) for k in range(8)])
        # 320 appends from 8 concurrent producers share fsyncs (group commit).
        assert len(engine.synced_up_to) < 320
        await wal.close()

    run(main())


def test_sync_none_acknowledges_without_fsync_and_syncs_at_close(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal, engine = await open_counting(tmp_path, WalConfig(sync=SyncPolicy.parse("none")))
        for i in range(20):
            await wal.append(batch(i * 3))
        assert engine.synced_up_to == []
        assert wal.committed_offset == 60  # written data is readable at once under `none`
        await wal.close()
        assert engine.synced_up_to == [60]

    run(main())


def test_sync_interval_syncs_within_the_interval(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal, engine = await open_counting(tmp_path, WalConfig(sync=SyncPolicy.parse("interval(20)")))
        t0 = time.monotonic()
        await wal.append(batch(0))
        deadline = t0 + 5
        while not engine.synced_up_to and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert engine.synced_up_to == [3]
        await wal.close()

    run(main())


@pytest.mark.parametrize("text", ["sometimes", "interval(0)", "interval(x)", ""])
def test_bad_sync_policy_is_a_clear_error(text: str) -> None:
    with pytest.raises(ValueError, match="sync must be"):
        SyncPolicy.parse(text)


def test_bad_buffer_is_rejected_alone(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal = await Wal.open(tmp_path)
        corrupt = bytearray(batch(100))
        corrupt[-1] ^= 0xFF
        results = await asyncio.gather(
            wal.append(batch(0)), wal.append(bytes(corrupt)), wal.append(b"junk"), wal.append(batch(3)),
            return_exceptions=True,
        )
        assert results[0] == (0, 2)
        assert isinstance(results[1], FrameCorrupt) and "CRC mismatch" in str(results[1])
        assert isinstance(results[2], FrameCorrupt)
        assert results[3] == (3, 5)
        assert [seq_of(r.payload) for r in await read_all(wal)] == list(range(6))
        await wal.close()

    run(main())


def test_tail_reader_wakes_on_new_commits(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal = await Wal.open(tmp_path)
        got: list[int] = []

        async def consume() -> None:
            async for buf in wal.reader(0):
                got.extend(r.offset for r in frames.decode_records(buf))
                if len(got) >= 150:
                    return

        task = asyncio.create_task(consume())
        await asyncio.sleep(0)  # the reader is now waiting at the tail, with nothing committed
        for i in range(50):
            await wal.append(batch(3 * i))
        await asyncio.wait_for(task, 10)
        assert got == list(range(150))
        await wal.close()

    run(main())


def test_reads_from_disk_when_the_cache_is_small(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        config = WalConfig(cache_bytes=1, segment_bytes=4096)
        wal = await Wal.open(tmp_path, config)
        for i in range(100):
            await wal.append(batch(3 * i, size=64))
        for start in (0, 1, 2, 3, 149, 298, 299):
            records = await read_all(wal, start)
            assert [r.offset for r in records] == list(range(start, 300))
            assert [seq_of(r.payload) for r in records] == list(range(start, 300))
        assert await wal.read(300) is None
        await wal.close()

    run(main())


def test_reopen_recovers_everything_and_continues(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal = await Wal.open(tmp_path, WalConfig(segment_bytes=2048))
        for i in range(40):
            await wal.append(batch(3 * i))
        await wal.close()
        wal = await Wal.open(tmp_path, WalConfig(segment_bytes=2048))
        assert wal.committed_offset == 120
        assert wal.recovery.truncated_bytes == 0
        assert await wal.append(batch(120)) == (120, 122)
        assert [seq_of(r.payload) for r in await read_all(wal)] == list(range(123))
        await wal.close()

    run(main())


def test_retention_deletes_whole_segments_and_reads_below_fail(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal = await Wal.open(tmp_path, WalConfig(segment_bytes=1024, cache_bytes=1))
        for i in range(60):
            await wal.append(batch(3 * i))
        deleted = await wal.delete_before(100)
        assert deleted > 0
        start = wal.start_offset
        assert 0 < start <= 100
        with pytest.raises(OffsetOutOfRange):
            await wal.read(start - 1)
        records = await read_all(wal, start)
        assert [r.offset for r in records] == list(range(start, 180))
        await wal.close()

    run(main())


def test_close_fails_new_appends_and_wakes_readers(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal = await Wal.open(tmp_path)
        await wal.append(batch(0))

        async def tail() -> None:
            async for _ in wal.reader(3):
                pass

        reader = asyncio.create_task(tail())
        await asyncio.sleep(0)
        await wal.close()
        with pytest.raises(WalClosed):
            await reader
        with pytest.raises(WalClosed):
            await wal.append(batch(3))

    run(main())


def test_records_keep_every_field(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal = await Wal.open(tmp_path)
        sent = [
            frames.Record(b"a", publish_time=5, request_id=9, routing_key="k", attributes={"x": "y"},
                          schema_id=2**64 - 1, schema_version=7),
            frames.Record(b"", publish_time=6),
        ]
        first, last = await wal.append(frames.encode_batch(sent, producer_id=4, producer_name="p",
                                                          broker_addr="127.0.0.1:6650"))
        assert (first, last) == (0, 1)
        got = await read_all(wal)
        for i, r in enumerate(sent):
            r.offset = i
        assert got == sent
        await wal.close()

    run(main())


def test_a_lone_sequential_producer_never_waits_for_the_linger(tmp_path: Path, run: Run) -> None:
    """linger_us applies only while other appends await their ack: one producer awaiting each append in
    turn must not pay it (a 200 ms linger would make these 10 appends take 2 s)."""

    async def main() -> None:
        wal = await Wal.open(tmp_path, WalConfig(linger_us=200_000))
        start = time.monotonic()
        for i in range(10):
            await wal.append(batch(3 * i))
        assert time.monotonic() - start < 1.0
        await wal.close()

    run(main())


class GatedSyncLog(CountingLog):
    """The real engine with a disk whose every fdatasync waits until the test lets it finish, so the test,
    not the scheduler, decides what arrives during a flush."""

    gate: threading.Semaphore
    started: list[int]  # the offset written up to when each fdatasync began

    def sync(self) -> int:
        self.started.append(self.next_offset)
        assert self.gate.acquire(timeout=10), "the test never let an fdatasync finish"
        return super().sync()


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the writer thread never got there"
        await asyncio.sleep(0.001)


def hold_the_loop_until(condition: Callable[[], bool]) -> None:
    """Block the event loop (so no acknowledgement is processed) until the writer thread gets somewhere."""
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the writer thread never got there"
        time.sleep(0.001)


@pytest.mark.parametrize(("linger_us", "groups"), [(500_000, [1, 5]), (0, [1, 4, 5])])
def test_the_linger_lets_a_late_append_join_the_group(tmp_path: Path, run: Run, linger_us: int,
                                                      groups: list[int]) -> None:
    """A is written and fsynced alone (nothing else in flight). B, C, D arrive during that fsync; E arrives
    after A is acknowledged. With a linger the writer, seeing A still unanswered when its fsync ends, waits
    and E joins B-D in one write and one fsync; without, E waits for an fsync of its own. Acknowledgements
    stay exact either way."""

    async def main() -> None:
        config = WalConfig(linger_us=linger_us)
        engine = GatedSyncLog(str(tmp_path), segment_bytes=config.segment_bytes)
        engine.synced_up_to, engine.started, engine.gate = [], [], threading.Semaphore(0)
        wal = Wal(engine, config, asyncio.get_running_loop())
        a = wal.submit(batch(0, count=1))
        await until(lambda: engine.started == [1])
        rest = [wal.submit(batch(i, count=1)) for i in (1, 2, 3)]
        await asyncio.sleep(0)  # the hand-off to the writer
        engine.gate.release()  # A's fsync ends
        if linger_us:
            hold_the_loop_until(lambda: wal._lingering)
        else:
            hold_the_loop_until(lambda: engine.started == [1, 4])
        await a
        rest.append(wal.submit(batch(4, count=1)))
        engine.gate.release(2)
        assert [await f for f in rest] == [(1, 1), (2, 2), (3, 3), (4, 4)]
        assert engine.synced_up_to == groups
        await wal.close()

    run(main())


class GatedSegment(wal_engine.segments.Segment):  # type: ignore[misc]
    """The real segment on a disk whose reads wait until the test lets them finish."""

    gate = threading.Event()
    reading = threading.Event()

    def read(self, *args: Any) -> Any:
        self.reading.set()
        assert self.gate.wait(10), "the test never let the read finish"
        return super().read(*args)


def test_close_waits_for_a_disk_read_in_progress(tmp_path: Path, run: Run) -> None:
    """A read from disk running while the log closes gets its records, not an error of a closed file (it
    got a raw EBADF before); a read that starts after the close gets WalClosed."""

    async def main() -> None:
        config = WalConfig(cache_bytes=1)
        GatedSegment.gate, GatedSegment.reading = threading.Event(), threading.Event()
        gated = SimpleNamespace(Segment=GatedSegment, check_buffers=wal_engine.segments.check_buffers,
                                MAX_SEGMENT=wal_engine.segments.MAX_SEGMENT)
        engine = SegmentedLog(str(tmp_path), segment_bytes=config.segment_bytes,
                              segments=gated)  # type: ignore[arg-type]
        wal = Wal(engine, config, asyncio.get_running_loop())
        for i in range(3):
            await wal.append(batch(3 * i))
        read = asyncio.ensure_future(wal.read(0))
        await asyncio.to_thread(GatedSegment.reading.wait, 10)
        closing = asyncio.ensure_future(wal.close())
        await asyncio.sleep(0.2)
        assert not closing.done()  # the engine stays open under the read
        GatedSegment.gate.set()
        got = await read
        assert got is not None and [r.offset for r in frames.decode_records(got[0])][:3] == [0, 1, 2]
        await closing
        with pytest.raises(WalClosed):
            await wal.read(0)

    run(main())


def compressed_with_bad_records() -> bytes:
    """A zstd batch whose CRC and decompression pass but whose first record overruns it (a buggy producer)."""
    import struct

    import pyarrow as pa

    plain = bytearray(frames.encode_payloads([b"a" * 100] * 10))
    head = frames.HEADER_SIZE
    struct.pack_into("<I", plain, head, 10_000)
    packed = pa.Codec("zstd").compress(bytes(plain[head:]), asbytes=True)
    out = bytearray(plain[:head]) + packed
    struct.pack_into("<H", out, 18, 1)  # flags: codec zstd
    struct.pack_into("<I", out, 52, len(plain) - head)  # raw_size
    struct.pack_into("<I", out, 12, len(out))
    struct.pack_into("<I", out, 8, frames.crc32c(bytes(out[12:])))
    return bytes(out)


def test_compressed_batches_are_stored_as_they_came_and_recovered(tmp_path: Path, run: Run) -> None:
    """docs/FORMAT.md#compression: the WAL checks a compressed batch by decompressing it, stores and serves
    the compressed bytes, and recovers them after a reopen; one whose records do not walk is refused alone."""
    payloads = [f'{{"order": {i}, "status": "shipped", "currency": "EUR"}}'.encode() * 4 for i in range(100)]
    zstd = frames.encode_payloads(payloads, compression="zstd")
    lz4 = frames.encode_payloads(payloads, compression="lz4")
    assert len(zstd) < len(frames.encode_payloads(payloads)) // 2

    async def stored(wal: Wal) -> bytes:
        return b"".join([bytes(chunk) async for chunk in wal.reader(0, follow=False)])

    async def main() -> None:
        wal = await Wal.open(tmp_path)
        results = await asyncio.gather(wal.append(zstd), wal.append(compressed_with_bad_records()),
                                       wal.append(lz4), return_exceptions=True)
        assert results[0] == (0, 99) and results[2] == (100, 199)
        assert isinstance(results[1], FrameCorrupt) and "record 0" in str(results[1])
        data = await stored(wal)
        assert len(data) == len(zstd) + len(lz4)
        assert [h.compression for h in frames.scan_batches(data)] == ["zstd", "lz4"]
        assert [r.payload for r in frames.decode_records(data)] == payloads * 2
        await wal.close()
        wal = await Wal.open(tmp_path)
        assert wal.committed_offset == 200
        assert await stored(wal) == data
        assert await wal.append(zstd) == (200, 299)
        await wal.close()

    run(main())


def test_an_idle_log_gives_back_its_cache_and_files_and_the_next_use_reopens_them(
        tmp_path: Path, run: Run) -> None:
    """release_if_idle ([wal] idle_release_ms): not while used recently or while an append waits; then the
    cache is empty and the engine's files closed; a read (from disk now) and an append reopen them."""

    async def main() -> None:
        wal = await Wal.open(tmp_path, WalConfig(sync=SyncPolicy.parse("none")))
        for i in range(10):
            await wal.append(batch(3 * i))
        assert not await wal.release_if_idle(0.2)  # just used
        pending = wal.submit(batch(30))
        assert not await wal.release_if_idle(0.0)  # an append waits for its ack
        await pending
        await asyncio.sleep(0.25)
        assert await wal.release_if_idle(0.2)
        assert wal.released and not await wal.release_if_idle(0.2)
        assert wal.cached(0, 1 << 20) is None  # the cache went with it
        assert [seq_of(r.payload) for r in await read_all(wal)] == list(range(33))
        assert not wal.released
        await asyncio.sleep(0.25)
        assert await wal.release_if_idle(0.2)
        assert await wal.append(batch(33)) == (33, 35)
        assert not wal.released
        await wal.close()
        reopened = await Wal.open(tmp_path)
        assert [seq_of(r.payload) for r in await read_all(reopened)] == list(range(36))
        await reopened.close()

    run(main())


@pytest.mark.parametrize("cache_bytes", [1 << 20, 1], ids=["cached", "from-disk"])
def test_readers_are_held_below_the_visible_line(tmp_path: Path, run: Run, cache_bytes: int) -> None:
    """A replicated topic's owner holds readers at what its followers hold (docs/REPLICATION.md): reads,
    cached reads and waits stop there, inside a group too; durable reads see everything written."""
    async def main() -> None:
        wal = await Wal.open(tmp_path, WalConfig(cache_bytes=cache_bytes))
        wal.hold_visible(0)
        await asyncio.gather(*(wal.append(batch(3 * i)) for i in range(4)))  # 12 records
        assert (wal.durable_offset, wal.committed_offset) == (12, 0)
        assert await wal.read(0) is None and wal.cached(0, 1 << 20) is None
        at = 0
        while (durable := await wal.read(at, durable=True)) is not None:  # a group at a time
            at = durable[1]
        assert at == 12
        waiter = asyncio.create_task(wal.wait_committed(5))
        wal.show_through(6)  # two of the four batches, which one group may hold together
        assert wal.committed_offset == 6 and not waiter.done()
        assert [r.offset for r in await read_all(wal)] == list(range(6))
        got = await wal.read(3)
        assert got is not None and got[1] == 6
        if cache_bytes > 1:
            cached = wal.cached(0, 1 << 20)
            assert cached is not None and cached[1] == 6
            assert [r.offset for r in frames.decode_records(cached[0])] == list(range(6))
        wal.show_through(3)  # the line never goes back
        assert wal.committed_offset == 6
        wal.show_through(100)  # beyond what is durable: readers see what is durable
        assert wal.committed_offset == 12
        await asyncio.wait_for(waiter, 1)
        await wal.append(batch(12))  # the line is at 100: seen once durable
        assert wal.committed_offset == wal.durable_offset == 15
        await wal.close()

    run(main())

"""The synchronous WAL engine `SegmentedLog`, over the native module and its pure-Python twin.

Tests taking the `wal_impl` fixture run once per engine (ids `native` and `pure`) and build their batches with
the codec of the same flavour (`frames` fixture; both codecs produce the same bytes). Tests whose names end in
`_across_impls` run both engines on the same input and compare files and results. Everything runs on real
files under tmp_path with real fsyncs; a `Model` of the stamped batches says what every read must return.
"""

from __future__ import annotations

import bisect
import errno
import gc
import importlib
import itertools
import json
import mmap
import os
import random
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from danube_fast.codec.fast_wire import encode_records_response
from danube_fast.errors import FrameCorrupt, OffsetOutOfRange, WalBusy, WalClosed, WalCorrupt, WalWriteError
from danube_fast.proto import FastApi_pb2 as fast
from danube_fast.storage import file_span
from danube_fast.storage._wal_common import INDEX_RESERVE_MAX_STEP, READ_ROOM, index_reservation
from danube_fast.storage.objects.format import Footer, build_object, check_header, encode_footer, parse_footer
from danube_fast.storage.segmented_log import SegmentedLog
from danube_fast.storage.segments import FILE_HEADER

WAL_MODULES = {"native": "danube_fast.storage._wal", "pure": "danube_fast.storage._wal_py"}
CODEC_MODULES = {"native": "danube_fast.codec._frames", "pure": "danube_fast.codec._frames_py"}
REPO = Path(__file__).resolve().parents[2]
HEADER_SIZE = 56
OFF_BASE_OFFSET, OFF_LENGTH, OFF_COUNT = 0, 12, 20  # docs/FORMAT.md
SEGMENT = 4096  # small segments: a few dozen batches each


def make_log(segments: ModuleType, directory: str, **options: Any) -> SegmentedLog:
    """The log (written once) over the primitives of one engine."""
    return SegmentedLog(directory, segments=segments, **options)


def impl_name(module: ModuleType) -> str:
    return "pure" if module.__name__.endswith("_py") else "native"


@pytest.fixture(params=sorted(WAL_MODULES))
def wal_impl(request: pytest.FixtureRequest) -> ModuleType:
    """The engine under test: danube_fast.storage._wal or its twin _wal_py (ids `native`, `pure`)."""
    return importlib.import_module(WAL_MODULES[request.param])


@pytest.fixture
def frames(wal_impl: ModuleType) -> ModuleType:
    """The codec of the same flavour as the engine."""
    return importlib.import_module(CODEC_MODULES[impl_name(wal_impl)])


@pytest.fixture
def open_log(wal_impl: ModuleType, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Opens a SegmentedLog (by default in tmp_path/"wal"); whatever is still open is closed at teardown."""
    opened: list[Any] = []

    def factory(directory: Path | None = None, **options: Any) -> Any:
        log = make_log(wal_impl, str(directory or tmp_path / "wal"), **options)
        opened.append(log)
        return log

    yield factory
    for log in opened:
        log.close()


# ----------------------------------------------------------------------------------------------------------
# Building batches and knowing what the log must hold


class Batches:
    """Deterministic valid batches of 1-5 records; payloads carry a serial number, so no two are alike."""

    def __init__(self, frames: ModuleType, seed: int) -> None:
        self.frames = frames
        self.rng = random.Random(seed)
        self.serial = 0

    def batch(self, records: int | None = None, payload_max: int = 120) -> bytes:
        self.serial += 1
        count = records or self.rng.randint(1, 5)
        payloads = [f"{self.serial}.{i}:".encode() + self.rng.randbytes(self.rng.randint(0, payload_max))
                    for i in range(count)]
        data: bytes = self.frames.encode_payloads(
            payloads, publish_time=1_700_000_000_000 + self.serial, producer_id=7, producer_name="wal-test",
        )
        return data

    def buffer(self) -> bytes:
        """1 to 3 batches back to back."""
        return b"".join(self.batch() for _ in range(self.rng.randint(1, 3)))


@dataclass
class Stored:
    base: int
    count: int
    data: bytes  # as written: base offset stamped

    @property
    def end(self) -> int:
        return self.base + self.count


class Model:
    """Every batch the log should hold, in offset order."""

    def __init__(self, frames: ModuleType) -> None:
        self.frames = frames
        self.batches: list[Stored] = []
        self.bases: list[int] = []

    def add(self, data: bytes | None) -> None:
        for h in self.frames.scan_batches(data or b""):
            self.batches.append(Stored(h.base_offset, h.record_count, bytes(data[h.position:h.end])))
            self.bases.append(h.base_offset)

    def drop_before(self, offset: int) -> None:
        keep = bisect.bisect_left(self.bases, offset)
        del self.batches[:keep], self.bases[:keep]

    def truncate_at(self, offset: int) -> None:
        keep = bisect.bisect_left(self.bases, offset)
        del self.batches[keep:], self.bases[keep:]

    @property
    def start(self) -> int:
        return self.batches[0].base

    @property
    def end(self) -> int:
        return self.batches[-1].end

    def holding(self, offset: int) -> int:
        return bisect.bisect_right(self.bases, offset) - 1

    def placement(self, segment_bases: list[int]) -> list[tuple[int, int]]:
        """(segment base, byte position) of every batch."""
        out, segment, pos = [], -1, 0
        starts = set(segment_bases)
        for b in self.batches:
            if b.base in starts:
                segment, pos = b.base, len(FILE_HEADER)
            out.append((segment, pos))
            pos += len(b.data)
        return out

    def expected_read(self, bases: list[int], offset: int, max_bytes: int, limit: int) -> bytes | None:
        """What read() must return: whole batches from the one holding `offset`, within its segment, below
        `limit`, at most max(max_bytes, the first batch)."""
        if offset >= limit or offset >= self.end:
            return None
        first = self.holding(offset)
        segment = segment_of(bases, self.batches[first].base)
        budget = max(max_bytes, len(self.batches[first].data))
        out = bytearray()
        for b in self.batches[first:]:
            if segment_of(bases, b.base) != segment or b.base >= limit or len(out) + len(b.data) > budget:
                break
            out += b.data
        return bytes(out)


def segment_of(segment_bases: list[int], offset: int) -> int:
    return segment_bases[bisect.bisect_right(segment_bases, offset) - 1]


def fill(log: Any, gen: Batches, model: Model, batches: int) -> None:
    """Append one batch per call until the log holds `batches` more batches."""
    for _ in range(batches):
        model.add(log.append([gen.batch()]).data)


def assert_read(log: Any, model: Model, offset: int, max_bytes: int, limit: int) -> None:
    got = log.read(offset, max_bytes, limit)
    want = model.expected_read(log.segment_bases, offset, max_bytes, limit)
    if want is None:
        assert got is None, (offset, limit)
        return
    assert isinstance(got, bytes | memoryview)
    headers = model.frames.scan_batches(got, verify=False)
    assert headers[0].base_offset <= offset <= headers[0].last_offset
    for a, b in itertools.pairwise(headers):
        assert b.base_offset == a.last_offset + 1
    assert headers[-1].base_offset < limit
    assert bytes(got) == want, (offset, max_bytes, limit)


def assert_all_readable(log: Any, model: Model) -> None:
    assert (log.start_offset, log.next_offset) == (model.start, model.end)
    for offset in range(model.start, model.end):
        assert_read(log, model, offset, 1, model.end)
        assert_read(log, model, offset, 1 << 20, model.end)
    assert log.read(model.end, 1 << 20, model.end + 10) is None


def assert_lookups(log: Any, model: Model, exact: bool) -> None:
    """lookup() names the segment holding each offset and an indexed batch at or before the one holding it."""
    placement = model.placement(log.segment_bases)
    starts: dict[int, set[int]] = {}
    for segment, pos in placement:
        starts.setdefault(segment, set()).add(pos)
    for offset in range(model.start, model.end):
        segment, pos = placement[model.holding(offset)]
        found = log.lookup(offset)
        assert found[0] == segment
        assert found[1] in starts[segment] and found[1] <= pos
        if exact:
            assert found[1] == pos


def files(directory: Path) -> dict[str, bytes]:
    """Every file's bytes; the clean-close mark without the time it names (two engines' differ)."""
    out = {p.name: p.read_bytes() for p in sorted(directory.iterdir())}
    if "clean" in out:
        mark = json.loads(out["clean"])
        mark.pop("mtime_ns")
        out["clean"] = json.dumps(mark).encode()
    return out


def restore(directory: Path, snapshot: dict[str, bytes]) -> None:
    for p in directory.iterdir():
        p.unlink()
    for name, data in snapshot.items():
        (directory / name).write_bytes(data)


def log_path(directory: Path, base: int) -> Path:
    return directory / f"{base:020d}.log"


def idx_path(directory: Path, base: int) -> Path:
    return directory / f"{base:020d}.idx"


def flip_bit(path: Path, position: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 1 << bit
    path.write_bytes(data)


def index_entries(path: Path) -> list[tuple[int, int]]:
    data = path.read_bytes()
    return [(int.from_bytes(data[i:i + 4], "little"), int.from_bytes(data[i + 4:i + 8], "little"))
            for i in range(0, len(data), 8)]


# ----------------------------------------------------------------------------------------------------------
# Selection


def test_selector_picks_native_unless_pure_is_set(tmp_path: Path) -> None:
    from danube_fast.storage import wal_engine

    pure = os.environ.get("DANUBE_FAST_PURE", "") == "1"
    assert ("pure" if pure else "native") == wal_engine.IMPL
    assert wal_engine.segments is importlib.import_module(WAL_MODULES[wal_engine.IMPL])
    assert SegmentedLog(str(tmp_path / "wal"))._impl is wal_engine.segments


# ----------------------------------------------------------------------------------------------------------
# Appending


def test_append_assigns_contiguous_ranges_and_rejects_bad_buffers(
        wal_impl: ModuleType, frames: ModuleType, open_log: Callable[..., Any]) -> None:
    gen = Batches(frames, seed=1)
    rng = random.Random(2)
    log = open_log(initial_offset=100)
    model = Model(frames)

    def crc_flipped() -> bytes:
        data = bytearray(gen.buffer())
        data[-1] ^= 0x40  # a payload byte of the last batch: the CRC no longer matches
        return bytes(data)

    def torn_second() -> bytes:
        data = gen.batch() + gen.batch()
        return data[:len(data) - rng.randint(1, 60)]

    bad: list[Callable[[], bytes]] = [
        lambda: rng.randbytes(rng.randint(1, 300)),
        lambda: b"",
        crc_flipped,
        lambda: gen.buffer()[:-1],
        torn_second,
    ]
    wrappers: list[Callable[[bytes], Any]] = [bytes, bytearray, memoryview]
    for call in range(40):
        buffers: list[Any] = []
        valid: list[bool] = []
        for _ in range(rng.randint(1, 5)):
            ok = rng.random() < 0.6
            data = gen.buffer() if ok else rng.choice(bad)()
            buffers.append(rng.choice(wrappers)(data))
            valid.append(ok)
        first = log.next_offset
        result = log.append(buffers)
        offset = first
        expected = bytearray()
        for buf, ok, got in zip(buffers, valid, result.ranges, strict=True):
            if not ok:
                assert isinstance(got, FrameCorrupt), call
                continue
            stamped = bytearray(buf)
            start = offset
            for h in frames.scan_batches(buf):
                frames.stamp_base_offset(stamped, offset, h.position)
                offset += h.record_count
            assert got == (start, offset - 1)
            expected += stamped
        assert (result.first_offset, result.next_offset, log.next_offset) == (first, offset, offset)
        if any(valid):
            assert result.data == bytes(expected)
            bases = [h.base_offset for h in frames.scan_batches(result.data)]
            assert bases[0] == first and bases == sorted(set(bases))
        else:
            assert result.data is None
        model.add(result.data)
    assert model.start == 100
    assert log.unsynced_bytes == sum(len(b.data) for b in model.batches)
    log.sync()
    assert log.unsynced_bytes == 0
    assert_all_readable(log, model)


def test_append_of_only_rejected_buffers_writes_nothing(frames: ModuleType, open_log: Callable[..., Any],
                                                        tmp_path: Path) -> None:
    log = open_log()
    log.append([Batches(frames, 3).batch()])
    size = log_path(tmp_path / "wal", 0).stat().st_size
    result = log.append([b"", b"\xdb" * 80])
    assert [type(r) for r in result.ranges] == [FrameCorrupt, FrameCorrupt]
    assert (result.data, result.first_offset, result.next_offset) == (None, log.next_offset, log.next_offset)
    assert log.append([]).ranges == []
    assert log_path(tmp_path / "wal", 0).stat().st_size == size
    with pytest.raises(TypeError):
        log.append(["not a buffer"])
    assert log_path(tmp_path / "wal", 0).stat().st_size == size


def test_reopen_after_close_keeps_offsets_bytes_and_index(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    d = tmp_path / "wal"
    gen, model = Batches(frames, 4), Model(frames)
    log = open_log(segment_bytes=SEGMENT, index_interval_bytes=300)
    fill(log, gen, model, 60)
    bases = log.segment_bases
    log.close()
    before = files(d)
    assert "clean" in before  # the clean close's mark: the next open need not scan the last segment
    (d / f"{bases[-1] + 10**6:020d}.idx").write_bytes(b"\0" * 16)  # an index whose log is gone
    log = open_log(segment_bytes=SEGMENT, index_interval_bytes=300)
    report = log.recovery
    assert (report.segments, report.next_offset, report.truncated_segment, report.truncated_bytes) == (
        len(bases), model.end, None, 0)
    assert (report.cut_reason, report.rebuilt_indexes, report.scanned_bytes) == (None, [], 0)
    assert (log.next_offset, log.segment_bases) == (model.end, bases)
    del before["clean"]  # taken by the open
    assert files(d) == before  # the orphan index is gone, the active index as the close left it
    assert_all_readable(log, model)
    assert_lookups(log, model, exact=False)
    model.add(log.append([gen.batch()]).data)
    assert_all_readable(log, model)


def test_a_clean_close_spares_the_next_open_the_scan_and_nothing_else_changes(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    """The mark of a clean close (storage/segments.py): the next open trusts the last segment instead of
    scanning it, and the log is the same as a scanned one: reads, lookups, appends, the footer its roll
    writes. A segment written since the close, or no close at all (a crash), is scanned."""
    d, options = tmp_path / "wal", {"segment_bytes": 1 << 20, "index_interval_bytes": 300}
    gen, model = Batches(frames, 7), Model(frames)
    log = open_log(**options)
    fill(log, gen, model, 40)
    log.close()
    mark = json.loads((d / "clean").read_text())
    snapshot = {name: (d / name).read_bytes() for name in os.listdir(d) if name != "clean"}
    footers = {}
    for trusted in (True, False):
        restore(d, snapshot)
        if trusted:  # the mark as the close wrote it (restoring rewrote the files: its time is theirs now)
            mark["mtime_ns"] = log_path(d, 0).stat().st_mtime_ns
            (d / "clean").write_text(json.dumps(mark))
        log = open_log(**options)
        assert log.recovery.scanned_bytes == (0 if trusted else log_path(d, 0).stat().st_size)
        assert not (d / "clean").exists()  # taken: a crash from here on is scanned
        assert_all_readable(log, model)
        assert_lookups(log, model, exact=False)
        more = Model(frames)
        more.batches, more.bases = list(model.batches), list(model.bases)
        more.add(log.append([Batches(frames, 8).batch()]).data)
        assert_all_readable(log, more)
        log.roll()
        footers[trusted] = log.sealed_object(0)[1]  # type: ignore[index]
        log.close()
    assert footers[True] == footers[False]
    # Written after the close (same size): scanned, and the damage found.
    restore(d, snapshot)
    mark["mtime_ns"] = log_path(d, 0).stat().st_mtime_ns
    (d / "clean").write_text(json.dumps(mark))
    data = bytearray(log_path(d, 0).read_bytes())
    data[-5] ^= 0xFF
    time.sleep(0.01)
    log_path(d, 0).write_bytes(data)
    log = open_log(**options)
    assert log.recovery.scanned_bytes > 0 and log.recovery.truncated_bytes > 0
    log.close()


def test_a_directory_is_opened_once_at_a_time(
        frames: ModuleType, wal_impl: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    """A second open of a directory this process has open is refused before it recovers anything (two
    recoveries of one directory cut and remap each other's files: a broker died of SIGBUS that way); once
    the first is closed, or dropped and collected, the directory opens again."""
    gen, model = Batches(frames, 7), Model(frames)
    log = open_log()
    fill(log, gen, model, 6)
    with pytest.raises(WalBusy, match="open already"):
        open_log()
    fill(log, gen, model, 2)
    assert_all_readable(log, model)
    log.close()
    dropped = make_log(wal_impl, str(tmp_path / "wal"))
    assert dropped.next_offset == model.end
    del dropped
    gc.collect()
    again = open_log()
    assert_all_readable(again, model)


def test_initial_offset_applies_only_to_an_empty_directory(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    log = open_log(initial_offset=1_000)
    assert (log.start_offset, log.next_offset, log.segment_bases) == (1_000, 1_000, [1_000])
    assert log.read(1_000, 100, 1_000) is None
    with pytest.raises(OffsetOutOfRange):
        log.read(999, 100, 1_001)
    assert log.recovery.next_offset == 1_000
    assert sorted(files(tmp_path / "wal")) == ["00000000000000001000.idx", "00000000000000001000.log"]
    result = log.append([Batches(frames, 5).batch(records=3)])
    assert result.ranges == [(1_000, 1_002)]
    log.close()
    log = open_log(initial_offset=5)
    assert (log.start_offset, log.next_offset) == (1_000, 1_003)


# ----------------------------------------------------------------------------------------------------------
# Reading and lookup


def test_read_from_every_offset_across_segments(frames: ModuleType, open_log: Callable[..., Any]) -> None:
    gen, model = Batches(frames, 6), Model(frames)
    log = open_log(segment_bytes=SEGMENT, index_interval_bytes=700)
    fill(log, gen, model, 70)
    assert len(log.segment_bases) >= 4
    middle = model.batches[len(model.batches) // 2].base
    for limit in (model.end, middle, model.end + 7):
        for offset in range(model.start, model.end + 2):
            for max_bytes in (0, 1, 450, 2_000, 1 << 20):
                assert_read(log, model, offset, max_bytes, limit)
    # A limit inside a batch: that batch starts below it, so it is returned whole; nothing after it.
    holder = model.batches[model.holding(middle + 1)]
    got = log.read(holder.base, 1 << 20, holder.base + 1)
    assert bytes(got or b"") == holder.data
    assert log.read(model.end, 100, model.end) is None
    assert log.read(5, 100, 3) is None


def test_a_native_read_leaves_room_in_front_for_a_response_framing(
        wal_impl: ModuleType, frames: ModuleType, open_log: Callable[..., Any]) -> None:
    """A buffered read of the native engine: its batches after READ_ROOM zero bytes of the same bytes object,
    cut to them (fast_wire frames a Records response there instead of copying the read)."""
    if impl_name(wal_impl) != "native":
        pytest.skip("the pure engine's reads are os.pread's bytes: the response framing copies them")
    gen, model = Batches(frames, 16), Model(frames)
    log = open_log(segment_bytes=SEGMENT, index_interval_bytes=700)
    fill(log, gen, model, 40)
    for offset in range(model.start, model.end, 3):
        for max_bytes in (1, 450, 1 << 20):
            got = log.read(offset, max_bytes, model.end)
            assert bytes(got) == model.expected_read(log.segment_bases, offset, max_bytes, model.end)
            assert_framed_in_place(frames, got)


def assert_framed_in_place(frames: ModuleType, got: Any) -> None:
    """`got` (a native read) sits after READ_ROOM zero bytes of a bytes object cut to it, and a Records
    response framed there is that object, read back by protobuf as the batches and their offsets."""
    assert isinstance(got, memoryview) and type(got.obj) is bytes
    assert len(got.obj) == READ_ROOM + len(got) and got.obj[:READ_ROOM] == bytes(READ_ROOM)
    first, after = frames.span(got)
    raw = encode_records_response(got, first, after - 1)
    assert raw is got.obj  # framed in place: not copied
    decoded = fast.ConsumeResponse.FromString(raw).records
    assert (decoded.data, decoded.first_offset, decoded.last_offset) == (bytes(got), first, after - 1)


def test_a_span_names_in_its_file_the_bytes_a_read_returns(
        frames: ModuleType, open_log: Callable[..., Any]) -> None:
    """read(span=True) (for sendfile, storage/file_span.py): the same whole batches as the read, as a range of
    the segment file on a descriptor of the span's own; read as `read` does where the batch holding the
    offset is small."""
    gen, model = Batches(frames, 17), Model(frames)
    log = open_log(segment_bytes=1 << 20, index_interval_bytes=100_000)
    for i in range(40):  # batches of ~72-144 KiB, and now and then a small one
        model.add(log.append([gen.batch(records=1, payload_max=100) if i % 7 == 3 else
                              gen.batch(records=2 + i % 3, payload_max=64 * 1024)]).data)
    assert len(log.segment_bases) >= 3
    spans = 0
    middle = model.batches[len(model.batches) // 2].base
    for limit in (model.end, middle):
        for stored in model.batches:
            for offset in {stored.base, stored.end - 1}:
                for max_bytes in (1, 200_000, 1 << 20):
                    got = log.read(offset, max_bytes, limit, span=True)
                    plain = log.read(offset, max_bytes, limit)
                    small = len(model.batches[model.holding(offset)].data) < file_span.MIN_BATCH_BYTES
                    if plain is None or small:  # nothing, or a small batch: read as `read` does
                        assert (got is None) == (plain is None) and bytes(got or b"") == bytes(plain or b"")
                        continue
                    span, after = got
                    try:
                        assert span.read() == bytes(plain) and len(span) == len(plain)
                        assert after == frames.span(plain)[1]
                        assert span.head == bytes(plain)[:HEADER_SIZE]
                        assert file_span.first_batch(span) == file_span.first_batch(plain)
                    finally:
                        span.close()
                    spans += 1
    assert spans > 50
    # A span outlives its segment: retention unlinks the file, the span's descriptor still reads it.
    first = model.batches[0]
    span, _ = log.read(first.base, 1 << 20, model.end, span=True)
    log.delete_before(log.segment_bases[1])
    assert log.start_offset > first.base
    assert span.read()[:len(first.data)] == first.data
    fd = span.fd
    span.close()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_lookup_points_at_or_before_the_batch_holding_an_offset(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    for interval, exact in ((0, True), (1_000, False), (1 << 20, False)):
        model = Model(frames)
        log = open_log(tmp_path / f"wal-{interval}", segment_bytes=SEGMENT, index_interval_bytes=interval)
        fill(log, Batches(frames, 7), model, 50)
        assert_lookups(log, model, exact)
        log.close()
        log = open_log(tmp_path / f"wal-{interval}", segment_bytes=SEGMENT, index_interval_bytes=interval)
        assert_lookups(log, model, exact)


# ----------------------------------------------------------------------------------------------------------
# Rolling segments


def test_roll_by_size_seals_segments_with_exact_indexes(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    d = tmp_path / "wal"
    gen, model = Batches(frames, 8), Model(frames)
    log = open_log(segment_bytes=SEGMENT, index_interval_bytes=0, index_max_bytes=4096)
    fill(log, gen, model, 80)
    bases = log.segment_bases
    assert len(bases) >= 4 and bases[0] == 0
    placement = model.placement(bases)
    for i, base in enumerate(bases[:-1]):
        footer = sealed_footer(log_path(d, base), model, base, bases[i + 1])
        first_of_next = next(b for b in model.batches if b.base == bases[i + 1])
        assert footer.body_end <= SEGMENT < footer.body_end + len(first_of_next.data)
        batches = [(b.base - base, pos) for b, (seg, pos) in zip(model.batches, placement, strict=True)
                   if seg == base]
        assert index_entries(idx_path(d, base)) == batches  # cut to count * 8 bytes
    assert idx_path(d, bases[-1]).stat().st_size == 4096  # the active index stays preallocated
    assert_all_readable(log, model)


def sealed_footer(path: Path, model: Model, base: int, end: int) -> Footer:
    """The footer of a sealed segment, checked: the file is the `.dnb1` object of its batches (docs/FORMAT.md,
    "Sealed segments"), as the uploader would build it from them."""
    data = path.read_bytes()
    check_header(data)
    footer = parse_footer(data)
    batches = [b for b in model.batches if base <= b.base < end]
    built = build_object(b"".join(b.data for b in batches)).footer
    assert (footer.min_offset, footer.max_offset, footer.min_time, footer.max_time, footer.body_end,
            footer.batch_count) == (base, end - 1, built.min_time, built.max_time, built.body_end,
                                    len(batches))
    assert footer.index[0] == (base, len(FILE_HEADER)) and data[footer.body_end:] == encode_footer(footer)
    return footer


def test_roll_by_age(frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    gen = Batches(frames, 9)
    aged = open_log(tmp_path / "aged", segment_ms=1)
    ageless = open_log(tmp_path / "ageless", segment_ms=0)
    for log in (aged, ageless):
        log.append([gen.batch(records=2)])
    time.sleep(0.01)
    for log in (aged, ageless):
        log.append([gen.batch(records=2)])
    assert aged.segment_bases == [0, 2]
    assert ageless.segment_bases == [0]


def test_roll_when_the_index_is_full(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    d = tmp_path / "wal"
    gen, model = Batches(frames, 10), Model(frames)
    log = open_log(index_interval_bytes=0, index_max_bytes=16)  # two entries per segment
    fill(log, gen, model, 5)
    bases = log.segment_bases
    assert bases == [model.batches[0].base, model.batches[2].base, model.batches[4].base]
    for base in bases[:-1]:
        assert idx_path(d, base).stat().st_size == 16
    # A group of three batches into a fresh segment: all written, the third one simply not indexed.
    log.roll()
    model.add(log.append([gen.batch() + gen.batch() + gen.batch()]).data)
    group = log.segment_bases[-1]
    assert group == model.batches[5].base
    assert_lookups(log, model, exact=False)
    assert log.lookup(model.batches[7].base) == (group, len(FILE_HEADER) + len(model.batches[5].data))
    model.add(log.append([gen.batch()]).data)  # the full index rolls before this one
    assert log.segment_bases[-1] == model.batches[8].base
    assert idx_path(d, group).stat().st_size == 16
    assert_all_readable(log, model)


def test_explicit_roll(frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    d = tmp_path / "wal"
    gen, model = Batches(frames, 11), Model(frames)
    log = open_log(index_interval_bytes=0)
    log.roll()  # nothing to seal
    assert log.segment_bases == [0]
    fill(log, gen, model, 3)
    log.roll()
    log.roll()  # the new active segment is empty: no-op
    assert log.segment_bases == [0, model.end]
    assert log.unsynced_bytes == 0
    assert idx_path(d, 0).stat().st_size == 3 * 8
    assert log_path(d, model.end).read_bytes() == b""  # its first append writes the file header
    fill(log, gen, model, 2)
    assert_all_readable(log, model)
    log.close()
    log = open_log(index_interval_bytes=0)
    assert log.segment_bases == [0, model.batches[3].base]
    assert_all_readable(log, model)


# ----------------------------------------------------------------------------------------------------------
# Retention


def test_delete_before_removes_only_whole_sealed_segments(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    d = tmp_path / "wal"
    gen, model = Batches(frames, 12), Model(frames)
    log = open_log(segment_bytes=SEGMENT, index_interval_bytes=500)
    fill(log, gen, model, 90)
    bases = log.segment_bases
    assert len(bases) >= 5
    assert log.delete_before(bases[1] - 1) == 0  # segment 0's last record is not below it
    assert log.delete_before(bases[1]) == 1
    assert not log_path(d, bases[0]).exists() and not idx_path(d, bases[0]).exists()
    model.drop_before(bases[1])
    assert (log.start_offset, log.segment_bases) == (bases[1], bases[1:])
    for below in (bases[1] - 1, 0):
        with pytest.raises(OffsetOutOfRange):
            log.read(below, 100, model.end)
        with pytest.raises(OffsetOutOfRange):
            log.lookup(below)
    assert log.delete_before(bases[3] + 1) == 2  # segment 3 still holds offsets at or above bases[3] + 1
    model.drop_before(bases[3])
    assert log.start_offset == bases[3]
    assert_all_readable(log, model)
    assert log.delete_before(log.next_offset + 1_000) == len(bases) - 4  # everything but the active one
    assert log.segment_bases == [bases[-1]] and log.start_offset == bases[-1]
    assert sorted(files(d)) == [idx_path(d, bases[-1]).name, log_path(d, bases[-1]).name]
    assert log.delete_before(log.next_offset + 1_000) == 0
    model.drop_before(bases[-1])
    fill(log, gen, model, 3)
    assert_all_readable(log, model)
    log.close()
    log = open_log(segment_bytes=SEGMENT, index_interval_bytes=500)
    assert log.start_offset == bases[-1]
    assert_all_readable(log, model)


# ----------------------------------------------------------------------------------------------------------
# Recovery of the last segment


@pytest.fixture
def written(frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> tuple[Path, Model]:
    """A closed log of several segments (interval 0: every batch indexed) and its model."""
    gen, model = Batches(frames, 13), Model(frames)
    log = open_log(segment_bytes=SEGMENT, index_interval_bytes=0)
    fill(log, gen, model, 45)
    assert len(log.segment_bases) >= 3
    log.close()
    return tmp_path / "wal", model


def reopen_cut(open_log: Callable[..., Any], d: Path, model: Model, cut_from: int, cut_bytes: int,
               next_offset: int) -> Any:
    """Reopen after damage to the last segment; check the cut, the data kept and that appends go on."""
    log = open_log(d, segment_bytes=SEGMENT, index_interval_bytes=0)
    last = log.segment_bases[-1]
    report = log.recovery
    cut = (report.truncated_segment, report.truncated_from, report.truncated_bytes)
    assert cut == (last, cut_from, cut_bytes)
    assert report.cut_reason
    assert (report.next_offset, log.next_offset, report.scanned_bytes) == (next_offset, next_offset, cut_from)
    assert log_path(d, last).stat().st_size == cut_from
    kept = Model(model.frames)
    kept.batches, kept.bases = list(model.batches), list(model.bases)
    kept.truncate_at(next_offset)
    assert_all_readable(log, kept)
    result = log.append([Batches(model.frames, cut_from).batch(records=2)])
    assert result.ranges == [(next_offset, next_offset + 1)]
    kept.add(result.data)
    assert_all_readable(log, kept)
    log.close()
    return report


def test_torn_tail_is_cut_back_to_the_last_whole_batch(
        written: tuple[Path, Model], open_log: Callable[..., Any]) -> None:
    d, model = written
    pristine = files(d)
    last_log = max(p for p in d.iterdir() if p.suffix == ".log")
    size = last_log.stat().st_size
    last = model.batches[-1]
    start = size - len(last.data)
    for cut in [start + 1, *sorted(random.Random(14).sample(range(start + 2, size - 1), 25)), size - 1]:
        restore(d, pristine)
        os.truncate(last_log, cut)
        reopen_cut(open_log, d, model, start, cut - start, last.base)


def test_torn_tail_of_a_segment_with_a_single_batch(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    d = tmp_path / "wal"
    gen, model = Batches(frames, 15), Model(frames)
    log = open_log(segment_bytes=SEGMENT, index_interval_bytes=0)
    fill(log, gen, model, 4)
    log.roll()
    fill(log, gen, model, 1)
    last = log.segment_bases[-1]
    log.close()
    os.truncate(log_path(d, last), len(FILE_HEADER) + 30)
    reopen_cut(open_log, d, model, len(FILE_HEADER), 30, last)


def test_garbage_after_the_last_batch_is_cut(
        written: tuple[Path, Model], open_log: Callable[..., Any]) -> None:
    d, model = written
    pristine = files(d)
    last_log = max(p for p in d.iterdir() if p.suffix == ".log")
    size = last_log.stat().st_size
    last = model.batches[-1]
    rng = random.Random(16)

    def header_copy(length: int, tail: int) -> bytes:
        data = bytearray(last.data[:HEADER_SIZE + tail])
        data[OFF_BASE_OFFSET:OFF_BASE_OFFSET + 8] = model.end.to_bytes(8, "little")  # continuity holds
        data[OFF_LENGTH:OFF_LENGTH + 4] = length.to_bytes(4, "little")
        return bytes(data)

    garbage = [rng.randbytes(n) for n in (1, 17, 55, 56, 57, 300)] + [
        bytes(100),
        header_copy(len(last.data), 20),  # right length, but torn
        header_copy(len(last.data) + 1000, len(last.data) - HEADER_SIZE),  # longer than the file
        header_copy(HEADER_SIZE, 0),  # shorter than its records
        header_copy(len(last.data) - 1, len(last.data) - HEADER_SIZE - 1),  # one byte short: CRC fails
        header_copy(1 << 31, 40),  # above the batch size limit
    ]
    for junk in garbage:
        restore(d, pristine)
        with open(last_log, "ab") as f:
            f.write(junk)
        reopen_cut(open_log, d, model, size, len(junk), model.end)
    # A whole valid batch with the right base offset, then junk: the cut keeps the batch.
    restore(d, pristine)
    extra = bytearray(last.data)
    extra[OFF_BASE_OFFSET:OFF_BASE_OFFSET + 8] = model.end.to_bytes(8, "little")
    with open(last_log, "ab") as f:
        f.write(bytes(extra) + b"\x01\x02\x03")
    model.add(bytes(extra))
    reopen_cut(open_log, d, model, size + len(extra), 3, model.end)


def test_bit_flip_in_the_last_segment_cuts_there(
        written: tuple[Path, Model], open_log: Callable[..., Any]) -> None:
    d, model = written
    pristine = files(d)
    last_log = max(p for p in d.iterdir() if p.suffix == ".log")
    size = last_log.stat().st_size
    placement = model.placement(sorted(int(p.stem) for p in d.glob("*.log")))
    last_index = len(model.batches) - 1
    middle_index = next(i for i, (seg, _) in enumerate(placement) if seg == placement[-1][0]) + 1
    assert middle_index < last_index
    for index, where in ((last_index, "payload"), (middle_index, "payload"), (last_index, "base_offset"),
                         (middle_index, "count")):
        restore(d, pristine)
        batch, pos = model.batches[index], placement[index][1]
        at = {"payload": pos + len(batch.data) // 2, "base_offset": pos + OFF_BASE_OFFSET + 2,
              "count": pos + OFF_COUNT}[where]
        flip_bit(last_log, at, bit=3)
        report = reopen_cut(open_log, d, model, pos, size - pos, batch.base)
        if where == "base_offset":  # not covered by the CRC: caught by the offset continuity check
            assert "base offset" in report.cut_reason


# ----------------------------------------------------------------------------------------------------------
# Recovery of indexes and sealed segments


@pytest.mark.parametrize("damage", ["random", "odd_size", "zeroed", "deleted", "short_file"])
def test_damaged_sealed_index_is_rebuilt(
        written: tuple[Path, Model], open_log: Callable[..., Any], damage: str) -> None:
    d, model = written
    bases = sorted(int(p.stem) for p in d.glob("*.log"))
    victim = idx_path(d, bases[1])
    original = victim.read_bytes()
    assert len(original) >= 3 * 8
    if damage == "random":
        victim.write_bytes(random.Random(17).randbytes(len(original)))
    elif damage == "odd_size":
        victim.write_bytes(original[:-3])
    elif damage == "zeroed":
        victim.write_bytes(bytes(len(original)))
    elif damage == "deleted":
        victim.unlink()
    else:
        victim.write_bytes(b"")
    log = open_log(d, segment_bytes=SEGMENT, index_interval_bytes=0)
    assert log.recovery.rebuilt_indexes == [bases[1]]
    assert log.recovery.truncated_segment is None
    assert victim.read_bytes() == original
    assert not list(d.glob("*.tmp"))
    assert_lookups(log, model, exact=True)
    assert_all_readable(log, model)


@pytest.mark.parametrize("damage", ["random", "zeroed", "truncated", "deleted"])
def test_damaged_active_index_is_rebuilt_silently(
        written: tuple[Path, Model], open_log: Callable[..., Any], damage: str) -> None:
    d, model = written
    last = max(int(p.stem) for p in d.glob("*.log"))
    victim = idx_path(d, last)
    original = victim.read_bytes()
    if damage == "random":
        victim.write_bytes(random.Random(18).randbytes(len(original)))
    elif damage == "zeroed":
        victim.write_bytes(bytes(len(original)))
    elif damage == "truncated":
        victim.write_bytes(original[:13])
    else:
        victim.unlink()
    log = open_log(d, segment_bytes=SEGMENT, index_interval_bytes=0)
    assert log.recovery.rebuilt_indexes == []
    assert log.recovery.truncated_segment is None
    assert victim.read_bytes() == original
    assert_lookups(log, model, exact=True)
    assert_all_readable(log, model)


def test_damaged_sealed_segment_without_index_is_refused_untouched(
        wal_impl: ModuleType, written: tuple[Path, Model]) -> None:
    d, model = written
    bases = sorted(int(p.stem) for p in d.glob("*.log"))
    placement = model.placement(bases)
    pos = next(p for seg, p in placement if seg == bases[1] and p > 0)
    victim = log_path(d, bases[1])
    data = bytearray(victim.read_bytes())
    garbage = random.Random(19).randbytes(HEADER_SIZE)
    assert garbage[:8] != data[pos:pos + 8]
    data[pos:pos + HEADER_SIZE] = garbage
    victim.write_bytes(data)
    idx_path(d, bases[1]).unlink()
    before = files(d)
    with pytest.raises(WalCorrupt, match="damaged"):
        make_log(wal_impl, str(d), segment_bytes=SEGMENT, index_interval_bytes=0)
    assert files(d) == before


def test_missing_middle_segment_is_refused(wal_impl: ModuleType, written: tuple[Path, Model]) -> None:
    d, _ = written
    bases = sorted(int(p.stem) for p in d.glob("*.log"))
    log_path(d, bases[1]).unlink()
    with pytest.raises(WalCorrupt, match="starts at"):
        make_log(wal_impl, str(d), segment_bytes=SEGMENT, index_interval_bytes=0)


@pytest.mark.parametrize("damage", ["zero_length", "zero_length_and_count_no_index"])
def test_zero_length_batch_in_a_sealed_segment_is_refused(
        wal_impl: ModuleType, written: tuple[Path, Model], request: pytest.FixtureRequest,
        damage: str) -> None:
    """A batch_length of 0 in a sealed segment must not make recovery walk in place forever. Opening runs in
    a child process so that a hang is a timeout, not a stuck suite."""
    d, model = written
    bases = sorted(int(p.stem) for p in d.glob("*.log"))
    placement = model.placement(bases)
    pos = next(p for seg, p in placement if seg == bases[1] and p > 0)
    victim = log_path(d, bases[1])
    data = bytearray(victim.read_bytes())
    if damage == "zero_length":  # index kept: it is sane, recovery walks from its last entry
        data[pos + OFF_LENGTH:pos + OFF_LENGTH + 4] = bytes(4)
        idx_path(d, bases[1]).write_bytes((0).to_bytes(8, "little"))
    else:  # index gone: the rebuild walks from byte 0, base offsets match, length and count are 0
        data[pos + OFF_LENGTH - 4:pos + OFF_COUNT + 4] = bytes(16)
        idx_path(d, bases[1]).unlink()
    victim.write_bytes(data)
    script = (f"import sys\nimport {wal_impl.__name__} as segments\n"
              "from danube_fast.storage.segmented_log import SegmentedLog\n"
              "from danube_fast.errors import WalCorrupt\n"
              "try:\n    SegmentedLog(sys.argv[1], segment_bytes=4096, index_interval_bytes=0,\n"
              "                 segments=segments)\n"
              "except WalCorrupt:\n    print('WalCorrupt')\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", script, str(d)], capture_output=True, text=True, timeout=3,
                          env=env, cwd=REPO, check=False)
    assert proc.stdout.strip() == "WalCorrupt", proc.stderr


# ----------------------------------------------------------------------------------------------------------
# Failures and closing


def test_closed_log_refuses_everything(frames: ModuleType, open_log: Callable[..., Any]) -> None:
    log = open_log()
    log.append([Batches(frames, 20).batch()])
    assert log.unsynced_bytes > 0
    log.close()
    log.close()
    for call in (lambda: log.append([b""]), log.sync, log.roll, lambda: log.delete_before(1),
                 lambda: log.read(0, 100, 10), lambda: log.lookup(0)):
        with pytest.raises(WalClosed):
            call()


def test_constructor_rejects_bad_settings(wal_impl: ModuleType, tmp_path: Path) -> None:
    for options in ({"segment_bytes": 0}, {"segment_bytes": (1 << 30) + 1}, {"segment_ms": -1},
                    {"index_interval_bytes": -1}, {"index_max_bytes": 8}, {"index_max_bytes": 20}):
        with pytest.raises(ValueError):
            make_log(wal_impl, str(tmp_path / "wal"), **options)


def test_failed_write_is_cut_back(frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    """A write that fails half way (here: RLIMIT_FSIZE) leaves the file as it was; the log goes on."""
    gen, model = Batches(frames, 21), Model(frames)
    log = open_log()
    fill(log, gen, model, 20)
    path = log_path(tmp_path / "wal", 0)
    size = path.stat().st_size
    big = b"".join(gen.batch(payload_max=400) for _ in range(6))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, hard))
        with pytest.raises(WalWriteError, match="nothing of this append was kept"):
            log.append([big])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert path.stat().st_size == size
    assert log.next_offset == model.end
    model.add(log.append([big]).data)
    assert_all_readable(log, model)
    log.close()
    log = open_log()
    assert log.recovery.truncated_segment is None
    assert_all_readable(log, model)


def test_failed_sync_refuses_appends_until_reopened_pure(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only the pure engine's syscalls can be made to fail from Python."""
    from danube_fast.codec import _frames_py
    from danube_fast.storage import _wal_py

    gen, model = Batches(_frames_py, 22), Model(_frames_py)
    log = make_log(_wal_py, str(tmp_path / "wal"))
    fill(log, gen, model, 3)

    def eio(*_: Any) -> None:
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as patch:
        patch.setattr(os, "fdatasync", eio)
        with pytest.raises(WalWriteError, match="fdatasync"):
            log.sync()
    for call in (lambda: log.append([gen.batch()]), log.sync, log.roll):
        with pytest.raises(WalWriteError, match="reopen"):
            call()
    assert_all_readable(log, model)
    log.close()
    log = make_log(_wal_py, str(tmp_path / "wal"))
    model.add(log.append([gen.batch()]).data)
    # A failed write whose cut-back fails too: the same refusal.
    with monkeypatch.context() as patch:
        patch.setattr(os, "pwrite", eio)
        patch.setattr(os, "ftruncate", eio)
        with pytest.raises(WalWriteError, match="writing"):
            log.append([gen.batch()])
    with pytest.raises(WalWriteError, match="reopen"):
        log.append([gen.batch()])
    log.close()
    log = make_log(_wal_py, str(tmp_path / "wal"))
    assert_all_readable(log, model)
    log.close()


def allocated(path: Path) -> int:
    """Bytes of disk the file holds (its blocks), as opposed to its length."""
    return path.stat().st_blocks * 512


def test_index_reservation_starts_at_a_page_and_doubles_up_to_a_step() -> None:
    page, size = mmap.PAGESIZE, 1 << 20
    ends, reserved = [], 0
    for needed in range(8, size + 1, 8):
        if needed > reserved:
            reserved = index_reservation(reserved, needed, size)
            assert reserved % page == 0 and reserved >= needed
            ends.append(reserved)
    doubling = [page << i for i in range(20) if page << i <= max(INDEX_RESERVE_MAX_STEP, page)]
    assert ends[:len(doubling)] == doubling
    assert ends[len(doubling):] == list(range(doubling[-1] * 2, size + 1, doubling[-1]))
    assert index_reservation(0, 16, 16) == 16  # never past the file's length
    assert index_reservation(page, page + 8, page + 16) == page + 16


def test_active_index_gets_disk_blocks_as_entries_need_them(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    """The active index is a sparse file written through a mapping: a page must have its blocks before an
    entry goes into it (posix_fallocate), or a full disk turns the store into a SIGBUS. Reserved
    a page at a time at first, never the whole index up front."""
    page = mmap.PAGESIZE
    probe = tmp_path / "probe"
    with open(probe, "wb") as f:
        f.truncate(1 << 20)
        os.posix_fallocate(f.fileno(), 0, page)
    if allocated(probe) != page:
        pytest.skip("this file system does not report posix_fallocate's blocks exactly")
    d = tmp_path / "wal"
    gen, model = Batches(frames, 30), Model(frames)
    log = open_log(index_interval_bytes=0)  # an entry per batch, in a 1 MiB index
    idx = idx_path(d, 0)
    assert idx.stat().st_size == 1 << 20 and allocated(idx) == 0
    fill(log, gen, model, 1)
    assert allocated(idx) == page
    fill(log, gen, model, page // 8)  # the last of these is the first entry in the second page
    assert allocated(idx) == 2 * page
    log.close()
    log = open_log(index_interval_bytes=0)  # recovery rebuilds the active index, reserving as it goes
    assert allocated(idx) == 2 * page
    assert_lookups(log, model, exact=True)
    log.roll()  # the cut gives back the reservation past the entries
    assert allocated(idx) == -(-len(model.batches) * 8 // page) * page
    assert allocated(idx_path(d, model.end)) == 0
    fill(log, gen, model, 1)
    assert allocated(idx_path(d, model.batches[-1].base)) == page
    assert_all_readable(log, model)


def test_index_without_disk_space_refuses_the_append_pure(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only the pure engine's syscalls can be made to fail from Python; tests/faults runs both engines on a
    full tmpfs."""
    from danube_fast.codec import _frames_py
    from danube_fast.storage import _wal_py

    gen, model = Batches(_frames_py, 31), Model(_frames_py)
    options = {"index_interval_bytes": 0, "index_max_bytes": 64 * 1024}
    log = make_log(_wal_py, str(tmp_path / "wal"), **options)
    fill(log, gen, model, mmap.PAGESIZE // 8)  # the first page of the index is full
    before = files(tmp_path / "wal")

    def enospc(*_: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "posix_fallocate", enospc)
        with pytest.raises(WalWriteError, match=r"cannot reserve index space .*; nothing of this append was"):
            log.append([gen.batch()])
        assert log.next_offset == model.end
        assert files(tmp_path / "wal") == before
        log.roll()  # a new segment needs no space until its first append
        with pytest.raises(WalWriteError, match="No space left on device"):
            log.append([gen.batch()])
    fill(log, gen, model, 3)  # space is back: the same log goes on
    log.close()
    (tmp_path / "wal" / "clean").unlink()  # as after a crash: the open scans, and rebuilds the index
    with monkeypatch.context() as patch:
        patch.setattr(os, "posix_fallocate", enospc)  # recovery rebuilds the active index
        with pytest.raises(WalWriteError, match=r"cannot open the WAL .*: cannot reserve index space"):
            make_log(_wal_py, str(tmp_path / "wal"), **options)
    log = make_log(_wal_py, str(tmp_path / "wal"), **options)
    assert log.recovery.truncated_segment is None
    assert_all_readable(log, model)
    log.close()


# ----------------------------------------------------------------------------------------------------------
# Concurrency


def test_concurrent_reads_while_appending_and_rolling(
        frames: ModuleType, open_log: Callable[..., Any]) -> None:
    log = open_log(segment_bytes=8192, index_interval_bytes=512)
    gen = Batches(frames, 23)
    stored: dict[int, bytes] = {}  # base offset -> stamped batch, filled before the limit is published
    limit = [0]
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = [0]

    def reader() -> None:
        rng = random.Random(24)
        try:
            while not stop.is_set():
                committed = limit[0]
                if committed == 0:
                    time.sleep(0)
                    continue
                offset = rng.randrange(max(0, committed - 300), committed)
                got = log.read(offset, rng.choice([1, 600, 5000]), committed)
                assert got is not None, offset
                data = bytes(got)
                headers = frames.scan_batches(data, verify=False)
                assert headers[0].base_offset <= offset <= headers[0].last_offset
                for a, b in itertools.pairwise(headers):
                    assert b.base_offset == a.last_offset + 1
                assert headers[-1].last_offset < committed
                for h in headers:
                    assert data[h.position:h.end] == stored[h.base_offset]
                reads[0] += 1
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        for _ in range(2_000):
            result = log.append([gen.batch(payload_max=60)])
            for h in frames.scan_batches(result.data, verify=False):
                stored[h.base_offset] = result.data[h.position:h.end]
            limit[0] = result.next_offset
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    if errors:
        raise errors[0]
    assert reads[0] > 100
    assert len(log.segment_bases) > 10


def gated_log(wal_impl: ModuleType, directory: Path) -> tuple[SegmentedLog, threading.Event, threading.Event]:
    """A log whose segment reads stop inside the segment (after `entered` is set) until `release` is set."""
    entered, release = threading.Event(), threading.Event()

    class GatedSegment(wal_impl.Segment):  # type: ignore[name-defined,misc]
        def read(self, *args: Any) -> Any:
            entered.set()
            assert release.wait(10)
            return super().read(*args)

    gated = SimpleNamespace(Segment=GatedSegment, check_buffers=wal_impl.check_buffers,
                            MAX_SEGMENT=wal_impl.MAX_SEGMENT)
    return SegmentedLog(str(directory), segments=gated), entered, release  # type: ignore[arg-type]


def test_close_waits_for_a_read_in_progress_and_later_reads_get_wal_closed(
        wal_impl: ModuleType, frames: ModuleType, tmp_path: Path) -> None:
    """The policy, not the GIL, keeps close from pulling a descriptor from under a pread: a read blocked
    inside the segment's read holds close back; once it returns with its data, every read gets WalClosed."""
    log, entered, release = gated_log(wal_impl, tmp_path / "wal")
    end = log.append([Batches(frames, 30).batch(records=3)]).next_offset
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(log.read(0, 1 << 20, end)))
    reader.start()
    assert entered.wait(10)
    closer = threading.Thread(target=log.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive(), "close returned while a read was running"
    release.set()
    reader.join(10)
    closer.join(10)
    assert not closer.is_alive()
    assert len(got) == 1 and got[0] is not None and frames.scan_batches(bytes(got[0]))[0].record_count == 3
    with pytest.raises(WalClosed):
        log.read(0, 1 << 20, end)


def open_files_under(directory: Path) -> int:
    """Descriptors of this process open on files under `directory` (index mappings hold none)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target.startswith(str(directory) + os.sep)
    return count


def mapped_files_under(directory: Path) -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if str(directory) + os.sep in line)


def test_release_closes_the_files_and_every_use_reopens_them(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    """An idle log gives back its descriptors and index mappings; append, read, lookup, sync, roll and
    retention then work as if it had never let go, and the files are the same as without the release."""
    wal = tmp_path / "wal"
    log = open_log(wal, segment_bytes=SEGMENT, index_interval_bytes=300)
    gen, model = Batches(frames, 33), Model(frames)
    fill(log, gen, model, 40)
    assert len(log.segment_bases) > 2 and open_files_under(wal) > 2 and mapped_files_under(wal) > 2
    uses: list[Callable[[], Any]] = [
        lambda: assert_all_readable(log, model),
        lambda: log.lookup(model.start + 3),
        lambda: fill(log, gen, model, 3),
        log.sync,
        log.roll,
    ]
    for use in uses:
        log.release()
        assert log.released and open_files_under(wal) == 0 and mapped_files_under(wal) == 0
        assert (log.start_offset, log.next_offset) == (model.start, model.end)  # known without the files
        use()
        # (at least: Python's mmap keeps a descriptor of its own, so the pure twin holds two per segment)
        assert not log.released and open_files_under(wal) >= len(log.segment_bases)
    log.release()  # retention only unlinks: it needs no descriptor
    assert log.delete_before(log.segment_bases[1]) == 1 and log.released
    model.drop_before(log.start_offset)
    assert_all_readable(log, model)
    log.release()
    log.close()
    reopened = open_log(wal, segment_bytes=SEGMENT, index_interval_bytes=300)
    assert reopened.recovery.truncated_segment is None and reopened.recovery.rebuilt_indexes == []
    assert_all_readable(reopened, model)


def test_release_waits_for_a_read_in_progress(wal_impl: ModuleType, frames: ModuleType,
                                              tmp_path: Path) -> None:
    log, entered, release = gated_log(wal_impl, tmp_path / "wal")
    end = log.append([Batches(frames, 34).batch(records=2)]).next_offset
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(log.read(0, 1 << 20, end)))
    reader.start()
    assert entered.wait(10)
    releaser = threading.Thread(target=log.release)
    releaser.start()
    releaser.join(0.3)
    assert releaser.is_alive() and not log.released, "the files were released under a read"
    release.set()
    reader.join(10)
    releaser.join(10)
    assert log.released and got[0] is not None
    assert frames.scan_batches(bytes(log.read(0, 1 << 20, end)))[0].record_count == 2
    log.close()


def test_concurrent_appends_are_serialized(frames: ModuleType, open_log: Callable[..., Any],
                                           tmp_path: Path) -> None:
    """Appends from two threads (large buffers: the native copy and write release the GIL) get disjoint,
    contiguous ranges and land whole; the files reopen to exactly what was acknowledged."""
    log = open_log(segment_bytes=1 << 20)
    gens = [Batches(frames, 31), Batches(frames, 32)]
    results: list[list[tuple[int, int, bytes]]] = [[], []]

    def writer(k: int) -> None:
        for _ in range(40):
            batch = gens[k].batch(records=2, payload_max=0)
            big = frames.encode_payloads([bytes([k]) * 70_000, bytes([k]) * 10], publish_time=1,
                                         producer_id=k)
            for data in (batch, big):
                result = log.append([data])
                first, last = result.ranges[0]
                results[k].append((first, last, bytes(result.data)))

    threads = [threading.Thread(target=writer, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    spans = sorted((first, last) for per in results for first, last, _ in per)
    assert spans[0][0] == 0 and all(b[0] == a[1] + 1 for a, b in itertools.pairwise(spans))
    end = log.next_offset
    assert end == spans[-1][1] + 1
    log.close()
    reopened = open_log()
    assert reopened.next_offset == end and reopened.recovery.truncated_segment is None
    for per in results:
        for first, _, data in per:
            got = reopened.read(first, len(data), end)
            assert bytes(got)[:len(data)] == data


# ----------------------------------------------------------------------------------------------------------
# Native and pure engines against each other


def both_engines() -> list[tuple[str, ModuleType]]:
    return [(name, importlib.import_module(WAL_MODULES[name])) for name in sorted(WAL_MODULES)]


def test_same_files_and_interchangeable_directories_across_impls(tmp_path: Path) -> None:
    codec = importlib.import_module(CODEC_MODULES["native"])
    gen, rng = Batches(codec, 25), random.Random(26)
    calls: list[list[bytes]] = []
    for _ in range(60):
        call = [gen.buffer() for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.3:
            call.insert(rng.randint(0, len(call)), rng.randbytes(rng.randint(0, 100)))
        calls.append(call)
    options = {"segment_bytes": SEGMENT, "index_interval_bytes": 700, "initial_offset": 42}
    outcomes = {}
    models = {}
    for name, engine in both_engines():
        log = make_log(engine, str(tmp_path / name), **options)
        model = Model(codec)
        results = []
        for i, call in enumerate(calls):
            result = log.append(call)
            model.add(result.data)
            results.append((result.data, result.first_offset, result.next_offset,
                            [r if isinstance(r, tuple) else (type(r), r.position) for r in result.ranges]))
            if i == 20:
                log.roll()
            if i == 40:
                log.sync()
                log.delete_before(log.segment_bases[2])
                model.drop_before(log.start_offset)
        outcomes[name] = (results, log.segment_bases, log.start_offset, log.next_offset)
        models[name] = model
        log.close()
    assert outcomes["native"] == outcomes["pure"]
    assert files(tmp_path / "native") == files(tmp_path / "pure")
    for (name, engine), other in zip(both_engines(), ("pure", "native"), strict=True):
        log = make_log(engine, str(tmp_path / other), **options)
        assert (log.segment_bases, log.start_offset, log.next_offset) == outcomes[other][1:], name
        assert log.recovery.truncated_segment is None and log.recovery.rebuilt_indexes == []
        assert_all_readable(log, models[other])
        model = models[other]
        model.add(log.append(calls[0]).data)
        log.close()
    assert files(tmp_path / "native") == files(tmp_path / "pure")


def test_same_recovery_across_impls(tmp_path: Path) -> None:
    """The same damage, recovered by each engine from its own copy: same report, same files afterwards."""
    codec = importlib.import_module(CODEC_MODULES["native"])
    gen = Batches(codec, 27)
    source = tmp_path / "source"
    log = make_log(importlib.import_module(WAL_MODULES["native"]),
        str(source), segment_bytes=SEGMENT, index_interval_bytes=300)
    for _ in range(50):
        log.append([gen.buffer()])
    bases = log.segment_bases
    log.close()
    os.truncate(log_path(source, bases[-1]), log_path(source, bases[-1]).stat().st_size - 7)
    idx_path(source, bases[1]).write_bytes(b"\x01" * 13)
    idx_path(source, bases[-1]).unlink()
    pristine = files(source)
    after = gen.batch()
    reports = {}
    results = {}
    for name, engine in both_engines():
        copy = tmp_path / name
        copy.mkdir()
        restore(copy, pristine)
        log = make_log(engine, str(copy), segment_bytes=SEGMENT, index_interval_bytes=300)
        report = log.recovery
        assert report.cut_reason
        reports[name] = (report.segments, report.next_offset, report.scanned_bytes, report.truncated_segment,
                         report.truncated_from, report.truncated_bytes, report.rebuilt_indexes)
        results[name] = log.append([after]).ranges
        log.close()
    assert reports["native"] == reports["pure"]
    assert reports["native"][3] == bases[-1] and reports["native"][6] == [bases[1]]
    assert results["native"] == results["pure"]
    assert files(tmp_path / "native") == files(tmp_path / "pure")

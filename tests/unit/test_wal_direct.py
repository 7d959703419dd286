"""Direct appends (SegmentedLog(direct_io=True), Segment.direct): the active segment is written with O_DIRECT
in whole 4 KiB blocks, zeros after the last batch until the segment rolls or closes. Over both cores, on the
real file system under tmp_path (ext4 here and in CI; the test fails loudly if it takes no O_DIRECT)."""

from __future__ import annotations

import itertools
import os
import random
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from danube_fast.storage.objects.format import parse_footer
from danube_fast.storage.segments import FILE_HEADER
from tests.unit.test_wal_engine import (
    Batches,
    Model,
    assert_framed_in_place,
    assert_read,
    frames,
    impl_name,
    make_log,
    wal_impl,
)

__all__ = ["frames", "wal_impl"]  # fixtures used here

BLOCK = 4096


def logs(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.log"))}


def fill(log: Any, gen: Batches, model: Model, appends: int) -> None:
    for _ in range(appends):
        model.add(log.append([gen.buffer()]).data)


def check_all(log: Any, model: Model) -> None:
    for b in model.batches:
        assert_read(log, model, b.base, 1, 1 << 63)
    assert_read(log, model, model.start, 1 << 20, 1 << 63)


def test_direct_appends_pad_the_last_block_and_close_cuts_it(wal_impl: ModuleType, frames: ModuleType,
                                                             tmp_path: Path) -> None:
    log = make_log(wal_impl, str(tmp_path / "wal"), direct_io=True, segment_bytes=1 << 20)
    gen, model = Batches(frames, 1), Model(frames)
    fill(log, gen, model, 150)
    log.sync()
    (segment,) = (tmp_path / "wal").glob("*.log")
    written = len(FILE_HEADER) + sum(len(b.data) for b in model.batches)
    assert written % BLOCK, "pick a seed whose batches do not end on a block"
    assert segment.stat().st_size == -(-written // BLOCK) * BLOCK  # padded: the write was direct
    check_all(log, model)
    log.close()
    assert segment.stat().st_size == written
    assert segment.read_bytes() == FILE_HEADER + b"".join(b.data for b in model.batches)
    reopened = make_log(wal_impl, str(tmp_path / "wal"))
    assert reopened.recovery.padding_bytes == 0 and reopened.recovery.truncated_bytes == 0
    check_all(reopened, model)
    reopened.close()


def test_a_crash_image_with_padding_recovers_every_batch_without_calling_it_damage(
        wal_impl: ModuleType, frames: ModuleType, tmp_path: Path) -> None:
    log = make_log(wal_impl, str(tmp_path / "wal"), direct_io=True, segment_bytes=1 << 20)
    gen, model = Batches(frames, 2), Model(frames)
    fill(log, gen, model, 60)
    log.sync()
    shutil.copytree(tmp_path / "wal", tmp_path / "image")  # what a kill -9 leaves: the padding is on disk
    log.close()
    recovered = make_log(wal_impl, str(tmp_path / "image"), direct_io=True, segment_bytes=1 << 20)
    report = recovered.recovery
    assert 0 < report.padding_bytes < BLOCK
    assert report.truncated_bytes == 0 and report.cut_reason is None
    assert recovered.next_offset == model.end
    check_all(recovered, model)
    fill(recovered, gen, model, 40)  # appends go on after the cut, rewriting the last block from the file
    check_all(recovered, model)
    recovered.close()
    assert logs(tmp_path / "image")[f"{0:020d}.log"] == FILE_HEADER + b"".join(b.data for b in model.batches)


def test_damage_inside_the_padded_block_is_still_cut_as_damage(wal_impl: ModuleType, frames: ModuleType,
                                                               tmp_path: Path) -> None:
    """Only zeros count as padding: a non-zero byte after the last batch is a torn tail, reported as one."""
    log = make_log(wal_impl, str(tmp_path / "wal"), direct_io=True, segment_bytes=1 << 20)
    gen, model = Batches(frames, 3), Model(frames)
    fill(log, gen, model, 30)
    log.sync()
    shutil.copytree(tmp_path / "wal", tmp_path / "image")
    log.close()
    (segment,) = (tmp_path / "image").glob("*.log")
    data = bytearray(segment.read_bytes())
    written = len(FILE_HEADER) + sum(len(b.data) for b in model.batches)
    assert len(data) > written + 1
    data[-1] = 0x5A
    segment.write_bytes(bytes(data))
    recovered = make_log(wal_impl, str(tmp_path / "image"))
    assert recovered.recovery.padding_bytes == 0
    assert recovered.recovery.truncated_bytes == len(data) - written
    check_all(recovered, model)
    recovered.close()


@pytest.mark.parametrize("release", [False, True])
def test_direct_and_buffered_logs_write_the_same_files_across_impls(tmp_path: Path, release: bool) -> None:
    """Both cores, direct and buffered, with rolls (sealed segments carry no padding) and, in one run, a
    release in the middle (the last block is then read back from the file, not from memory)."""
    from danube_fast.codec import _frames, _frames_py
    from danube_fast.storage import _wal, _wal_py

    results = {}
    for name, segments, codec, direct in (("native-direct", _wal, _frames, True),
                                          ("pure-direct", _wal_py, _frames_py, True),
                                          ("native-buffered", _wal, _frames, False)):
        directory = tmp_path / name
        log = make_log(segments, str(directory), direct_io=direct, segment_bytes=24 * 1024)
        gen, model = Batches(codec, 4), Model(codec)
        fill(log, gen, model, 120)
        if release:
            log.release()
        fill(log, gen, model, 120)
        log.sync()
        bases = log.segment_bases
        assert len(bases) >= 4
        files = logs(directory)
        for base, following in itertools.pairwise(bases):  # a roll cut the sealed ones' padding
            want = FILE_HEADER + b"".join(b.data for b in model.batches if base <= b.base < following)
            sealed = files[f"{base:020d}.log"]
            assert sealed[:parse_footer(sealed).body_end] == want
        check_all(log, model)
        log.close()
        results[name] = logs(directory)
    assert results["native-direct"] == results["pure-direct"] == results["native-buffered"]


@pytest.mark.parametrize("sizes", [[], [8], [BLOCK], [8, 5 << 20, 0, BLOCK - 1, 1], [4 << 20],
                                   [3, (4 << 20) - 3, BLOCK], [(8 << 20) + 17]])
def test_write_direct_writes_a_new_file_of_exactly_the_parts(wal_impl: ModuleType, tmp_path: Path,
                                                              sizes: list[int]) -> None:
    """write_direct (the folder store's object writes): whole 4 MiB chunks and a padded last block through
    the O_DIRECT descriptor, the padding cut; parts split across chunks, empty ones, block-sized ones."""
    rng = random.Random(sum(sizes))
    parts = [rng.randbytes(n) for n in sizes]
    path = tmp_path / "object"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    dfd = os.open(path, os.O_WRONLY | os.O_DIRECT)  # fails loudly where the file system has no O_DIRECT
    try:
        assert wal_impl.write_direct(fd, dfd, [memoryview(p) for p in parts]) == sum(sizes)
    finally:
        os.close(dfd)
        os.close(fd)
    assert path.read_bytes() == b"".join(parts)


def test_large_groups_are_stamped_for_the_direct_write_and_files_match_across_impls(tmp_path: Path) -> None:
    """A direct append of 64 KiB or more is stamped straight into a block-aligned buffer that the write uses
    as it is (native): the files are byte for byte those of the pure twin and of a buffered log, across
    small and large groups, a release (the last block then comes back from the file) and rolls; the group's
    bytes (AppendResult.data, what the tail cache keeps) are read-only and read back as written."""
    from danube_fast.codec import _frames, _frames_py
    from danube_fast.storage import _wal, _wal_py

    results = {}
    for name, segments, codec, direct in (("native-direct", _wal, _frames, True),
                                          ("pure-direct", _wal_py, _frames_py, True),
                                          ("native-buffered", _wal, _frames, False)):
        directory = tmp_path / name
        log = make_log(segments, str(directory), direct_io=direct, segment_bytes=1 << 20)
        gen, model = Batches(codec, 6), Model(codec)
        aligned = 0
        for i in range(60):
            if i == 30:
                log.release()
            big = i % 3 != 2
            buffer = (b"".join(gen.batch(records=3, payload_max=30_000) for _ in range(3)) if big
                      else gen.buffer())
            data = log.append([buffer]).data
            view = memoryview(data)
            assert view.readonly
            if big and direct and name.startswith("native"):
                assert not isinstance(data, bytes), "a large direct group is stamped into an aligned buffer"
                aligned += 1
            model.add(bytes(view))
        log.sync()
        assert len(log.segment_bases) >= 3
        check_all(log, model)
        log.close()
        results[name] = logs(directory)
        if name == "native-direct":
            assert aligned >= 30
    assert results["native-direct"] == results["pure-direct"] == results["native-buffered"]


def direct_readers(directory: Path) -> set[str]:
    """The segment files of `directory` this process has open read-only with O_DIRECT."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            flags = int(Path(f"/proc/self/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError):
            continue  # closed meanwhile (the listing's own descriptor)
        if target.startswith(str(directory)) and flags & os.O_DIRECT and flags & os.O_ACCMODE == os.O_RDONLY:
            found.add(os.path.basename(target))
    return found


def test_direct_reads_return_exactly_what_a_read_should(wal_impl: ModuleType, frames: ModuleType,
                                                        tmp_path: Path) -> None:
    """Segment.direct_reads (SegmentedLog(direct_reads=True) with direct appends, for the active and the
    sealed segments): reads go through an O_DIRECT descriptor and return exactly the batches the model
    expects, at every batch, at offsets inside batches, for tiny and large max_bytes and limits in the
    middle. A sparse index (32 KiB apart) makes the header walk pass the first blocks read, and batches of
    up to 90 KB are bigger than they; appends go on between the reads (the active segment's last block is
    rewritten). Direct appends alone (the default) read through the page cache."""
    directory = tmp_path / "wal"
    appends_only = make_log(wal_impl, str(tmp_path / "appends-only"), direct_io=True)
    appends_only.append([Batches(frames, 8).buffer()])
    assert not direct_readers(tmp_path / "appends-only")
    appends_only.close()
    log = make_log(wal_impl, str(directory), direct_io=True, direct_reads=True, segment_bytes=256 * 1024,
                   index_interval_bytes=32 * 1024)
    gen, model = Batches(frames, 9), Model(frames)
    rng = random.Random(9)
    for round_ in range(3):
        for _ in range(40):
            big = rng.random() < 0.3
            data = log.append([gen.batch(records=3, payload_max=30_000) if big else gen.buffer()]).data
            model.add(bytes(memoryview(data)))
        log.sync()
        assert {f"{base:020d}.log" for base in log.segment_bases} <= direct_readers(directory)
        assert len(log.segment_bases) >= round_ + 1
        limits = (model.end, model.batches[len(model.batches) // 2].base + 1)
        for b in model.batches[::3]:
            for offset in {b.base, b.base + b.count - 1}:
                for max_bytes in (1, 700, BLOCK + 1, 70_000, 1 << 20):
                    for limit in limits:
                        assert_read(log, model, offset, max_bytes, limit)
    if impl_name(wal_impl) == "native":  # copied out of the aligned blocks with room in front, as a read
        for b in model.batches[::5]:
            assert_framed_in_place(frames, log.read(b.base, 70_000, model.end))
    log.release()  # closed while idle: the next read reopens the descriptors, the direct one too
    check_all(log, model)
    assert {f"{base:020d}.log" for base in log.segment_bases} <= direct_readers(directory)
    log.close()
    assert not direct_readers(directory)
    buffered = make_log(wal_impl, str(directory))  # without direct_io: no direct descriptor, same reads
    check_all(buffered, model)
    assert not direct_readers(directory)
    buffered.close()

"""Real faults against the WAL: SIGKILL mid-stream, a full disk, unwritable directories.

Each test compares what a writer process acknowledged with what reopening the log reads back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from wal_full_index import record
from wal_writer import payload

from danube_fast.codec import frames
from danube_fast.errors import WalWriteError
from danube_fast.storage.segmented_log import SegmentedLog

WRITER = Path(__file__).parent / "wal_writer.py"
MANY_WRITER = Path(__file__).parent / "wal_many_writer.py"
FULL_INDEX = Path(__file__).parent / "wal_full_index.py"
ROOT = Path(__file__).resolve().parents[2]
IS_ROOT = os.geteuid() == 0


@dataclass(frozen=True)
class Ack:
    first: int
    last: int
    run: int
    producer: int
    seq: int
    count: int


def start_writer(directory: Path, run: int, *, sync: str = "always", producers: int = 8,
                 fsize_limit: int | None = None) -> subprocess.Popen[str]:
    args = [sys.executable, str(WRITER), str(directory), sync, str(producers), str(run)]
    if fsize_limit is not None:
        args.append(str(fsize_limit))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready"), line + proc.stderr.read() if proc.stderr else line
    return proc


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def parse_acks(lines: Iterator[str] | list[str]) -> list[Ack]:
    """Complete "ack" lines; a SIGKILL can cut the last line short (that append's ack is then unknown)."""
    complete = [line for line in lines if line.endswith("\n")]
    return [Ack(*map(int, line.split()[1:])) for line in complete if line.startswith("ack ")]


def read_back(directory: Path) -> tuple[SegmentedLog, list[frames.Record]]:
    log = SegmentedLog(str(directory), index_max_bytes=64 * 1024)
    records: list[frames.Record] = []
    offset = log.start_offset
    while True:
        data = log.read(offset, 1 << 20, log.next_offset)
        if data is None:
            return log, records
        got = [r for r in frames.decode_records(data) if r.offset >= offset]
        records.extend(got)
        offset = got[-1].offset + 1


def assert_acked_present(acks: list[Ack], records: list[frames.Record]) -> None:
    assert [r.offset for r in records] == list(range(len(records))), "offsets must be contiguous from 0"
    for a in acks:
        assert a.last - a.first + 1 == a.count
        assert a.last < len(records), f"acknowledged {a} is missing after recovery"
        for j, offset in enumerate(range(a.first, a.last + 1)):
            assert records[offset].payload == payload(a.run, a.producer, a.seq, j), f"{a} record {j}"


@pytest.mark.slow
def test_sigkill_mid_stream_loses_nothing_acknowledged(tmp_path: Path) -> None:
    acks: list[Ack] = []
    for run in range(3):  # kill, recover, write on, kill again
        proc = start_writer(tmp_path, run)
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            if len(lines) >= 400:
                break
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        acks += parse_acks(lines + rest.splitlines(keepends=True))
        log, records = read_back(tmp_path)
        assert_acked_present(acks, records)
        # A new run appends after everything acknowledged so far.
        assert log.next_offset > max(a.last for a in acks)
        log.close()
    # Every acknowledged offset belongs to exactly one acknowledged append.
    covered = sorted(o for a in acks for o in range(a.first, a.last + 1))
    assert covered == sorted(set(covered))


def finish_until_error(proc: subprocess.Popen[str]) -> tuple[list[Ack], list[str]]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = out.splitlines(keepends=True)
    return parse_acks(lines), [line for line in lines if line.startswith("error ")]


@pytest.mark.slow
def test_file_size_limit_fails_appends_cleanly(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes writes past the limit fail with EFBIG: a full disk any user can produce."""
    proc = start_writer(tmp_path, 0, fsize_limit=200_000)
    acks, errors = finish_until_error(proc)
    assert errors and "WalWriteError" in errors[0] and "too large" in errors[0].lower()
    assert "nothing of this append was kept" in errors[0]
    log, records = read_back(tmp_path)
    assert log.recovery.truncated_bytes == 0, "the failed write left part of a batch behind"
    assert_acked_present(acks, records)
    assert len(records) == max(a.last for a in acks) + 1
    log.close()


@pytest.mark.slow
@pytest.mark.parametrize("fs", ["tmpfs", "ext4_direct"])
def test_full_disk_fails_appends_cleanly_and_recovers_when_space_returns(
        fs: str, request: pytest.FixtureRequest) -> None:
    """tmpfs: buffered appends; ext4: O_DIRECT appends (Segment.direct), padding and all."""
    root: Path = request.getfixturevalue("small_tmpfs" if fs == "tmpfs" else "small_ext4")
    wal_dir = root / "wal"
    filler = root / "filler"
    room = os.statvfs(root)
    filler.write_bytes(b"\0" * (room.f_bavail * room.f_frsize - 768 * 1024))
    log = SegmentedLog(str(wal_dir), segment_bytes=64 * 1024 * 1024, index_max_bytes=64 * 1024,
                       direct_io=fs == "ext4_direct")
    data = frames.encode_payloads([b"x" * 1000] * 20)
    acked = 0
    with pytest.raises(WalWriteError, match="No space left on device") as info:
        for _ in range(10_000):
            result = log.append([data])
            log.sync()
            acked = result.next_offset
    assert "nothing of this append was kept" in str(info.value)
    assert log.next_offset == acked
    filler.unlink()  # space returns: the same log appends again, no reopen needed
    result = log.append([data])
    log.sync()
    assert result.ranges == [(acked, acked + 19)]
    (segment,) = wal_dir.glob("*.log")
    if fs == "ext4_direct":  # the last block was written whole: zero padding after the batches until close
        assert segment.stat().st_size % 4096 == 0
    log.close()
    # close cut the padding: batches of 20,236 bytes (4 x 5,059) end on a block only every 1,024 of them
    assert segment.stat().st_size % 4096 != 0
    log, records = read_back(wal_dir)
    assert log.recovery.truncated_bytes == 0
    assert len(records) == acked + 20
    log.close()


@pytest.mark.slow
@pytest.mark.parametrize("core", ["native", "pure"])
@pytest.mark.parametrize("scenario", ["page", "roll", "reopen"])
def test_index_without_room_on_a_full_disk_is_a_clean_error(
        small_tmpfs: Path, scenario: str, core: str) -> None:
    """The index is a sparse file written through a shared mapping: where a page it writes has no block yet
    and the disk is full, the kernel answers the store with SIGBUS, which kills the broker. Here
    only the index lacks room (see wal_full_index.py): the engine must refuse with ENOSPC, go on once space
    returns, and keep everything acknowledged."""
    wal_dir = small_tmpfs / "wal"
    env = child_env(DANUBE_FAST_PURE="1" if core == "pure" else "0")
    args = [sys.executable, str(FULL_INDEX), str(wal_dir), str(small_tmpfs / "filler"), scenario]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
    died = signal.Signals(-proc.returncode).name if proc.returncode < 0 else f"exit status {proc.returncode}"
    assert proc.returncode == 0, f"the writer died ({died}): {proc.stderr}"
    lines = proc.stdout.splitlines()
    errors = [line for line in lines if line.startswith("error ")]
    assert len(errors) == 1, proc.stdout
    assert "WalWriteError" in errors[0] and "No space left on device" in errors[0]
    if scenario != "roll":  # there the reservation takes the page the record data then lacks
        assert "cannot reserve index space" in errors[0]
    if scenario != "reopen":
        assert "nothing of this append was kept" in errors[0]
    acks = [tuple(map(int, line.split()[1:])) for line in lines if line.startswith("ack ")]
    assert lines.index("freed") < lines.index(f"ack {acks[-1][0]} {acks[-1][1]}"), "nothing appended after"
    log, records = read_back(wal_dir)
    assert log.recovery.truncated_bytes == 0
    assert [r.offset for r in records] == list(range(acks[-1][1] + 1))
    assert [r.payload for r in records] == [record(r.offset) for r in records]
    log.close()


def test_wal_under_a_regular_file_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(WalWriteError, match=r"cannot open the WAL in .*not-a-dir/wal: Not a directory"):
        SegmentedLog(str(blocker / "wal"))


def test_read_only_file_system_is_a_clear_error_and_keeps_data(small_tmpfs: Path) -> None:
    wal_dir = small_tmpfs / "wal"
    log = SegmentedLog(str(wal_dir), index_max_bytes=64 * 1024)
    log.append([frames.encode_payloads([b"keep me"] * 3)])
    log.close()
    before = {p.name: p.read_bytes() for p in wal_dir.iterdir()}
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    with pytest.raises(WalWriteError, match="Read-only file system"):
        SegmentedLog(str(wal_dir), index_max_bytes=64 * 1024)
    subprocess.run(["mount", "-o", "remount,rw", str(small_tmpfs)], check=True)
    assert {p.name: p.read_bytes() for p in wal_dir.iterdir()} == before
    log, records = read_back(wal_dir)
    assert [r.payload for r in records] == [b"keep me"] * 3
    log.close()


@pytest.mark.slow
def test_sigkill_while_1000_topics_are_written_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """1,000 WALs on the shared I/O pool, 250 producers appending to them at once, SIGKILL: every topic's log
    holds every append it acknowledged, intact, at contiguous offsets."""
    args = [sys.executable, str(MANY_WRITER), str(tmp_path), "1000", "0"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready"), line + (proc.stderr.read() if proc.stderr else "")
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if len(lines) >= 5000:
            break
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    by_topic: dict[int, list[Ack]] = {}
    complete = [x for x in lines + rest.splitlines(keepends=True) if x.endswith("\n")]  # a kill cuts the last
    for text in [x for x in complete if x.startswith("ack ")]:
        topic, *fields = map(int, text.split()[1:])
        by_topic.setdefault(topic, []).append(Ack(*fields))
    assert len(by_topic) > 500, "the writer should have reached most topics"
    for topic, acks in by_topic.items():
        log, records = read_back(tmp_path / f"t{topic}")
        assert_acked_present(acks, records)
        log.close()

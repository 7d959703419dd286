"""Sealed segments are `.dnb1` objects (docs/FORMAT.md, "Sealed segments"): a segment starts with the object
header, and its roll writes the object's footer after the last batch. Over both cores: what recovery makes
of a footer (valid, damaged, or on the last segment after a crash in the roll), segments written before
segments had a header, and `sealed_object`."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from danube_fast.storage import segments
from danube_fast.storage.objects.format import build_object, parse_footer
from danube_fast.storage.segments import FILE_HEADER
from tests.unit.test_wal_engine import (
    SEGMENT,
    Batches,
    Model,
    assert_all_readable,
    fill,
    frames,
    idx_path,
    log_path,
    open_log,
    sealed_footer,
    wal_impl,
)

__all__ = ["frames", "open_log", "wal_impl"]  # fixtures used here


def sealed(frames: ModuleType, open_log: Callable[..., Any], seed: int, **options: Any) -> tuple[Any, Model]:
    """A log of several segments and its model."""
    gen, model = Batches(frames, seed), Model(frames)
    log = open_log(segment_bytes=SEGMENT, index_interval_bytes=0, **options)
    fill(log, gen, model, 45)
    assert len(log.segment_bases) >= 3
    return log, model


def test_sealed_object_names_each_sealed_segment_and_its_footer(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    log, model = sealed(frames, open_log, 30)
    bases = log.segment_bases
    for base, following in itertools.pairwise(bases):
        path, footer = log.sealed_object(base)
        assert path == str(log_path(tmp_path / "wal", base))
        assert footer == sealed_footer(Path(path), model, base, following)
    assert log.sealed_object(bases[-1]) is None  # the active segment
    assert log.sealed_object(bases[0] + 1) is None  # no segment starts there
    log.close()
    reopened = open_log(segment_bytes=SEGMENT, index_interval_bytes=0)  # footers read back from the files
    for base in bases[:-1]:
        path = log_path(tmp_path / "wal", base)
        assert reopened.sealed_object(base) == (str(path), parse_footer(path.read_bytes()))
    reopened.delete_before(bases[1])
    assert reopened.sealed_object(bases[0]) is None and reopened.sealed_object(bases[1]) is not None


def test_a_crash_between_the_footer_and_the_next_segment_reopens_the_segment_as_active(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path) -> None:
    """The roll writes the footer, fdatasyncs, then creates the next segment: a crash in between leaves the
    sealed segment last. Recovery cuts its footer without calling it damage, and the next roll seals it
    again."""
    d = tmp_path / "wal"
    log, model = sealed(frames, open_log, 31)
    log.roll()
    last = log.segment_bases[-1]
    sealed_base = log.segment_bases[-2]
    log.close()
    log_path(d, last).unlink()
    idx_path(d, last).unlink()
    reopened = open_log(segment_bytes=SEGMENT, index_interval_bytes=0)
    report = reopened.recovery
    assert report.truncated_segment is None and report.padding_bytes == 0
    assert reopened.segment_bases[-1] == sealed_base and reopened.next_offset == model.end
    assert reopened.sealed_object(sealed_base) is None
    assert_all_readable(reopened, model)
    fill(reopened, Batches(frames, 32), model, 2)
    reopened.roll()
    sealed_footer(log_path(d, sealed_base), model, sealed_base, model.end)
    assert reopened.sealed_object(sealed_base) is not None
    assert_all_readable(reopened, model)


def test_a_damaged_footer_is_logged_and_the_segment_read_to_its_last_batch(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "wal"
    log, model = sealed(frames, open_log, 33)
    victim = log.segment_bases[1]
    log.close()
    path = log_path(d, victim)
    data = bytearray(path.read_bytes())
    data[parse_footer(data).body_end + 3] ^= 0x10  # in the footer's fixed part: its CRC fails
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="danube_fast.wal"):
        reopened = open_log(segment_bytes=SEGMENT, index_interval_bytes=0)
    assert any("no valid footer" in r.getMessage() for r in caplog.records)
    assert reopened.sealed_object(victim) is None  # uploaded by copying, not as the file
    assert reopened.recovery.truncated_segment is None
    assert_all_readable(reopened, model)
    assert path.read_bytes() == bytes(data)  # a sealed segment is never cut


@pytest.mark.parametrize("direct", [False, True])
def test_the_first_append_of_a_segment_writes_its_header(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path, direct: bool) -> None:
    """A new segment stays empty until its first append (a roll needs no disk space for it). Reopened empty,
    or holding part of the header only (a power loss before the first fdatasync), it is the same."""
    d = tmp_path / "wal"
    log, model = sealed(frames, open_log, 34, direct_io=direct)
    log.roll()
    last = log.segment_bases[-1]
    assert log_path(d, last).read_bytes() == b""
    log.close()
    for size in (3, 0):
        log_path(d, last).write_bytes(FILE_HEADER[:size])
        reopened = open_log(segment_bytes=SEGMENT, index_interval_bytes=0, direct_io=direct)
        assert reopened.recovery.truncated_segment is None and reopened.segment_bases[-1] == last
        assert log_path(d, last).read_bytes() == b""
        assert_all_readable(reopened, model)
        reopened.close()
    reopened = open_log(segment_bytes=SEGMENT, index_interval_bytes=0, direct_io=direct)
    fill(reopened, Batches(frames, 35), model, 3)
    assert_all_readable(reopened, model)
    reopened.close()
    assert log_path(d, last).read_bytes().startswith(FILE_HEADER)
    again = open_log(segment_bytes=SEGMENT, index_interval_bytes=0)
    assert again.recovery.truncated_segment is None
    assert_all_readable(again, model)


def strip_to_legacy(d: Path) -> None:
    """Rewrite every segment as segments were written before they had a header: batches from byte 0, no
    footer; the indexes removed (recovery rebuilds them)."""
    for p in sorted(d.glob("*.log")):
        data = p.read_bytes()
        end = parse_footer(data).body_end if data.endswith(b"DNB1") else len(data)
        p.write_bytes(data[len(FILE_HEADER):end])
    for p in d.glob("*.idx"):
        p.unlink()


@pytest.mark.parametrize("base", [0, int.from_bytes(FILE_HEADER, "little")])
def test_segments_without_a_header_are_read_appended_to_and_rolled_without_a_footer(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path, base: int) -> None:
    """Segments of an older release: read as they are, the active one appended to; sealed ones are not
    objects (sealed_object None: the uploader copies them). The second base makes an old segment's first 8
    bytes equal the file header (its first batch's base offset)."""
    d = tmp_path / "wal"
    log, model = sealed(frames, open_log, 36, initial_offset=base)
    old = log.segment_bases
    log.close()
    strip_to_legacy(d)
    reopened = open_log(segment_bytes=SEGMENT, index_interval_bytes=0)
    assert reopened.segment_bases == old and reopened.recovery.truncated_segment is None
    assert_all_readable(reopened, model)
    assert all(reopened.sealed_object(b) is None for b in old)
    fill(reopened, Batches(frames, 37), model, 30)  # the old active segment rolls, then new ones
    assert_all_readable(reopened, model)
    bases = reopened.segment_bases
    assert log_path(d, old[-1]).read_bytes()[:8] == old[-1].to_bytes(8, "little")  # still headerless
    assert reopened.sealed_object(old[-1]) is None
    new = bases[len(old)]
    assert log_path(d, new).read_bytes().startswith(FILE_HEADER)
    assert reopened.sealed_object(new) is not None
    reopened.close()
    again = open_log(segment_bytes=SEGMENT, index_interval_bytes=0)
    assert again.recovery.truncated_segment is None and again.recovery.rebuilt_indexes == []
    assert_all_readable(again, model)


def test_the_footer_index_is_the_one_an_uploaded_object_would_have(
        frames: ModuleType, open_log: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every index entry at least the footer's interval after the last one taken (entries_every), as
    build_object picks them from the batches (with every batch indexed, the two must agree)."""
    monkeypatch.setattr(segments, "FOOTER_INDEX_INTERVAL", 300)
    log, model = sealed(frames, open_log, 38)
    bases = log.segment_bases
    for base, following in itertools.pairwise(bases):
        footer = parse_footer(log_path(tmp_path / "wal", base).read_bytes())
        body = b"".join(b.data for b in model.batches if base <= b.base < following)
        assert footer.index == build_object(body, 300).footer.index
        assert len(footer.index) > 2

"""bench storage's helpers that check what they build (bench/micro/disk.py): the indexed log of the lookup
figures points at every batch where the segment layout puts it (after the file header)."""

from __future__ import annotations

from pathlib import Path

from bench.micro import disk


def test_the_indexed_log_of_the_lookup_figures_checks_out(tmp_path: Path) -> None:
    log = disk.build_indexed_log(str(tmp_path / "indexed"), 2_500, 100)
    try:
        assert log.next_offset == 2_500 and len(log.segment_bases) == 1
    finally:
        log.close()

"""Fixtures of the fault tests: a real, small file system to fill."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

IS_ROOT = os.geteuid() == 0


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs: writes past it fail with ENOSPC. Needs root (CI runs as root)."""
    if not IS_ROOT:
        pytest.skip("mounting a tmpfs needs root; test_file_size_limit_fails_appends_cleanly covers the rest")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)

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


@pytest.fixture
def small_ext4(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MiB ext4 on a loop device (it takes O_DIRECT, which tmpfs does not). Needs root."""
    if not IS_ROOT:
        pytest.skip("mounting a loop device needs root")
    image, mnt = tmp_path / "ext4.img", tmp_path / "ext4"
    with open(image, "wb") as f:
        f.truncate(8 * 1024 * 1024)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)

"""The harness's pytest plugin (danube_fast/testing/plugin.py: `run`, etcd, moto, brokers, cluster), the
record-batch codec fixture, and real small file systems to fill (the fault tests, the table writer's)."""

from __future__ import annotations

import importlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

pytest_plugins = ["danube_fast.testing.plugin"]

FRAMES_MODULES = {"native": "danube_fast.codec._frames", "pure": "danube_fast.codec._frames_py"}


@pytest.fixture(scope="session", params=sorted(FRAMES_MODULES))
def frames_impl(request: pytest.FixtureRequest) -> ModuleType:
    """The record-batch codec under test: the Cython module or its pure-Python twin (ids `native`, `pure`).

    Session-scoped so that hypothesis tests may use it (a module holds no per-test state).
    """
    return importlib.import_module(FRAMES_MODULES[request.param])


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

"""Memory defaults from the machine (danube_fast/broker/memory.py): usable memory read from fake /proc and
/sys trees (cgroup v2 with a limit or "max", v1, none), the rule that sizes the three memory settings from
it, and a config file's own values winning over it."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from danube_fast.broker import memory
from danube_fast.broker.config import BrokerConfig, ConfigError, load
from danube_fast.broker.memory import FLOOR, UsableMemory, usable_memory

GiB = 1 << 30
MiB = 1 << 20
PHYSICAL = 64 * GiB
V1_NO_LIMIT = 9223372036854771712  # what v1 shows without a limit (4 KiB pages)


def tree(root: Path, cgroup: str, files: dict[str, str]) -> Path:
    """A fake root: /proc/self/cgroup holding `cgroup`, and `files` (paths under root) with their text."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text + "\n")
    return root


def fixed(nbytes: int, source: str = "cgroup v2 limit in /sys/fs/cgroup/memory.max") -> UsableMemory:
    return UsableMemory(nbytes, source)


def sizes(config: BrokerConfig) -> tuple[int, int, int]:
    return config.wal.cache_total_bytes, config.dispatch.broker_bytes, config.malloc_keep_bytes


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return str(path)


# Reading the limits.

def test_cgroup_v2_limit_of_the_process_own_cgroup(tmp_path: Path) -> None:
    root = tree(tmp_path, "0::/system.slice/broker.service\n", {
        "sys/fs/cgroup/system.slice/broker.service/memory.max": str(GiB),
        "sys/fs/cgroup/system.slice/memory.max": "max"})
    assert usable_memory(root, PHYSICAL) == UsableMemory(
        GiB, "cgroup v2 limit in /sys/fs/cgroup/system.slice/broker.service/memory.max")


def test_cgroup_v2_limit_of_a_parent_holds_its_children(tmp_path: Path) -> None:
    root = tree(tmp_path, "0::/brokers.slice/one\n", {
        "sys/fs/cgroup/brokers.slice/one/memory.max": "max",
        "sys/fs/cgroup/brokers.slice/memory.max": str(2 * GiB)})
    assert usable_memory(root, PHYSICAL) == UsableMemory(
        2 * GiB, "cgroup v2 limit in /sys/fs/cgroup/brokers.slice/memory.max")


def test_cgroup_v2_in_a_container_namespace(tmp_path: Path) -> None:
    """A container with its own cgroup namespace sees itself at "/", its limit at the mount's root; one
    without sees a host path that its mount does not have, and the mount's root is still its own cgroup."""
    for cgroup, name in (("0::/\n", "ns"), ("0::/docker/0123abcd\n", "host-path")):
        root = tree(tmp_path / name, cgroup, {"sys/fs/cgroup/memory.max": str(512 * MiB)})
        assert usable_memory(root, PHYSICAL) == UsableMemory(
            512 * MiB, "cgroup v2 limit in /sys/fs/cgroup/memory.max")


def test_cgroup_v2_max_is_no_limit(tmp_path: Path) -> None:
    root = tree(tmp_path, "0::/user.slice\n", {"sys/fs/cgroup/user.slice/memory.max": "max"})
    assert usable_memory(root, PHYSICAL) == UsableMemory(PHYSICAL, "physical memory")


def test_a_limit_above_physical_memory_leaves_physical_memory(tmp_path: Path) -> None:
    root = tree(tmp_path, "0::/big\n", {"sys/fs/cgroup/big/memory.max": str(2 * PHYSICAL)})
    assert usable_memory(root, PHYSICAL) == UsableMemory(PHYSICAL, "physical memory")


def test_cgroup_v1_memory_controller(tmp_path: Path) -> None:
    cgroup = "5:devices:/\n4:memory:/process_api/abc\n3:cpu,cpuacct:/\n1:name=systemd:/\n0::/\n"
    root = tree(tmp_path, cgroup, {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": str(V1_NO_LIMIT),
        "sys/fs/cgroup/memory/process_api/memory.limit_in_bytes": str(V1_NO_LIMIT),
        "sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes": str(768 * MiB)})
    assert usable_memory(root, PHYSICAL) == UsableMemory(
        768 * MiB, "cgroup v1 limit in /sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes")


def test_cgroup_v1_with_controllers_joined_and_no_limit(tmp_path: Path) -> None:
    root = tree(tmp_path, "2:cpu,memory:/job\n", {
        "sys/fs/cgroup/memory/job/memory.limit_in_bytes": str(V1_NO_LIMIT)})
    assert usable_memory(root, PHYSICAL) == UsableMemory(PHYSICAL, "physical memory")
    found = usable_memory(root, None)  # this machine's physical memory: the no-limit value is never a limit
    assert found is not None and found.source == "physical memory"


def test_v1_and_v2_together_take_the_smaller(tmp_path: Path) -> None:
    root = tree(tmp_path, "4:memory:/a\n0::/b\n", {
        "sys/fs/cgroup/memory/a/memory.limit_in_bytes": str(3 * GiB),
        "sys/fs/cgroup/b/memory.max": str(5 * GiB)})
    assert usable_memory(root, PHYSICAL) == UsableMemory(
        3 * GiB, "cgroup v1 limit in /sys/fs/cgroup/memory/a/memory.limit_in_bytes")


def test_no_cgroup_is_physical_memory(tmp_path: Path) -> None:
    assert usable_memory(tmp_path, PHYSICAL) == UsableMemory(PHYSICAL, "physical memory")
    root = tree(tmp_path / "host", "0::/\n", {"sys/fs/cgroup/cgroup.controllers": "memory"})
    assert usable_memory(root, PHYSICAL) == UsableMemory(PHYSICAL, "physical memory")


def test_unreadable_limits_are_skipped(tmp_path: Path) -> None:
    root = tree(tmp_path, "0::/odd\n", {"sys/fs/cgroup/odd/memory.max": "lots"})
    (root / "sys/fs/cgroup/memory.max").mkdir()  # a directory where a file was expected
    assert usable_memory(root, PHYSICAL) == UsableMemory(PHYSICAL, "physical memory")


def test_physical_memory_from_sysconf(tmp_path: Path) -> None:
    expected = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert usable_memory(tmp_path) == UsableMemory(expected, "physical memory")
    found = usable_memory()  # this machine, its real cgroups
    assert found is not None and 0 < found.nbytes <= expected


def test_nothing_known(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_such_name(name: str) -> int:
        raise ValueError(f"unrecognized configuration name {name}")

    monkeypatch.setattr(os, "sysconf", no_such_name)
    assert usable_memory(tmp_path) is None
    assert usable_memory(tree(tmp_path / "c", "0::/\n", {"sys/fs/cgroup/memory.max": str(GiB)})) == fixed(GiB)


# The rule.

def test_plenty_of_memory_keeps_the_defaults() -> None:
    """From 4 GiB up, the defaults every benchmark ran with: 1 GiB, 256 MiB, 256 MiB."""
    for nbytes in (4 * GiB, 23 * GiB + 512 * MiB, 1 << 40):
        config = load(None, {}, usable=lambda n=nbytes: fixed(n, "physical memory"))
        assert config == BrokerConfig()
        assert sizes(config) == (GiB, 256 * MiB, 256 * MiB)


def test_small_memory_lowers_them() -> None:
    assert sizes(load(None, {}, usable=lambda: fixed(GiB))) == (256 * MiB, 64 * MiB, 64 * MiB)
    assert sizes(load(None, {}, usable=lambda: fixed(2 * GiB))) == (512 * MiB, 128 * MiB, 128 * MiB)
    config = load(None, {}, usable=lambda: fixed(GiB))  # the rest as it was
    assert config.wal.cache_bytes == GiB and config.dispatch.window_bytes == 16 * MiB


def test_tiny_memory_stops_at_the_floor() -> None:
    assert sizes(load(None, {}, usable=lambda: fixed(128 * MiB))) == (32 * MiB, FLOOR, FLOOR)
    assert sizes(load(None, {}, usable=lambda: fixed(16 * MiB))) == (FLOOR, FLOOR, FLOOR)


def test_unknown_memory_keeps_the_defaults() -> None:
    assert load(None, {}, usable=lambda: None) == BrokerConfig()


def test_the_limits_read_from_a_tree_size_the_config(tmp_path: Path) -> None:
    root = tree(tmp_path, "0::/\n", {"sys/fs/cgroup/memory.max": str(GiB)})
    config = load(None, {}, usable=lambda: usable_memory(root, PHYSICAL))
    assert sizes(config) == (256 * MiB, 64 * MiB, 64 * MiB)


# Explicit settings win.

def test_a_config_file_setting_a_value_keeps_it(tmp_path: Path) -> None:
    path = write(tmp_path, "[broker]\nmalloc_keep_bytes = 0\n[wal]\ncache_total_bytes = 2147483648\n"
                           "[dispatch]\nbroker_bytes = 65536\n")
    assert sizes(load(path, {}, usable=lambda: fixed(GiB))) == (2 * GiB, 65536, 0)
    assert sizes(load(path, {}, usable=lambda: fixed(PHYSICAL))) == (2 * GiB, 65536, 0)


def test_each_setting_is_sized_unless_it_is_set(tmp_path: Path) -> None:
    path = write(tmp_path, "[wal]\ncache_total_bytes = 100000000\n")
    assert sizes(load(path, {}, usable=lambda: fixed(GiB))) == (100_000_000, 64 * MiB, 64 * MiB)


def test_auto_in_the_file_is_the_default(tmp_path: Path) -> None:
    path = write(tmp_path, '[broker]\nmalloc_keep_bytes = "auto"\n[wal]\ncache_total_bytes = "auto"\n'
                           '[dispatch]\nbroker_bytes = "auto"\n')
    assert load(path, {}, usable=lambda: fixed(GiB)) == load(None, {}, usable=lambda: fixed(GiB))


def test_a_flag_wins_too() -> None:
    config = load(None, {"malloc_keep_bytes": 8 * MiB}, usable=lambda: fixed(GiB))
    assert sizes(config) == (256 * MiB, 64 * MiB, 8 * MiB)


@pytest.mark.parametrize("text", ['[wal]\ncache_total_bytes = "big"\n',
                                  '[dispatch]\nbroker_bytes = "AUTO"\n'])
def test_another_word_is_refused_naming_auto(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match='must be int or "auto"'):
        load(write(tmp_path, text), {}, usable=lambda: fixed(GiB))


def test_an_explicit_value_is_still_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="malloc_keep_bytes"):
        load(write(tmp_path, "[broker]\nmalloc_keep_bytes = 2147483648\n"), {}, usable=lambda: fixed(GiB))


def test_a_table_commit_is_sized_like_the_other_budgets(tmp_path: Path) -> None:
    assert load(None, {}, usable=lambda: fixed(GiB)).tables.commit_bytes == 64 * MiB
    assert load(None, {}, usable=lambda: fixed(64 * GiB)).tables.commit_bytes == 256 * MiB
    assert load(None, {}, usable=lambda: fixed(64 * MiB)).tables.commit_bytes == 16 * MiB  # the floor
    path = write(tmp_path, '[tables]\ncommit_bytes = "auto"\n')
    assert load(path, {}, usable=lambda: fixed(2 * GiB)).tables.commit_bytes == 128 * MiB
    path = write(tmp_path, "[tables]\ncommit_bytes = 8388608\n")
    assert load(path, {}, usable=lambda: fixed(2 * GiB)).tables.commit_bytes == 8 * MiB


# The log line.

def test_one_line_says_what_was_chosen_and_from_which_limit(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path, "[dispatch]\nbroker_bytes = 100663296\n")
    with caplog.at_level(logging.INFO, logger="danube_fast.broker"):
        load(path, {}, usable=lambda: fixed(GiB))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("memory:")]
    assert lines == ["memory: 1 GiB usable (cgroup v2 limit in /sys/fs/cgroup/memory.max); sized from it: "
                     "[wal] cache_total_bytes = 256 MiB, [broker] malloc_keep_bytes = 64 MiB, "
                     "[tables] commit_bytes = 64 MiB, [broker] fast_inflight_bytes = 64 MiB; "
                     "as configured: [dispatch] broker_bytes = 96 MiB"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="danube_fast.broker"):
        load(None, {}, usable=lambda: None)
    assert [r.getMessage() for r in caplog.records] == [
        "memory: usable memory unknown; defaults: [wal] cache_total_bytes = 1 GiB, [dispatch] broker_bytes = "
        "256 MiB, [broker] malloc_keep_bytes = 256 MiB, [tables] commit_bytes = 256 MiB, "
        "[broker] fast_inflight_bytes = 256 MiB"]


def test_sizes_for_the_log() -> None:
    assert [memory.size(n) for n in (GiB, 256 * MiB, 23 * GiB + 512 * MiB, 1536, 100)] == [
        "1 GiB", "256 MiB", "23.5 GiB", "1.5 KiB", "100 B"]

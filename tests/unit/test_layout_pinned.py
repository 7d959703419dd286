"""The record layout is written once (docs/FORMAT.md, and the positions of _frames.pxd): the pure-Python twin
derives its positions from its own structs, and this test pins them to the native module's."""

from __future__ import annotations

import pytest

from danube_fast.codec import _frames_py

native = pytest.importorskip("danube_fast.codec._frames")


def test_the_twin_has_the_native_positions() -> None:
    assert _frames_py.LAYOUT == native.LAYOUT


def test_the_header_positions_follow_each_other() -> None:
    """Each header field starts where the one before it ends, and the CRC covers everything after itself."""
    layout = native.LAYOUT
    order = ["base_offset", "crc", "batch_length", "magic", "version", "flags", "record_count",
             "base_timestamp", "max_timestamp", "producer_id", "producer_name_len", "broker_addr_len",
             "raw_size", "header"]
    sizes = [8, 4, 4, 1, 1, 2, 4, 8, 8, 8, 2, 2, 4]
    assert [layout[name] for name in order] == [sum(sizes[:i]) for i in range(len(order))]
    assert layout["header"] == native.HEADER_SIZE == 56
    assert layout["crc_from"] == layout["crc"] + 4

"""The .dnb1 object format: round trip, footer checks, the sparse index and batch selection."""

from __future__ import annotations

import struct

import pytest

from danube_fast.codec import frames
from danube_fast.errors import FrameCorrupt, ObjectCorrupt
from danube_fast.storage.objects.format import (
    FOOTER_FIXED_SIZE,
    HEADER_SIZE,
    TRAILER_SIZE,
    build_object,
    check_header,
    clip_batches,
    footer_length,
    parse_footer,
    scan_body,
    select_batches,
)
from tests.tier.helpers import seq_of, stamped_body

pytestmark = pytest.mark.timeout(30)


def test_round_trip_keeps_the_body_verbatim_and_describes_it() -> None:
    body = stamped_body(100, 50)
    built = build_object(body, index_interval=1000)
    data, footer = built.data, built.footer
    check_header(data)
    assert data[HEADER_SIZE : footer.body_end] == body
    assert footer.body_end == HEADER_SIZE + len(body) and footer.object_size == len(data)
    assert (footer.min_offset, footer.max_offset, footer.batch_count) == (100, 299, 50)
    # A batch's records share one publish time here: the largest is the last batch's.
    assert (footer.min_time, footer.max_time) == (1_700_000_000_100, 1_700_000_000_296)
    assert parse_footer(data) == footer
    assert parse_footer(data[-footer_length(data):]) == footer  # the tail alone is enough
    # One index entry per 1000 bytes or more of batches, each at a real batch boundary.
    headers = frames.scan_batches(body)
    starts = {HEADER_SIZE + h.position: h.base_offset for h in headers}
    assert footer.index[0] == (100, HEADER_SIZE)
    assert all(starts[pos] == offset for offset, pos in footer.index)
    gaps = [b[1] - a[1] for a, b in zip(footer.index, footer.index[1:], strict=False)]
    assert gaps and all(1000 <= g < 1000 + headers[0].length for g in gaps)
    records = frames.decode_records(data[HEADER_SIZE : footer.body_end])
    assert [r.offset for r in records] == list(range(100, 300))
    assert [seq_of(r.payload) for r in records] == list(range(100, 300))


def test_a_flipped_footer_bit_is_detected_by_the_crc() -> None:
    built = build_object(stamped_body(0, 20), index_interval=256)
    body_end = built.footer.body_end
    for pos in (body_end, body_end + 9, body_end + FOOTER_FIXED_SIZE + 3, len(built.data) - TRAILER_SIZE - 1):
        damaged = bytearray(built.data)
        damaged[pos] ^= 0x10
        with pytest.raises(ObjectCorrupt, match="CRC32C"):
            parse_footer(damaged)


def test_a_damaged_trailer_or_header_is_refused() -> None:
    data = build_object(stamped_body(0, 3)).data
    bad_magic = data[:-1] + b"X"
    with pytest.raises(ObjectCorrupt, match="trailer"):
        parse_footer(bad_magic)
    bad_length = data[:-TRAILER_SIZE] + struct.pack("<I4s", len(data) * 2, b"DNB1")
    with pytest.raises(ObjectCorrupt, match="needs the last"):
        parse_footer(bad_length)
    with pytest.raises(ObjectCorrupt, match="trailer"):
        parse_footer(data[-5:])
    with pytest.raises(ObjectCorrupt, match="dnb1"):
        check_header(b"DNB2" + data[4:])


def test_building_refuses_a_corrupt_or_gapped_body() -> None:
    body = bytearray(stamped_body(0, 3))
    body[100] ^= 1
    with pytest.raises(FrameCorrupt):
        build_object(body)
    gapped = stamped_body(0, 2) + stamped_body(20, 1)
    with pytest.raises(ValueError, match="contiguous"):
        build_object(gapped)
    with pytest.raises(ValueError, match="at least one batch"):
        build_object(b"")


def test_select_batches_from_an_index_position() -> None:
    body = stamped_body(0, 40)  # offsets 0..159, 4 per batch
    built = build_object(body, index_interval=800)
    offset, pos = built.footer.index[2]
    # A ranged read from an index position to the body's end, as the tiered reader does.
    rng = memoryview(built.data)[pos : built.footer.body_end]
    headers = scan_body(rng)
    assert headers[0].base_offset == offset
    got = select_batches(rng, headers, offset + 5, max_bytes=1)  # at least one whole batch
    assert got is not None
    data, nxt = got
    assert frames.span(data) == (offset + 4, offset + 8) and nxt == offset + 8
    data, nxt = select_batches(rng, headers, offset + 6, max_bytes=3 * headers[0].length) or (b"", 0)
    assert frames.span(data) == (offset + 4, offset + 16) and nxt == offset + 16
    data, nxt = select_batches(rng, headers, 0, max_bytes=1 << 30) or (b"", 0)  # below the range: its start
    assert frames.span(data) == (offset, 160) and nxt == 160
    assert select_batches(rng, headers, 160, max_bytes=1 << 20) is None


def test_scan_body_reports_damage_as_object_corrupt() -> None:
    body = bytearray(stamped_body(0, 3))
    body[-1] ^= 0xFF
    with pytest.raises(ObjectCorrupt, match="fail validation"):
        scan_body(body)


def test_clip_batches_keeps_what_an_object_may_hold() -> None:
    body = stamped_body(0, 10)  # offsets 0..39, 4 per batch
    size = len(body) // 10
    view, nxt = clip_batches(body, 9, 30, room=1 << 20, whole=True)  # from the batch holding 9, below 30
    assert frames.span(view) == (8, 32) and nxt == 32
    view, nxt = clip_batches(body, 8, 40, room=2 * size, whole=False)
    assert frames.span(view) == (8, 16) and nxt == 16
    view, nxt = clip_batches(body, 8, 40, room=1, whole=True)  # an object holds at least one batch
    assert frames.span(view) == (8, 12) and nxt == 12
    view, nxt = clip_batches(body, 8, 40, room=1, whole=False)
    assert len(view) == 0 and nxt == 8

"""Objects built from chunks and stored as parts: the same bytes as a build from one buffer, CRC verification
optional when building but not when reading, and the folder store's writev (IOV_MAX, short writes)."""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from danube_fast.codec import frames
from danube_fast.errors import FrameCorrupt, ObjectCorrupt
from danube_fast.storage.objects import folder
from danube_fast.storage.objects.format import HEADER_SIZE, Buffer, build_object, parse_footer, scan_body
from tests.tier.conftest import Backend
from tests.tier.helpers import stamped_body

pytestmark = pytest.mark.timeout(60)
Run = Callable[..., Any]


def split(body: bytes | bytearray, batch_cuts: Sequence[int]) -> list[Buffer]:
    """`body` cut before the batches numbered in `batch_cuts`: views, a copy and an empty chunk, mixed."""
    headers = frames.scan_batches(body, verify=False)
    bounds = [0, *(headers[i].position for i in batch_cuts), len(body)]
    view = memoryview(body)
    chunks: list[Buffer] = [view[a:b] for a, b in itertools.pairwise(bounds)]
    chunks[1] = bytes(chunks[1])
    chunks.insert(2, b"")
    return chunks


def test_chunks_build_the_same_bytes_as_one_buffer() -> None:
    body = stamped_body(100, 60)
    one = build_object(body, index_interval=700)
    # The bytes the object format had before objects were built from parts (the single-buffer build).
    assert hashlib.sha256(one.data).hexdigest() == \
        "1f28eebd13548ef446c690a94bdbb905183498fcc941e428a969abf0121e7656"
    assert one.size == len(one.data) == 21268
    chunks = split(body, [7, 8, 31])  # index entries fall in several chunks, one chunk is a single batch
    for verify in (True, False):
        built = build_object(chunks, index_interval=700, verify=verify)
        assert built.footer == one.footer and len(built.footer.index) > 3
        assert built.size == one.size and built.data == one.data
        assert b"".join(built.parts) == one.data
        body_parts = built.parts[1:-1]  # the chunks themselves, not copies; the empty one dropped
        assert len(body_parts) == 4 and all(p is c for p, c in zip(body_parts, [chunks[0], chunks[1],
                                                                               chunks[3], chunks[4]],
                                                                    strict=True))
    single = build_object(body, index_interval=700, verify=False)
    assert single.data == one.data and len(single.parts) == 3


def test_a_bad_crc_fails_a_verified_build_only_and_is_caught_when_read() -> None:
    body = bytearray(stamped_body(0, 10))
    victim = frames.scan_batches(body)[6]
    body[victim.end - 3] ^= 0x40  # a payload byte: the framing is intact
    chunks = split(body, [4, 5])
    with pytest.raises(FrameCorrupt) as info:
        build_object(chunks, verify=True)
    assert info.value.position == victim.position  # counted from the body's start, not the chunk's
    built = build_object(chunks, verify=False)
    assert parse_footer(built.data) == built.footer
    stored_body = memoryview(built.data)[HEADER_SIZE : built.footer.body_end]
    with pytest.raises(FrameCorrupt):
        frames.decode_records(stored_body)
    with pytest.raises(ObjectCorrupt, match="fail validation"):
        scan_body(stored_body)  # what the tiered reader does with every range it reads


def test_structure_is_checked_without_verification() -> None:
    body = stamped_body(0, 10)
    headers = frames.scan_batches(body)
    bad_magic = bytearray(body)
    bad_magic[headers[7].position + 16] = 0
    with pytest.raises(FrameCorrupt) as info:
        build_object(split(bad_magic, [4, 5]), verify=False)
    assert info.value.position == headers[7].position
    torn = [body[: headers[3].position + 10], body[headers[3].position + 10 :]]
    with pytest.raises(FrameCorrupt):
        build_object(torn, verify=False)
    gapped = [stamped_body(0, 2), stamped_body(20, 1)]
    with pytest.raises(ValueError, match="contiguous"):
        build_object(gapped, verify=False)
    for empty in ([], [b""], b""):
        with pytest.raises(ValueError, match="at least one batch"):
            build_object(empty, verify=False)


def test_put_parts_stores_their_concatenation(backend: Backend, run: Run) -> None:
    # More parts than one writev takes (IOV_MAX, 1024 on Linux), of every buffer kind, some empty.
    parts: list[Buffer] = []
    for i in range(2500):
        chunk = bytes([i % 251]) * (i % 7)
        parts.append(chunk if i % 3 else memoryview(bytearray(chunk)) if i % 2 else bytearray(chunk))
    expected = b"".join(parts)

    async def main() -> None:
        store = await backend.open()
        etag = await store.put_parts("ns/t/data-0-9.dnb1", parts)
        assert (etag is None) == (backend.name == "folder")
        assert await store.get("ns/t/data-0-9.dnb1") == expected
        assert await store.list("ns/") == ["ns/t/data-0-9.dnb1"]
        await store.close()

    run(main())


def test_folder_writes_resume_after_short_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_writev = os.writev
    calls: list[int] = []

    def short_writev(fd: int, buffers: Sequence[Buffer]) -> int:
        """Writes at most 7 bytes, possibly from several buffers, as a short writev does."""
        assert 0 < len(buffers) <= folder._IOV_MAX
        calls.append(len(buffers))
        head = b"".join(bytes(b) for b in buffers[:3])[:7]
        return real_writev(fd, [head])

    parts: list[Buffer] = [os.urandom(i % 11) for i in range(3000)]
    monkeypatch.setattr(os, "writev", short_writev)
    path = tmp_path / "object.dnb1"
    folder._write_atomic(str(path), parts)
    monkeypatch.undo()
    assert path.read_bytes() == b"".join(parts)
    assert len(calls) >= len(path.read_bytes()) // 7 and max(calls) == folder._IOV_MAX
    assert os.listdir(tmp_path) == ["object.dnb1"]

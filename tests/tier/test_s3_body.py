"""PartsBody (storage/objects/s3_body.py): an S3 put's body read from its parts in place."""

from __future__ import annotations

import io
import os

import pytest

from danube_fast.storage.objects.s3_body import PartsBody


def test_reads_the_parts_one_after_another_in_any_read_size() -> None:
    parts = [os.urandom(1000), b"", bytearray(os.urandom(7)), memoryview(os.urandom(4096))]
    whole = b"".join(parts)
    for size in (1, 3, 999, 1000, 1001, 4096, 1 << 20):
        body = PartsBody(parts)
        got = b""
        while chunk := body.read(size):
            assert len(chunk) <= size
            got += chunk
        assert got == whole
        assert body.tell() == len(whole) and body.read(10) == b""


def test_seeks_as_botocore_measures_and_rewinds_it() -> None:
    parts = [b"abc", b"defg", b"h"]
    body = PartsBody(parts)
    assert body.seekable() and body.readable() and not body.writable()
    assert body.seek(0, io.SEEK_END) == 8 and body.tell() == 8
    assert body.seek(0) == 0 and body.read() == b"abcdefgh"
    assert body.seek(2) == 2 and body.read(3) == b"cde"
    assert body.seek(-1, io.SEEK_CUR) == 4 and body.read() == b"efgh"
    assert body.seek(20) == 20 and body.read() == b""  # past the end reads nothing, as a file does
    with pytest.raises(ValueError, match="negative seek position"):
        body.seek(-1)
    with pytest.raises(ValueError, match="invalid whence"):
        body.seek(0, 7)


def test_an_empty_body() -> None:
    body = PartsBody([b"", b""])
    assert body.read() == b"" and body.seek(0, io.SEEK_END) == 0

"""Batch compression (docs/FORMAT.md#compression) in the native codec and its twin: round trips, batches one
implementation compressed decoded by the other, old (uncompressed) batches beside compressed ones, and every
way a compressed batch can be wrong failing as FrameCorrupt at its position."""

from __future__ import annotations

import random
import struct
from types import ModuleType
from typing import Any

import pytest

from danube_fast.errors import FrameCorrupt
from tests.unit.test_frames import (
    CORRUPT_INPUTS,
    arrow_columns,
    assert_corrupt_at,
    assert_only_frame_corrupt,
    both_impls,
    decoders,
    header_tuple,
    impl_name,
    mutate,
    record_tuple,
    refresh_crc,
)

CODECS = ["zstd", "lz4"]
CROSS_CHECKS = 1000
FLAGS, NAME_LEN, ADDR_LEN, RAW_SIZE = 18, 48, 50, 52
WORDS = ["order", "customer", "amount", "currency", "EUR", "status", "shipped", "pending", "sku", "qty"]


def text_like(rng: random.Random, size: int) -> bytes:
    """A JSON-ish payload: repetitive enough to compress, different in every record."""
    parts = []
    while sum(len(p) for p in parts) < size:
        parts.append(f'"{rng.choice(WORDS)}": {rng.randint(0, 99999)}, ')
    return "".join(parts).encode()[:size]


def records(frames: ModuleType, rng: random.Random, count: int,
            sizes: tuple[int, ...] = (0, 40, 300)) -> list[Any]:
    return [
        frames.Record(
            text_like(rng, rng.choice(sizes)),
            publish_time=1_700_000_000_000 + rng.randint(0, 5000),
            request_id=rng.choice([0, rng.getrandbits(64)]),
            routing_key=rng.choice([None, "", "key-7", "clé"]),
            attributes=rng.choice([None, {"a": "1"}, {"ключ": "", "": "значение"}]),
            schema_id=rng.choice([None, rng.getrandbits(64)]),
            schema_version=rng.choice([None, rng.getrandbits(32)]),
        )
        for _ in range(count)
    ]


def compressed_batch(frames: ModuleType, rng: random.Random, codec: str, count: int = 20,
                     base_offset: int = 0) -> bytes:
    data: bytes = frames.encode_batch(records(frames, rng, count, (300, 600)), producer_id=7,
                                      producer_name="p-1", broker_addr="10.0.0.1:6650",
                                      base_offset=base_offset, compression=codec)
    assert frames.parse_header(data).compression == codec
    return data


def head_of(data: bytes | bytearray, position: int = 0) -> int:
    name_len, addr_len = struct.unpack_from("<HH", data, position + NAME_LEN)
    return int(56 + name_len + addr_len)


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_keeps_every_field_and_shrinks_the_batch(frames_impl: ModuleType, codec: str) -> None:
    rng = random.Random(1)
    recs = records(frames_impl, rng, 50)
    plain = frames_impl.encode_batch(recs, producer_id=7, producer_name="p-1", base_offset=100)
    packed = frames_impl.encode_batch(recs, producer_id=7, producer_name="p-1", base_offset=100,
                                      compression=codec)
    assert len(packed) < len(plain) * 0.7
    header = frames_impl.verify_batch(packed)
    assert (header.compression, header.raw_size) == (codec, len(plain) - head_of(plain))
    assert header.record_count == 50 and header.length == len(packed)
    assert [record_tuple(r) for r in frames_impl.decode_records(packed)] == \
        [record_tuple(r) for r in frames_impl.decode_records(plain)]
    assert [record_tuple(r) for r in frames_impl.iter_records(packed)] == \
        [record_tuple(r) for r in frames_impl.decode_records(plain)]
    assert arrow_columns(frames_impl.decode_arrow(packed)) == arrow_columns(frames_impl.decode_arrow(plain))
    assert frames_impl.span(packed) == (100, 150)


@pytest.mark.parametrize("codec", CODECS)
def test_encode_payloads_compresses_too(frames_impl: ModuleType, codec: str) -> None:
    rng = random.Random(2)
    payloads = [text_like(rng, 256) for _ in range(100)]
    packed = frames_impl.encode_payloads(payloads, publish_time=5, compression=codec, producer_name="p")
    assert frames_impl.parse_header(packed).compression == codec
    assert [r.payload for r in frames_impl.decode_records(packed)] == payloads
    assert frames_impl.decode_arrow(packed).column("value").to_pylist() == payloads


def test_a_batch_that_would_shrink_less_than_an_eighth_stays_uncompressed(frames_impl: ModuleType) -> None:
    rng = random.Random(3)
    payloads = [rng.randbytes(200) for _ in range(5)]
    for codec in CODECS:
        data = frames_impl.encode_payloads(payloads, compression=codec)
        assert data == frames_impl.encode_payloads(payloads)
        assert frames_impl.parse_header(data).compression == "none"


def test_zstd_levels_and_bad_arguments(frames_impl: ModuleType) -> None:
    rng = random.Random(4)
    payloads = [text_like(rng, 256) for _ in range(200)]
    fast = frames_impl.encode_payloads(payloads, compression="zstd", level=1)
    small = frames_impl.encode_payloads(payloads, compression="zstd", level=19)
    assert len(small) <= len(fast)
    assert frames_impl.decode_records(small) == frames_impl.decode_records(fast)
    assert frames_impl.encode_payloads(payloads, compression=None) == frames_impl.encode_payloads(payloads)
    with pytest.raises(ValueError, match="unknown compression 'gzip'"):
        frames_impl.encode_payloads(payloads, compression="gzip")
    with pytest.raises(ValueError, match="zstd level"):
        frames_impl.encode_payloads(payloads, compression="zstd", level=99)


@pytest.mark.parametrize("codec", CODECS)
def test_batches_compressed_by_one_implementation_decode_in_the_other_across_impls(codec: str) -> None:
    native, pure = both_impls()
    for maker, reader in ((native, pure), (pure, native)):
        rng = random.Random(5)
        data = compressed_batch(maker, rng, codec, base_offset=40)
        expected = [record_tuple(r) for r in maker.decode_records(data)]
        assert [record_tuple(r) for r in reader.decode_records(data)] == expected
        assert arrow_columns(reader.decode_arrow(data)) == arrow_columns(maker.decode_arrow(data))
        assert header_tuple(reader.verify_batch(data)) == header_tuple(maker.verify_batch(data))
        assert reader.verify_batch(data).raw_size == maker.verify_batch(data).raw_size


def test_compressed_and_old_batches_mix_in_one_buffer(frames_impl: ModuleType) -> None:
    """What a WAL segment or an object holds after a producer turned compression on: every decoder gives the
    same records as for the same batches uncompressed, offsets stamped in place."""
    rng = random.Random(6)
    parts, plain_parts, offset = [], [], 0
    for codec in ["none", "zstd", "none", "lz4", "zstd"]:
        recs = records(frames_impl, rng, rng.randint(1, 30))
        parts.append(bytearray(frames_impl.encode_batch(recs, compression=codec, producer_name="x")))
        plain_parts.append(bytearray(frames_impl.encode_batch(recs, producer_name="x")))
        frames_impl.stamp_base_offset(parts[-1], offset)
        frames_impl.stamp_base_offset(plain_parts[-1], offset)
        offset += len(recs)
    buf, plain = b"".join(parts), b"".join(plain_parts)
    assert [h.compression for h in frames_impl.scan_batches(buf)] == ["none", "zstd", "none", "lz4", "zstd"]
    assert frames_impl.span(buf) == (0, offset)
    for verify in (True, False):
        assert [record_tuple(r) for r in frames_impl.decode_records(buf, verify)] == \
            [record_tuple(r) for r in frames_impl.decode_records(plain)]
        assert arrow_columns(frames_impl.decode_arrow(buf, verify)) == \
            arrow_columns(frames_impl.decode_arrow(plain))


def set_field(data: bytes, fmt: str, position: int, value: int) -> bytearray:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, position, value)
    refresh_crc_at(buf)
    return buf


def refresh_crc_at(buf: bytearray) -> None:
    native, _ = both_impls()
    refresh_crc(native, buf, 0)


@pytest.mark.parametrize("codec", CODECS)
def test_a_wrong_header_fails_even_with_a_valid_crc(frames_impl: ModuleType, codec: str) -> None:
    data = compressed_batch(frames_impl, random.Random(7), codec)
    raw_size = frames_impl.parse_header(data).raw_size
    plain = frames_impl.encode_payloads([b"x" * 10])
    bad = {
        "raw_size one short": set_field(data, "<I", RAW_SIZE, raw_size - 1),
        "raw_size one long": set_field(data, "<I", RAW_SIZE, raw_size + 1),
        "raw_size 0": set_field(data, "<I", RAW_SIZE, 0),
        "raw_size beyond the batch limit": set_field(data, "<I", RAW_SIZE, (1 << 26)),
        "unknown codec 3": set_field(data, "<H", FLAGS, 3),
        "unknown codec 7": set_field(data, "<H", FLAGS, 7),
        "a flag bit beside the codec": set_field(data, "<H", FLAGS, 8 | (1 if codec == "zstd" else 2)),
        "the other codec": set_field(data, "<H", FLAGS, 2 if codec == "zstd" else 1),
        "raw_size in an uncompressed batch": set_field(plain, "<I", RAW_SIZE, 5),
        "codec on an uncompressed batch": set_field(plain, "<H", FLAGS, 1 if codec == "zstd" else 2),
    }
    for name, buf in bad.items():
        try:
            assert_corrupt_at(frames_impl, bytes(buf), 0)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e
        with pytest.raises(FrameCorrupt):
            frames_impl.verify_batch(bytes(buf))


@pytest.mark.parametrize("codec", CODECS)
def test_records_that_decompress_but_do_not_walk_fail(frames_impl: ModuleType, codec: str) -> None:
    """A compressor fed bad records (a producer's bug) gives a batch whose CRC and decompression pass: the
    record walk after decompression catches it, so the WAL never stores it."""
    plain = bytearray(frames_impl.encode_payloads([b"a" * 100] * 10, producer_name="p"))
    head = head_of(plain)
    struct.pack_into("<I", plain, head, 10_000)  # the first record's length overruns the batch
    refresh_crc(frames_impl, plain, 0)
    first = frames_impl.encode_payloads([b"ok"] * 3)
    with pytest.raises(FrameCorrupt):
        frames_impl.verify_batch(bytes(plain))
    packed = raw_compress(codec, bytes(plain))
    assert_corrupt_at(frames_impl, first + packed, len(first))


def raw_compress(codec: str, batch: bytes) -> bytes:
    """`batch` compressed without the encoder's checks, as a buggy or hostile producer would send it."""
    import pyarrow as pa

    head = head_of(batch)
    packed = pa.Codec("zstd" if codec == "zstd" else "lz4_raw").compress(batch[head:], asbytes=True)
    out = bytearray(batch[:head]) + packed
    struct.pack_into("<H", out, FLAGS, 1 if codec == "zstd" else 2)
    struct.pack_into("<I", out, RAW_SIZE, len(batch) - head)
    struct.pack_into("<I", out, 12, len(out))
    refresh_crc_at(out)
    return bytes(out)


def test_mutated_compressed_batches_never_crash(frames_impl: ModuleType) -> None:
    """Bytes of the compressed block changed and the CRC fixed up: the decompressor and the record walk must
    reject (or accept) them with FrameCorrupt and nothing else; the CRC alone catches them at the position."""
    rng = random.Random(8)
    runs = CORRUPT_INPUTS[impl_name(frames_impl)] // 10
    for i in range(runs):
        codec = CODECS[i % 2]
        first = frames_impl.encode_payloads([b"head"] * 2)
        data = bytearray(compressed_batch(frames_impl, rng, codec, count=rng.randint(1, 12)))
        mutate(data, rng, head_of(data), len(data))
        assert_corrupt_at(frames_impl, first + bytes(data), len(first))
        refresh_crc_at(data)
        assert_only_frame_corrupt(frames_impl, first + bytes(data), verify=True)
        assert_only_frame_corrupt(frames_impl, first + bytes(data), verify=False)


def test_corrupt_compressed_batches_get_the_same_verdict_across_impls() -> None:
    """Bytes changed, the CRC forged: both implementations reject the same inputs at the same position and
    accept the same ones, with the same records. The block of a zstd batch is left alone here: the two zstd
    builds (the system's libzstd, pyarrow's bundled one) differ on malformed frames, and a frame without a
    checksum may even decode to different bytes (the batch CRC is what protects stored data);
    test_mutated_compressed_batches_never_crash covers those blocks in each implementation."""
    native, pure = both_impls()
    rng = random.Random(9)
    disagreements = []
    for i in range(CROSS_CHECKS):
        codec = CODECS[i % 2]
        data = bytearray(compressed_batch(native, rng, codec, count=rng.randint(1, 6)))
        mutate(data, rng, 12, head_of(data) if codec == "zstd" else len(data))
        refresh_crc_at(data)
        for (name, native_decode), (_, pure_decode) in zip(decoders(native), decoders(pure), strict=True):
            for verify in (True, False):
                says = [_verdict(decode, bytes(data), verify) for decode in (native_decode, pure_decode)]
                if says[0] != says[1]:
                    disagreements.append(f"{name}(verify={verify}) on {bytes(data).hex()}: {says}")
    assert not disagreements, f"{len(disagreements)} disagreements, the first: {disagreements[:2]}"


def _verdict(decode: Any, data: bytes, verify: bool) -> Any:
    try:
        result = decode(data, verify)
    except FrameCorrupt as e:
        return ("FrameCorrupt", e.position)
    if isinstance(result, list):
        return [header_tuple(x) if hasattr(x, "record_count") else record_tuple(x) for x in result]
    return arrow_columns(result)

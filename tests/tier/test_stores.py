"""The ObjectStore contract, one suite over both backends (FolderStore, S3Store on a moto server)."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from danube_fast.errors import ObjectNotFound, ObjectStoreError, ObjectStoreUnavailable
from danube_fast.storage.objects.connect import open_object_store
from danube_fast.storage.objects.folder import FolderStore
from danube_fast.storage.objects.s3 import S3Store
from danube_fast.storage.objects.store import ObjectStore, object_id, object_key
from tests.tier.conftest import CREDENTIALS, REGION, Backend, MotoServer

pytestmark = pytest.mark.timeout(60)
Run = Callable[..., Any]


def test_put_get_ranges_list_delete(backend: Backend, run: Run) -> None:
    async def main() -> None:
        store = await backend.open()
        assert isinstance(store, ObjectStore)
        data = bytes(range(256)) * 40
        etag = await store.put("ns/t/data-0-9.dnb1", data)
        assert (etag is None) == (backend.name == "folder")
        if etag is not None:
            assert etag and '"' not in etag
        await store.put("ns/t/data-10-19.dnb1", b"second")
        await store.put("ns/t2/data-0-0.dnb1", b"other topic")
        assert await store.get("ns/t/data-0-9.dnb1") == data
        assert await store.get("ns/t/data-0-9.dnb1", 100, 300) == data[100:300]
        assert await store.get("ns/t/data-0-9.dnb1", 10_000) == data[10_000:]
        assert await store.get("ns/t/data-0-9.dnb1", -17) == data[-17:]
        assert await store.get("ns/t/data-0-9.dnb1", -100_000) == data
        assert await store.get("ns/t/data-0-9.dnb1", 10_230, 99_999) == data[10_230:]
        assert await store.get("ns/t/data-0-9.dnb1", 20_000, 20_010) == b""  # past the end: clipped
        assert await store.get("ns/t/data-0-9.dnb1", 5, 5) == b""
        assert await store.list("ns/t/") == ["ns/t/data-0-9.dnb1", "ns/t/data-10-19.dnb1"]
        assert await store.list("ns/t") == ["ns/t/data-0-9.dnb1", "ns/t/data-10-19.dnb1",
                                            "ns/t2/data-0-0.dnb1"]
        assert await store.list("ns/t/data-1") == ["ns/t/data-10-19.dnb1"]
        assert await store.list("nothing/") == []
        await store.put("ns/t/data-10-19.dnb1", b"replaced")
        assert await store.get("ns/t/data-10-19.dnb1") == b"replaced"
        await store.delete("ns/t/data-10-19.dnb1")
        await store.delete("ns/t/data-10-19.dnb1")  # deleting a missing object is fine
        with pytest.raises(ObjectNotFound):
            await store.get("ns/t/data-10-19.dnb1")
        with pytest.raises(ObjectNotFound):
            await store.get("no/such/object", 0, 10)
        assert await store.list("") == ["ns/t/data-0-9.dnb1", "ns/t2/data-0-0.dnb1"]
        for bad in ("", "/abs", "a//b", "a/../b", "./a"):
            with pytest.raises(ObjectStoreError, match="invalid object key"):
                await store.put(bad, b"x")
        await store.close()

    run(main())


def test_object_naming() -> None:
    assert object_id(0, 29) == "data-0-29.dnb1"
    key = object_key("default", "reliable_topic", object_id(30, 41))
    assert key == "default/reliable_topic/data-30-41.dnb1"
    with pytest.raises(ObjectStoreError):
        object_key("..", "t", "x")


def test_an_unreachable_store_is_retriable_unavailable(faulty_backend: Backend, run: Run) -> None:
    async def main() -> None:
        store = await faulty_backend.open()
        await store.put("ns/t/a", b"kept")
        faulty_backend.down()
        for attempt in (store.put("ns/t/b", b"x"), store.get("ns/t/a"), store.list("ns/")):
            with pytest.raises(ObjectStoreUnavailable) as info:
                await attempt
            assert info.value.retriable and info.value.grpc_code == "UNAVAILABLE"
            assert info.value.__cause__ is not None  # the backend's own error, chained
        faulty_backend.up()
        assert await store.get("ns/t/a") == b"kept"
        await store.put("ns/t/b", b"after")
        assert await store.list("ns/") == ["ns/t/a", "ns/t/b"]
        await store.close()

    run(main())


def test_a_missing_bucket_is_a_clear_non_retriable_error(moto_server: MotoServer, run: Run) -> None:
    async def main() -> None:
        store = await S3Store.open("no-such-bucket-here", endpoint_url=moto_server.endpoint, region=REGION,
                                   **CREDENTIALS)
        with pytest.raises(ObjectStoreError, match="NoSuchBucket") as info:
            await store.put("a/b", b"x")
        assert not info.value.retriable
        await store.close()

    run(main())


def test_folder_writes_are_atomic_files(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        store = await FolderStore.open(tmp_path / "root")
        await store.put("a/b/c.dnb1", b"payload")
        assert (tmp_path / "root" / "a" / "b" / "c.dnb1").read_bytes() == b"payload"
        assert os.listdir(tmp_path / "root" / "a" / "b") == ["c.dnb1"]  # no temporary file left behind
        (tmp_path / "root" / "a" / "b" / ".c.dnb1.tmp-dead").write_bytes(b"torn")  # a crash's leftover
        assert await store.list("a/") == ["a/b/c.dnb1"]

    run(main())


def test_open_object_store_parses_urls(tmp_path: Path, moto_server: MotoServer, run: Run) -> None:
    async def main() -> None:
        folder = await open_object_store(str(tmp_path / "plain"))
        assert isinstance(folder, FolderStore) and folder.root == str(tmp_path / "plain")
        url = await open_object_store(f"file://{tmp_path}/with%20space")
        assert isinstance(url, FolderStore) and url.root == f"{tmp_path}/with space"
        bucket = moto_server.create_bucket()
        s3 = await open_object_store(f"s3://{bucket}/some/prefix/", endpoint_url=moto_server.endpoint,
                                     region=REGION, **CREDENTIALS)
        assert isinstance(s3, S3Store) and (s3.bucket, s3.prefix) == (bucket, "some/prefix/")
        await s3.put("k", b"v")
        raw = await S3Store.open(bucket, endpoint_url=moto_server.endpoint, region=REGION, **CREDENTIALS)
        assert await raw.list() == ["some/prefix/k"]  # the prefix is where the keys live in the bucket
        await raw.close()
        await s3.close()
        for bad in ("s3:///nobucket", "gs://bucket/x", "file://host/x"):
            with pytest.raises(ValueError):
                await open_object_store(bad)
        with pytest.raises(TypeError):
            await open_object_store(str(tmp_path), endpoint_url="http://x")

    run(main())


def _tmpfs() -> str | None:
    """A tmpfs mount point this process may write, or None (tmpfs takes O_DIRECT from Linux 6.6 on)."""
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _dev, point, kind, *_ = line.split()
            if kind == "tmpfs" and os.access(point, os.W_OK) and point.startswith(("/dev/shm", "/run")):
                return point
    return None


def _takes_direct(directory: Path) -> bool:
    probe = directory / "probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644))
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)
    return True


@pytest.mark.parametrize("where", ["disk", "tmpfs"])
def test_folder_writes_the_same_objects_direct_or_through_the_page_cache(
        tmp_path: Path, run: Run, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """FolderStore(direct=True) writes with O_DIRECT (write_direct) where the file system takes it and with
    writev where it does not (tmpfs before Linux 6.6); either way the object is exactly its parts."""
    from danube_fast.storage.objects import folder

    direct_writes: list[int] = []
    real = folder.segments

    class Counting:
        def write_direct(self, fd: int, dfd: int, parts: list[Any]) -> int:
            direct_writes.append(fd)
            return real.write_direct(fd, dfd, parts)

    monkeypatch.setattr(folder, "segments", Counting())
    if where == "tmpfs":
        mount = _tmpfs()
        if mount is None:
            pytest.skip("no writable tmpfs mounted")
        base = Path(mount) / f"danube-folder-test-{os.getpid()}"
        base.mkdir()
    else:
        base = tmp_path
    parts = [b"head", os.urandom(5 << 20), memoryview(os.urandom(10_000))[17:], b"", b"tail"]

    async def main() -> None:
        for direct in (True, False):
            store = await FolderStore.open(base / f"direct-{direct}", direct=direct)
            await store.put_parts("ns/t/data-0-9.dnb1", parts)
            assert await store.get("ns/t/data-0-9.dnb1") == b"".join(parts)
            assert await store.list("ns/") == ["ns/t/data-0-9.dnb1"]
        assert len(direct_writes) == (1 if _takes_direct(base) else 0)

    try:
        run(main())
    finally:
        if where == "tmpfs":
            shutil.rmtree(base, ignore_errors=True)


def test_put_file_stores_the_file_as_it_is(backend: Backend, tmp_path: Path, run: Run) -> None:
    """put_file (a sealed WAL segment): the object holds the file's bytes; it replaces an object there."""
    source = tmp_path / "segment.log"
    source.write_bytes(os.urandom(70_000))

    async def main() -> None:
        store = await backend.open()
        await store.put("ns/t/data-0-9.dnb1", b"older")
        await store.put_file("ns/t/data-0-9.dnb1", str(source))
        assert await store.get("ns/t/data-0-9.dnb1") == source.read_bytes()
        assert await store.list("ns/") == ["ns/t/data-0-9.dnb1"]
        await store.close()

    run(main())


def test_folder_put_file_links_on_the_same_file_system_and_copies_across(tmp_path: Path, run: Run) -> None:
    """A hard link where it can (no byte copied, the source's inode), a copy across file systems (EXDEV);
    either way no temporary file is left behind."""
    mount = _tmpfs()
    if mount is None:
        pytest.skip("no writable tmpfs mounted")
    here = tmp_path / "segment.log"
    here.write_bytes(os.urandom(9_000))
    away = Path(mount) / f"danube-put-file-{os.getpid()}.log"
    away.write_bytes(os.urandom(9_000))

    async def main() -> None:
        store = await FolderStore.open(tmp_path / "root")
        await store.put_file("ns/t/a.dnb1", str(here))
        await store.put_file("ns/t/b.dnb1", str(away))
        linked, copied = tmp_path / "root" / "ns" / "t" / "a.dnb1", tmp_path / "root" / "ns" / "t" / "b.dnb1"
        assert linked.stat().st_ino == here.stat().st_ino and linked.stat().st_nlink == 2
        assert copied.read_bytes() == away.read_bytes() and copied.stat().st_nlink == 1
        assert sorted(os.listdir(linked.parent)) == ["a.dnb1", "b.dnb1"]
        here.unlink()  # the WAL deletes its segment: the object stays
        assert await store.get("ns/t/a.dnb1") == linked.read_bytes() and linked.stat().st_nlink == 1

    try:
        run(main())
    finally:
        away.unlink(missing_ok=True)


def test_s3_puts_carry_a_crc32_checksum_and_no_body_signature(moto_server: MotoServer, run: Run) -> None:
    """Bodies are not SHA-256 signed on the event loop (storage/objects/s3.py): each put carries a CRC32
    computed off it. moto neither keeps nor checks S3 checksums, so the request itself is looked at, through
    botocore's before-send event on the store's client."""
    from danube_fast.storage.objects.s3_body import crc32_checksum

    assert crc32_checksum([b"123456789"]) == "y/Q5Jg=="  # CRC-32's check value 0xCBF43926
    assert crc32_checksum([b"1234", b"", memoryview(b"56789")]) == "y/Q5Jg=="

    async def main() -> None:
        bucket = moto_server.create_bucket()
        store = await S3Store.open(bucket, endpoint_url=moto_server.endpoint, region=REGION, **CREDENTIALS)
        sent: list[dict[str, str]] = []
        store._client.meta.events.register(
            "before-send.s3.PutObject", lambda request, **_: sent.append(dict(request.headers)))
        data = os.urandom(3 * 1024 * 1024 + 7)
        await store.put("t/obj", data)
        assert await store.get("t/obj") == data
        await store.close()
        [headers] = sent
        lower = {k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in headers.items()}
        assert lower["x-amz-checksum-crc32"] == crc32_checksum([data])
        assert lower["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"

    run(main())


def test_an_s3_put_cut_in_its_body_is_sent_again_whole(moto_server: MotoServer, run: Run) -> None:
    """A put is tried again from the start of its body (s3_body.py PartsBody is rewound, by aiohttp or
    botocore, whichever retries): a connection reset halfway through the first try leaves the whole object
    stored by the second."""
    from danube_fast.testing.proxy import Proxy

    async def main() -> None:
        bucket = moto_server.create_bucket()
        with Proxy(moto_server.endpoint.removeprefix("http://")) as proxy:
            store = await S3Store.open(bucket, endpoint_url=f"http://{proxy.target}", region=REGION,
                                       **CREDENTIALS)
            tries: list[object] = []
            store._client.meta.events.register("before-send.s3.PutObject",
                                               lambda request, **_: tries.append(request.body))
            parts = [os.urandom(3 * 1024 * 1024), b"", os.urandom(5 * 1024 * 1024 + 3)]
            proxy.delay(0.01)  # 64 KiB per 10 ms: the body takes over a second to pass
            put = asyncio.ensure_future(store.put_parts("t/obj", parts))
            while not tries:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            assert not put.done()
            assert proxy.reset() >= 1
            proxy.pass_through()
            await put
            assert proxy.accepted == 2 and not isinstance(tries[0], io.BytesIO)
            assert await store.get("t/obj") == b"".join(parts)
            await store.close()

    run(main())

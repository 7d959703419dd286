"""The uploader: sealed segments become objects, descriptors per docs/METADATA.md#storage-keys, local segments
deleted only after the descriptor is durable, retries while the store is down, drain, restart, fencing."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from danube_fast.errors import ObjectStoreUnavailable
from danube_fast.meta import keys
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.fencing import OwnershipLost, fenced_write
from danube_fast.meta.resources_storage import ObjectDescriptor
from danube_fast.meta.store import Op, TxnResult
from danube_fast.storage import Wal
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.storage.objects.folder import FolderStore
from danube_fast.storage.objects.format import parse_footer
from danube_fast.storage.objects.store import ObjectStore, object_key
from danube_fast.storage.uploader import Uploader, UploaderConfig
from tests.tier.conftest import Backend
from tests.tier.helpers import (
    check_sequence,
    close_all,
    fill,
    open_topic,
    read_all,
    stored_records,
    until,
    wal_config,
)

pytestmark = pytest.mark.timeout(60)
Run = Callable[..., Any]
NS, TOPIC = "default", "reliable_topic"
FAST = UploaderConfig(interval=3600, poll=0.01, backoff_initial=0.02, backoff_max=0.1,
                      index_interval_bytes=512)


def uploader(wal: Wal, store: ObjectStore, meta: EmbeddedStore, **options: Any) -> Uploader:
    options.setdefault("config", FAST)
    return Uploader(wal, store, meta, NS, TOPIC, **options)


def test_sealed_segments_are_uploaded_then_deleted_locally(backend: Backend, tmp_path: Path,
                                                           run: Run) -> None:
    async def main() -> None:
        store, meta, wal = await open_topic(await backend.open(), tmp_path, 2048)
        seen: list[tuple[ObjectDescriptor, int, bytes]] = []

        async def write_meta(ops: Sequence[Op]) -> TxnResult:
            # At the moment the descriptor is written, the object must be in the store and the WAL must
            # still hold its records: nothing local is deleted before the descriptor is durable.
            descriptor = ObjectDescriptor.from_json(ops[0].value)  # type: ignore[union-attr]
            obj = await store.get(object_key(NS, TOPIC, descriptor.object_id))
            seen.append((descriptor, wal.start_offset, obj))
            return await meta.transaction([], ops)

        await fill(wal, 0, 40)  # 160 records over several 2 KiB segments
        up = uploader(wal, store, meta, checkpoint=None, write_meta=write_meta)
        await up.start()
        assert up.checkpoint == -1
        active = wal.segment_bases[-1]
        assert active > 0
        await until(lambda: up.checkpoint == active - 1 and wal.start_offset == active)
        for descriptor, wal_start, obj in seen:
            assert wal_start <= descriptor.start_offset
            assert len(obj) == descriptor.size and parse_footer(obj).max_offset == descriptor.end_offset
        assert wal.segment_bases == [active] and wal.start_offset == active  # only the active segment is left
        check_sequence(await stored_records(store, f"{NS}/{TOPIC}/"), range(active))
        descriptors = await load_descriptors(meta, NS, TOPIC)
        assert [d.start_offset for d in descriptors] == [0] + [d.end_offset + 1 for d in descriptors[:-1]]
        assert (up.stats.objects, up.stats.failures) == (len(descriptors), 0)
        assert up.stats.bytes == sum(d.size for d in descriptors)
        cur = await meta.get(keys.objects_cur(NS, TOPIC))
        assert cur is not None and json.loads(cur.value) == {"start": f"{descriptors[-1].start_offset:020d}"}
        await up.close()
        await close_all(store, meta, wal)

    run(main())


def test_a_sealed_segment_is_stored_as_its_file(backend: Backend, tmp_path: Path, run: Run) -> None:
    """A sealed segment is a whole object (docs/FORMAT.md, "Sealed segments"): its object is its file, a
    hard link in a folder store on the WAL's file system (the same inode: no byte copied), the same bytes in
    S3; the object outlives the WAL's copy."""
    async def main() -> None:
        store, meta, wal = await open_topic(await backend.open(), tmp_path, 2048)
        await fill(wal, 0, 40)
        bases = wal.segment_bases
        files = {}
        for base in bases[:-1]:
            sealed = wal.sealed_object(base)
            assert sealed is not None
            files[base] = (Path(sealed[0]).read_bytes(), os.stat(sealed[0]).st_ino)
        up = uploader(wal, store, meta, checkpoint=None, config=replace(FAST, retain_bytes=1 << 30))
        await up.start()
        await until(lambda: up.checkpoint == bases[-1] - 1)
        descriptors = await load_descriptors(meta, NS, TOPIC)
        assert [(d.start_offset, d.end_offset) for d in descriptors] == \
            [(base, following - 1) for base, following in itertools.pairwise(bases)]
        for d in descriptors:
            data, inode = files[d.start_offset]
            key = object_key(NS, TOPIC, d.object_id)
            assert await store.get(key) == data and d.size == len(data)
            assert d.offset_index == parse_footer(data).index
            if isinstance(store, FolderStore):
                assert os.stat(os.path.join(store.root, *key.split("/"))).st_ino == inode
        assert wal.segment_bases == bases  # kept locally (retain_bytes)
        await up.close()
        await wal.delete_before(bases[-1])
        check_sequence(await stored_records(store, f"{NS}/{TOPIC}/"), range(bases[-1]))
        await close_all(store, meta, wal)

    run(main())


def test_local_retention_keeps_the_newest_uploaded_segments(backend: Backend, tmp_path: Path,
                                                             run: Run) -> None:
    async def main() -> None:
        store, meta, wal = await open_topic(await backend.open(), tmp_path, 2048)
        await fill(wal, 0, 40)  # 160 records over several 2 KiB segments
        bases = wal.segment_bases
        assert len(bases) > 4
        up = uploader(wal, store, meta, checkpoint=None, config=replace(FAST, retain_bytes=3 * 2048))
        await up.start()
        await until(lambda: up.checkpoint == bases[-1] - 1)
        # Everything sealed is in the object tier, but the newest segments within the budget stay local.
        # Retention runs after each object, so wait for the pass after the last one, not the first.
        await until(lambda: len(wal.segment_bases) <= 3)
        kept = wal.segment_bases
        assert kept[-1] == bases[-1] and 1 < len(kept) <= 3, kept
        assert kept == bases[-len(kept):]
        check_sequence(await stored_records(store, f"{NS}/{TOPIC}/"), range(bases[-1]))
        await up.close()
        await close_all(store, meta, wal)

    run(main())


def test_descriptor_and_cur_values_are_those_of_seed_000(backend: Backend, tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        store, meta, wal = await open_topic(await backend.open(), tmp_path, 1 << 20)
        await fill(wal, 0, 30, count=1)  # offsets 0..29, one record per batch
        up = uploader(wal, store, meta)
        await up.start()
        before = int(time.time())
        assert await up.drain() == 29
        kv = await meta.get("/danube-data/storage/topics/default/reliable_topic/objects/00000000000000000000")
        assert kv is not None
        value = json.loads(kv.value)
        assert list(value) == ["completed", "created_at", "end_offset", "etag", "object_id", "offset_index",
                               "size", "start_offset"]
        data = await store.get("default/reliable_topic/data-0-29.dnb1")
        footer = parse_footer(data)
        etag = None if backend.name == "folder" else value["etag"]
        assert value == {"completed": True, "created_at": value["created_at"], "end_offset": 29, "etag": etag,
                         "object_id": "data-0-29.dnb1", "offset_index": [list(e) for e in footer.index],
                         "size": len(data), "start_offset": 0}
        assert before <= value["created_at"] <= time.time() and len(footer.index) > 1
        if backend.name == "s3":
            assert isinstance(etag, str) and len(etag) == 32  # moto's MD5 of the single-part object
        cur = await meta.get("/danube-data/storage/topics/default/reliable_topic/objects/cur")
        assert cur is not None and cur.value == b'{"start":"00000000000000000000"}'
        assert cur.mod_revision == kv.mod_revision  # one transaction wrote both
        await up.close()
        await close_all(store, meta, wal)

    run(main())


def test_retries_with_backoff_while_the_store_is_down_and_loses_nothing(
        faulty_backend: Backend, tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        store, meta, wal = await open_topic(await faulty_backend.open(), tmp_path, 2048)
        up = uploader(wal, store, meta)
        await up.start()
        await fill(wal, 0, 12)
        first_active = wal.segment_bases[-1]
        await until(lambda: up.checkpoint == first_active - 1 and wal.start_offset == first_active)
        faulty_backend.down()
        await fill(wal, 48, 30)
        active = wal.segment_bases[-1]
        await until(lambda: up.stats.failures >= 3)
        assert isinstance(up.stats.last_error, ObjectStoreUnavailable)
        assert up.checkpoint == first_active - 1  # nothing advanced, nothing local deleted
        assert wal.start_offset == first_active and len(wal.segment_bases) > 2
        faulty_backend.up()
        await until(lambda: up.checkpoint == active - 1 and wal.start_offset == active)
        check_sequence(await stored_records(store, f"{NS}/{TOPIC}/"), range(active))
        assert [d.end_offset for d in await load_descriptors(meta, NS, TOPIC)][-1] == active - 1
        await up.close()
        await close_all(store, meta, wal)

    run(main())


def test_drain_uploads_the_active_segment_and_times_out_while_down(
        faulty_backend: Backend, tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        # One segment: no upload trigger fires.
        store, meta, wal = await open_topic(await faulty_backend.open(), tmp_path, 1 << 20)
        up = uploader(wal, store, meta)
        await up.start()
        await fill(wal, 0, 10)
        assert up.stats.objects == 0
        assert await up.drain() == 39
        check_sequence(await stored_records(store), range(40))
        assert wal.start_offset == 0  # the active segment is never deleted
        await fill(wal, 40, 5)
        faulty_backend.down()
        started = time.monotonic()
        with pytest.raises(ObjectStoreUnavailable, match="still unavailable"):
            await up.drain(timeout=0.3)
        assert 0.2 < time.monotonic() - started < 5 and up.checkpoint == 39
        faulty_backend.up()
        assert await up.drain() == 59
        check_sequence(await stored_records(store), range(60))
        await up.close()
        await close_all(store, meta, wal)

    run(main())


def test_a_restart_derives_the_checkpoint_and_uploads_nothing_twice(
        backend: Backend, tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        store, meta, wal = await open_topic(await backend.open(), tmp_path, 2048)
        await fill(wal, 0, 30)
        # As if the broker crashed after publishing objects but before deleting their segments.
        up = uploader(wal, store, meta, config=UploaderConfig(interval=3600, poll=0.01, delete_local=False))
        await up.start()
        assert await up.drain() == 119
        await up.close()
        assert wal.start_offset == 0
        await wal.close()
        objects = await store.list()

        wal = await Wal.open(tmp_path / "wal", wal_config(2048))
        up = uploader(wal, store, meta)
        await up.start()  # checkpoint from the descriptors; the segments it covers go now
        assert up.checkpoint == 119
        assert wal.start_offset == wal.segment_bases[-1] > 0
        assert await up.drain() == 119 and up.stats.objects == 0
        assert await store.list() == objects
        await fill(wal, 120, 3)
        assert await up.drain() == 131
        new = sorted(set(await store.list()) - set(objects))
        assert new == [f"{NS}/{TOPIC}/data-120-131.dnb1"]
        check_sequence(await stored_records(store), range(132))
        await up.close()
        await close_all(store, meta, wal)

    run(main())


def test_a_new_owner_continues_from_the_sealed_checkpoint(backend: Backend, tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        store, meta, wal = await open_topic(await backend.open(), tmp_path, initial_offset=22)
        await fill(wal, 22, 2, count=3)
        up = uploader(wal, store, meta, checkpoint=21)  # the sealed state's last_committed_offset
        await up.start()
        assert await up.drain() == 27
        assert await store.list() == [f"{NS}/{TOPIC}/data-22-27.dnb1"]
        [descriptor] = await load_descriptors(meta, NS, TOPIC)
        assert (descriptor.start_offset, descriptor.end_offset) == (22, 27)
        check_sequence(await stored_records(store), range(22, 28))
        await up.close()
        await close_all(store, meta, wal)

    run(main())


def test_a_fenced_descriptor_write_stops_the_uploader_and_keeps_local_data(
        backend: Backend, tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        store, meta, wal = await open_topic(await backend.open(), tmp_path)
        assignment = keys.broker_topic(7, NS, TOPIC)
        revision = await meta.put(assignment, b"null")

        async def fenced(ops: Sequence[Op]) -> TxnResult:
            return await fenced_write(meta, assignment, revision, ops)

        up = uploader(wal, store, meta, write_meta=fenced)
        await up.start()
        await fill(wal, 0, 10)
        first_active = wal.segment_bases[-1]
        await until(lambda: up.checkpoint == first_active - 1 and wal.start_offset == first_active)
        await meta.delete(assignment)  # the topic moved away
        await fill(wal, 40, 20)
        await until(lambda: up.stopped is not None)
        assert isinstance(up.stopped, OwnershipLost)
        assert up.checkpoint == first_active - 1
        assert wal.start_offset == first_active  # nothing local deleted after the refusal
        assert [d.end_offset for d in await load_descriptors(meta, NS, TOPIC)][-1] == first_active - 1
        with pytest.raises(OwnershipLost):
            await up.drain()
        check_sequence(await read_all(wal, first_active), range(first_active, 120))
        await up.close()
        await close_all(store, meta, wal)

    run(main())


def test_an_uploader_closed_while_it_starts_never_runs(backend: Backend, tmp_path: Path, run: Run) -> None:
    """A topic deleted or unloaded while its uploader reads the descriptors at start: the close comes
    first, and the start must not go on to upload from (and delete segments of) a WAL being closed."""
    async def main() -> None:
        store, meta, wal = await open_topic(await backend.open(), tmp_path, 2048)
        await fill(wal, 0, 40)
        at_read, go = asyncio.Event(), asyncio.Event()
        get_prefix = meta.get_prefix

        async def held(prefix: str) -> Any:
            at_read.set()
            await go.wait()
            return await get_prefix(prefix)

        meta.get_prefix = held  # type: ignore[method-assign]
        up = uploader(wal, store, meta, checkpoint=None)
        starting = asyncio.create_task(up.start())
        await asyncio.wait_for(at_read.wait(), 5)
        await up.close()
        go.set()
        await asyncio.wait_for(starting, 5)
        await asyncio.sleep(0.1)  # FAST polls every 10 ms: a running uploader would have uploaded
        assert [t for t in asyncio.all_tasks() if t.get_name().startswith("uploader:")] == []
        assert await store.list(f"{NS}/{TOPIC}/") == []
        assert wal.start_offset == 0  # nothing deleted locally
        await close_all(store, meta, wal)

    run(main())

"""Retention in the object tier (storage/objects/expiry.py) over real parts: both metadata stores (embedded,
etcd), both object stores (folder, S3 on loopback), objects made by the real uploader from a real WAL. The
clock is the test's: `now_ms` is given, and records carry the publish times the test picks."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from danube_fast.codec import frames
from danube_fast.errors import ObjectStoreUnavailable
from danube_fast.meta import keys
from danube_fast.meta.fencing import OwnershipLost, fenced_write
from danube_fast.meta.resources_storage import ObjectDescriptor, RetentionState
from danube_fast.meta.store import MetadataStore, Op, TxnResult
from danube_fast.storage import Wal
from danube_fast.storage.objects import expiry
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.storage.objects.expiry import Limits, ObjectTimes
from danube_fast.storage.objects.store import ObjectStore, object_key, topic_objects_prefix
from danube_fast.storage.tiered import CloudReader, TopicLog
from danube_fast.storage.uploader import Uploader, UploaderConfig
from danube_fast.testing.plugin import StoreFactory
from tests.tier.conftest import Backend
from tests.tier.helpers import wal_config

pytestmark = pytest.mark.timeout(60)
Run = Callable[..., Any]
NS, TOPIC = "default", "kept"
MINUTE = 60_000
T0 = 1_700_000_000_000  # the first object's records' publish time (ms)
RECORDS = 4  # per object: one batch of 4 records of 100 bytes each


async def topic_with_objects(wal_dir: Path, store: ObjectStore, meta: MetadataStore, times: Sequence[int]
                             ) -> tuple[Wal, list[ObjectDescriptor]]:
    """One object per entry of `times` (its records' publish time), uploaded by the real uploader."""
    wal = await Wal.open(wal_dir, wal_config())
    for t in times:
        await wal.append(frames.encode_payloads([b"x" * 100] * RECORDS, publish_time=t))
    up = Uploader(wal, store, meta, NS, TOPIC, checkpoint=-1,
                  config=UploaderConfig(interval=3600, poll=0.01, max_object_bytes=400, delete_local=False,
                                        whole_segments=False))
    await up.start()
    await up.drain()
    await up.close()
    found = await load_descriptors(meta, NS, TOPIC)
    assert len(found) == len(times), "one object per batch"
    return wal, found


async def unfenced(meta: MetadataStore) -> Callable[[Sequence[Op]], Any]:
    async def write(ops: Sequence[Op]) -> TxnResult:
        return await meta.transaction([], ops, [])
    return write


async def stored(store: ObjectStore) -> list[str]:
    return [k.rpartition("/")[2] for k in await store.list(topic_objects_prefix(NS, TOPIC))]


def test_time_retention_deletes_the_oldest_objects_and_keeps_the_newest(
        backend: Backend, store: StoreFactory, tmp_path: Path, run: Run) -> None:
    """Objects a minute apart; a 7-minute limit at T0 + 10 min lets go those older than T0 + 3 min, descriptor
    and object, and records the floor. Readers behind it go on from the first offset kept. A limit everything
    breaks still keeps the newest object (objects/cur names it)."""

    async def main() -> None:
        objects = await backend.open()
        async with store() as meta:
            wal, found = await topic_with_objects(tmp_path / "wal", objects, meta,
                                                  [T0 + i * MINUTE for i in range(6)])
            times = ObjectTimes(objects, NS, TOPIC)
            doomed = await expiry.expired(found, Limits(time_ms=7 * MINUTE), T0 + 10 * MINUTE, times)
            assert doomed == found[:3]
            assert await times.of(found[3]) == (T0 + 3 * MINUTE, T0 + 3 * MINUTE)  # from the footer
            write = await unfenced(meta)
            assert await expiry.remove(objects, write, NS, TOPIC, doomed) == 3
            kept = await load_descriptors(meta, NS, TOPIC)
            assert kept == found[3:]
            assert await stored(objects) == sorted(d.object_id for d in kept)
            state = await expiry.read_state(meta, NS, TOPIC)
            assert state == RetentionState(found[3].start_offset)
            # A reader at 0, behind retention, reads on from the first offset kept.
            await wal.delete_before(found[-1].start_offset)  # as the uploader does: the tier holds the rest
            log = await TopicLog.open(wal, CloudReader(objects, meta, NS, TOPIC))
            got = await log.read(0)
            assert got is not None
            assert next(iter(frames.decode_records(got[0]))).offset == found[3].start_offset
            assert log.behind_retention == found[3].start_offset
            everything = await expiry.expired(kept, Limits(time_ms=1), T0 + 60 * MINUTE, times)
            assert everything == kept[:-1]
            await expiry.remove(objects, write, NS, TOPIC, everything)
            assert await load_descriptors(meta, NS, TOPIC) == kept[-1:]
            assert (await meta.get(keys.objects_cur(NS, TOPIC))) is not None
            await wal.close()
        await objects.close()

    run(main())


def test_an_object_age_is_its_newest_record_but_never_past_its_upload(
        backend: Backend, store: StoreFactory, tmp_path: Path, run: Run) -> None:
    """Publish times from a producer clock far ahead count as the upload time, so they cannot keep an object
    past its time; and the first object kept stops the cut (as Kafka's segments do): a young object keeps
    an older one behind it."""

    async def main() -> None:
        objects = await backend.open()
        async with store() as meta:
            year_2100 = 4_102_444_800_000
            wal, found = await topic_with_objects(tmp_path / "wal", objects, meta,
                                                  [year_2100, T0, T0 + 30 * MINUTE, T0, T0])
            now = int(time.time() * 1000)
            times = ObjectTimes(objects, NS, TOPIC)
            assert expiry.object_time(found[0], await times.of(found[0])) == found[0].created_at * 1000
            assert expiry.object_time(found[1], await times.of(found[1])) == T0
            hour = Limits(time_ms=60 * MINUTE)
            assert await expiry.expired(found, hour, now + 2 * 60 * MINUTE, times) == found[:4]
            assert await expiry.expired(found, hour, now, times) == []  # the first is young by its upload
            assert await expiry.expired(found[1:], Limits(time_ms=20 * MINUTE), T0 + 40 * MINUTE, times) \
                == found[1:2]  # the one of T0 + 30 min stops the cut
            empty = ObjectDescriptor("", 100, 199, 0, True, 1_000)
            assert await times.of(empty) is None and expiry.object_time(empty, None) == 1_000_000
            await wal.close()
        await objects.close()

    run(main())


def test_size_retention_keeps_the_newest_bytes(backend: Backend, store: StoreFactory, tmp_path: Path,
                                               run: Run) -> None:
    async def main() -> None:
        objects = await backend.open()
        async with store() as meta:
            wal, found = await topic_with_objects(tmp_path / "wal", objects, meta, [T0] * 8)
            size = found[0].size
            assert all(d.size == size for d in found)
            times = ObjectTimes(objects, NS, TOPIC)
            doomed = await expiry.expired(found, Limits(bytes=3 * size + size // 2), T0, times)
            assert doomed == found[:5], "three whole objects fit, a fourth does not"
            await expiry.remove(objects, await unfenced(meta), NS, TOPIC, doomed)
            assert await load_descriptors(meta, NS, TOPIC) == found[5:]
            assert await expiry.expired(found[5:], Limits(bytes=1), T0, times) == found[5:7]
            assert await expiry.expired(found[5:], Limits(), T0, times) == []
            await wal.close()
        await objects.close()

    run(main())


class FailingDeletes:
    """The real store, with deletes failing once `fail` is set: a crash between the descriptors' deletion
    and the objects' (a real store cannot be made to fail at that step on demand)."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self.fail = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def delete(self, key: str) -> None:
        if self.fail:
            raise ObjectStoreUnavailable(f"delete {key}: injected")
        await self._store.delete(key)


def test_a_pass_cut_short_after_the_descriptors_is_finished_by_the_next(
        backend: Backend, store: StoreFactory, tmp_path: Path, run: Run) -> None:
    """No descriptor ever names a deleted object: the descriptors go first. When the objects' deletion fails,
    the retention state lists them, and `finish` (the next pass, this owner or the next) deletes them."""

    async def main() -> None:
        real = await backend.open()
        objects = FailingDeletes(real)
        async with store() as meta:
            wal, found = await topic_with_objects(tmp_path / "wal", real, meta, [T0] * 4)
            write = await unfenced(meta)
            objects.fail = True
            with pytest.raises(ObjectStoreUnavailable):
                await expiry.remove(objects, write, NS, TOPIC, found[:2])
            assert await load_descriptors(meta, NS, TOPIC) == found[2:]
            assert await stored(real) == sorted(d.object_id for d in found)  # the objects are still there
            state = await expiry.read_state(meta, NS, TOPIC)
            assert state is not None and state.deleting == (found[0].object_id, found[1].object_id)
            objects.fail = False
            assert await expiry.finish(objects, meta, write, NS, TOPIC) == 2
            assert await stored(real) == sorted(d.object_id for d in found[2:])
            assert await expiry.read_state(meta, NS, TOPIC) == RetentionState(found[1].end_offset + 1)
            assert await expiry.finish(objects, meta, write, NS, TOPIC) == 0
            await wal.close()
        await real.close()

    run(main())


def test_a_broker_that_lost_the_topic_deletes_nothing(backend: Backend, store: StoreFactory, tmp_path: Path,
                                                      run: Run) -> None:
    """Retention writes through the owner's fence: once the assignment is gone, no descriptor is deleted and
    so no object either."""

    async def main() -> None:
        objects = await backend.open()
        async with store() as meta:
            wal, found = await topic_with_objects(tmp_path / "wal", objects, meta, [T0] * 3)
            assignment = "/cluster/brokers/1/default/kept"
            revision = await meta.put(assignment, b"null")

            async def fenced(ops: Sequence[Op]) -> TxnResult:
                return await fenced_write(meta, assignment, revision, ops)

            await meta.delete(assignment)  # the topic moved away
            with pytest.raises(OwnershipLost):
                await expiry.remove(objects, fenced, NS, TOPIC, found[:2])
            assert await load_descriptors(meta, NS, TOPIC) == found
            assert await stored(objects) == sorted(d.object_id for d in found)
            assert await meta.get(keys.retention_state(NS, TOPIC)) is None
            await wal.close()
        await objects.close()

    run(main())


def test_the_retention_state_round_trips_and_refuses_bad_values() -> None:
    state = RetentionState(40, ("data-0-19.dnb1", "data-20-39.dnb1"))
    assert RetentionState.from_json(state.to_json()) == state
    assert keys.parse_retention_state(keys.retention_state(NS, TOPIC)) == (NS, TOPIC)
    with pytest.raises(ValueError, match="floor"):
        RetentionState.from_json(b'{"deleting": []}')
    assert object_key(NS, TOPIC, "data-0-19.dnb1").endswith("/data-0-19.dnb1")

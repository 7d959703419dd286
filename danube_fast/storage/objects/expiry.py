"""Retention in the object tier (docs/RETENTION.md): which of a topic's objects a policy lets go, and removing
them so that no descriptor ever names a missing object.

`expired(descriptors, limits, now_ms, times)` picks the oldest objects while they break a limit: older than
`time_ms` (an object's age is that of its newest record, read from its footer by ObjectTimes, never newer than
its upload: a producer's clock running ahead cannot keep data past its time), or more bytes in the tier than
`bytes` counting from the newest. It stops at the first object it keeps, as Kafka does with segments, and
never takes the newest object (`objects/cur` names it; the uploader's next object follows it).

`remove` deletes the descriptors first, in transactions through the owner's fenced writer (a topic that moved
refuses them). Each transaction also writes the topic's retention state (`.../retention`): `floor`, the offset
below which everything is deleted, and `deleting`, the object ids of that transaction's descriptors. Then it
deletes those objects, and clears `deleting`. A crash between the steps leaves ids that `finish` deletes at
the next pass, by this owner or the next. So no descriptor ever names a deleted object, and no object
retention meant to delete stays behind. (Objects left without a descriptor by other means, an upload that
failed before it was published, are not looked for: telling them from an upload in flight needs the store's
listing and times, which retention does not read.) The floor also tells a new owner that a dead owner's gap
below it is gone, not pending (broker/cluster/handoff.py).

Owner: the broker's retention task (broker/retention.py), one pass at a time per topic.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from danube_fast.meta import keys
from danube_fast.meta.resources_storage import ObjectDescriptor, RetentionState
from danube_fast.meta.store import MAX_TXN_OPS, BadValue, Delete, Op, Put, TxnResult
from danube_fast.storage.objects.store import ObjectStore, object_key, read_footer

if TYPE_CHECKING:
    from danube_fast.meta.reader import MetadataReader  # a MetadataStore is one

log = logging.getLogger("danube_fast.retention")

WriteMeta = Callable[[Sequence[Op]], Awaitable[TxnResult]]
TXN_OPS = MAX_TXN_OPS - 1  # descriptor deletions per transaction, with the retention state's put
DELETES_AT_ONCE = 32  # object deletions in flight: one at a time, 10,000 objects took 2 s on a folder
MINUTE_MS = 60_000
MIB = 1024 * 1024


class RetentionFenced(Exception):
    """A retention write was refused by its transaction's compare: this broker no longer owns the topic."""


@dataclass(frozen=True)
class Limits:
    """What a topic keeps: `time_ms` of records by age and `bytes` in the object tier; 0 = no limit."""

    time_ms: int = 0
    bytes: int = 0

    @classmethod
    def of(cls, time_minutes: int, size_mb: int) -> Limits:
        return cls(time_minutes * MINUTE_MS, size_mb * MIB)

    def __bool__(self) -> bool:
        return bool(self.time_ms or self.bytes)


class ObjectTimes:
    """The publish times of a topic's objects, from their footers (docs/FORMAT.md: oldest and newest record),
    one ranged GET per object, remembered by object id. Descriptors carry no times (docs/METADATA.md keeps
    their shape). Owner: one retention pass at a time of one topic."""

    def __init__(self, objects: ObjectStore, namespace: str, topic: str) -> None:
        self._objects = objects
        self._namespace, self._topic = namespace, topic
        self._seen: dict[str, tuple[int, int]] = {}

    async def of(self, d: ObjectDescriptor) -> tuple[int, int] | None:
        """(oldest, newest) publish time in ms; None for an empty descriptor (no object, no records)."""
        if not d.object_id:
            return None
        if d.object_id not in self._seen:
            footer = await read_footer(self._objects, object_key(self._namespace, self._topic, d.object_id))
            self._seen[d.object_id] = (footer.min_time, footer.max_time)
        return self._seen[d.object_id]

    def keep_only(self, descriptors: Sequence[ObjectDescriptor]) -> None:
        """Forget the objects not in `descriptors` (deleted)."""
        kept = {d.object_id for d in descriptors}
        self._seen = {k: v for k, v in self._seen.items() if k in kept}


def object_time(d: ObjectDescriptor, times: tuple[int, int] | None) -> int:
    """The age retention gives an object (ms since the epoch): its newest record's publish time (`times`, from
    ObjectTimes), clipped to its upload time (the only time an empty descriptor has)."""
    uploaded = d.created_at * 1000
    return uploaded if times is None else min(times[1], uploaded)


async def expired(descriptors: Sequence[ObjectDescriptor], limits: Limits, now_ms: int, times: ObjectTimes
                  ) -> list[ObjectDescriptor]:
    """The oldest of `descriptors` (in offset order) that `limits` let go at `now_ms` (module docstring)."""
    last = len(descriptors) - 1
    cut = 0
    if limits.time_ms:
        while cut < last:
            d = descriptors[cut]
            if object_time(d, await times.of(d)) >= now_ms - limits.time_ms:
                break
            cut += 1
    if limits.bytes:
        held = sum(d.size for d in descriptors[cut:])
        while cut < last and held > limits.bytes:
            held -= descriptors[cut].size
            cut += 1
    return list(descriptors[:cut])


async def remove(objects: ObjectStore, write_meta: WriteMeta, namespace: str, topic: str,
                 doomed: Sequence[ObjectDescriptor]) -> int:
    """Delete `doomed`'s descriptors, then their objects, TXN_OPS at a time (module docstring); the objects
    deleted. RetentionFenced when the topic moved; store errors propagate (the state says what is left)."""
    key = keys.retention_state(namespace, topic)
    deleted = 0
    for i in range(0, len(doomed), TXN_OPS):
        chunk = doomed[i:i + TXN_OPS]
        ids = tuple(d.object_id for d in chunk if d.object_id)  # an empty descriptor has no object
        floor = chunk[-1].end_offset + 1
        ops: list[Op] = [Delete(keys.object_descriptor(namespace, topic, d.start_offset)) for d in chunk]
        ops.append(Put(key, RetentionState(floor, ids).to_json()))
        await _write(write_meta, ops, namespace, topic)
        deleted += await _delete_objects(objects, namespace, topic, ids)
        if i + TXN_OPS >= len(doomed):
            await _write(write_meta, [Put(key, RetentionState(floor).to_json())], namespace, topic)
    return deleted


async def read_state(meta: MetadataReader, namespace: str, topic: str) -> RetentionState | None:
    """The topic's retention state; None when retention never deleted anything (or the value is not valid:
    logged, and then taken as absent, which at worst waits at a gap or leaves objects for later)."""
    kv = await meta.get(keys.retention_state(namespace, topic))
    if kv is None:
        return None
    try:
        return RetentionState.from_json(kv.value, key=kv.key)
    except BadValue as e:
        log.warning("%s/%s: the retention state is not valid: %s", namespace, topic, e)
        return None


async def finish(objects: ObjectStore, meta: MetadataReader, write_meta: WriteMeta, namespace: str,
                 topic: str) -> int:
    """Delete the objects an interrupted `remove` left in the state, then clear them; the objects deleted."""
    state = await read_state(meta, namespace, topic)
    if state is None or not state.deleting:
        return 0
    deleted = await _delete_objects(objects, namespace, topic, state.deleting)
    cleared = RetentionState(state.floor).to_json()
    await _write(write_meta, [Put(keys.retention_state(namespace, topic), cleared)], namespace, topic)
    return deleted


async def _write(write_meta: WriteMeta, ops: Sequence[Op], namespace: str, topic: str) -> None:
    result = await write_meta(ops)
    if not result.succeeded:
        raise RetentionFenced(f"{namespace}/{topic}: retention's metadata write was refused: the topic moved")


async def _delete_objects(objects: ObjectStore, namespace: str, topic: str, ids: Sequence[str]) -> int:
    for i in range(0, len(ids), DELETES_AT_ONCE):
        await asyncio.gather(*(objects.delete(object_key(namespace, topic, object_id))
                               for object_id in ids[i:i + DELETES_AT_ONCE]))
    return len(ids)

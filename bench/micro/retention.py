"""`python -m bench meta`'s retention figures: one retention pass that deletes OBJECTS objects of a topic
(storage/objects/expiry.py `remove`: their descriptors in transactions, then the objects), on each metadata
store, with the objects in a folder store on the scratch directory. Per run the topic is made anew: OBJECTS
descriptors (written in transactions, not timed) and as many small object files.

Figures: seconds per pass (median of the runs), and the metadata writes the pass made (transactions,
counted by a wrapper of the writer; the same every run).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import Result, median, progress
from danube_fast.meta import keys
from danube_fast.meta.resources_storage import ObjectDescriptor
from danube_fast.meta.store import MAX_TXN_OPS, MetadataStore, Op, Put, TxnResult
from danube_fast.storage.objects import expiry
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.storage.objects.folder import FolderStore
from danube_fast.storage.objects.store import object_id, object_key

OBJECTS = 10_000
QUICK_OBJECTS = 1_000
NS, TOPIC = "bench", "retention"
RECORDS_PER_OBJECT = 1000


async def _make_topic(meta: MetadataStore, objects: FolderStore, count: int) -> list[ObjectDescriptor]:
    await meta.delete_prefix(keys.storage_topic_prefix(NS, TOPIC))
    made = []
    for i in range(count):
        start = i * RECORDS_PER_OBJECT
        name = object_id(start, start + RECORDS_PER_OBJECT - 1)
        await objects.put(object_key(NS, TOPIC, name), b"x")
        made.append(ObjectDescriptor(name, start, start + RECORDS_PER_OBJECT - 1, 1, True, int(time.time())))
    for i in range(0, count, MAX_TXN_OPS):
        await meta.transaction([], [Put(keys.object_descriptor(NS, TOPIC, d.start_offset), d.to_json())
                                    for d in made[i:i + MAX_TXN_OPS]], [])
    return made


async def retention_figures(name: str, meta: MetadataStore, scratch: Path, runs: int, quick: bool
                            ) -> list[Result]:
    count = QUICK_OBJECTS if quick else OBJECTS
    objects = await FolderStore.open(scratch / f"objects-{name}")
    writes = 0

    async def counted(ops: Sequence[Op]) -> TxnResult:
        nonlocal writes
        writes += 1
        return await meta.transaction([], ops, [])

    seconds = []
    try:
        for run in range(runs):
            progress(f"meta: {name} retention pass over {count:,} objects, run {run + 1}/{runs}")
            made = await _make_topic(meta, objects, count)
            writes = 0
            started = time.perf_counter()
            deleted = await expiry.remove(objects, counted, NS, TOPIC, made[:-1])
            seconds.append(time.perf_counter() - started)
            assert deleted == count - 1 and len(await load_descriptors(meta, NS, TOPIC)) == 1
    finally:
        await objects.close()
    label = f"{name}_retention_pass_{count // 1000}k"
    return [Result(label, "s", median(seconds), runs),
            Result(f"{label}_metadata_writes", "txns", float(writes), runs)]

"""A topic's object catalog in the metadata store: the descriptors of docs/METADATA.md#storage-keys.

`/danube-data/storage/topics/{ns}/{topic}/objects/{start:020d}` holds one ObjectDescriptor per uploaded
object and `.../objects/cur` points at the latest one. The uploader of the topic's owner is their only writer
(through its fenced `write_meta`); readers (the tiered reader, Spark, a new owner deriving its checkpoint)
only read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from danube_fast.meta import keys
from danube_fast.meta.resources_storage import CurrentObject, ObjectDescriptor
from danube_fast.meta.store import Op, Put

if TYPE_CHECKING:
    from danube_fast.meta.reader import MetadataReader  # a MetadataStore is one


async def load_descriptors(meta: MetadataReader, namespace: str, topic: str) -> list[ObjectDescriptor]:
    """The topic's completed object descriptors, in offset order (their keys sort that way)."""
    cur = keys.objects_cur(namespace, topic)
    found = []
    for kv in await meta.get_prefix(keys.objects_prefix(namespace, topic)):
        if kv.key == cur:
            continue
        descriptor = ObjectDescriptor.from_json(kv.value, key=kv.key)
        if descriptor.completed:
            found.append(descriptor)
    found.sort(key=lambda d: d.start_offset)
    return found


def last_uploaded_offset(descriptors: list[ObjectDescriptor]) -> int:
    """The last offset in the object tier: the largest end_offset, -1 when there is no object."""
    return max((d.end_offset for d in descriptors), default=-1)


def descriptor_ops(namespace: str, topic: str, descriptor: ObjectDescriptor) -> list[Op]:
    """The writes that publish one uploaded object: its descriptor and `objects/cur`, for one transaction."""
    return [Put(keys.object_descriptor(namespace, topic, descriptor.start_offset), descriptor.to_json()),
            Put(keys.objects_cur(namespace, topic), CurrentObject(descriptor.start_offset).to_json())]

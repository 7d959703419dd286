"""The object tier's parts: the `.dnb1` object format, the ObjectStore protocol with its S3 and folder
implementations, and the descriptor catalog in the metadata store. S3Store is imported from
`danube_fast.storage.objects.s3` on demand (aiobotocore is loaded only when S3 is used)."""

from danube_fast.storage.objects.catalog import descriptor_ops, last_uploaded_offset, load_descriptors
from danube_fast.storage.objects.connect import open_object_store
from danube_fast.storage.objects.folder import FolderStore
from danube_fast.storage.objects.format import BuiltObject, Footer, build_object, parse_footer
from danube_fast.storage.objects.store import ObjectStore, object_id, object_key

__all__ = [
    "BuiltObject",
    "FolderStore",
    "Footer",
    "ObjectStore",
    "build_object",
    "descriptor_ops",
    "last_uploaded_offset",
    "load_descriptors",
    "object_id",
    "object_key",
    "open_object_store",
    "parse_footer",
]

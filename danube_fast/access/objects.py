"""The object tier and the record-batch codec, for readers outside the package (danube_fast/access)."""

from danube_fast.codec import frames
from danube_fast.errors import FrameCorrupt, ObjectCorrupt, ObjectNotFound
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.storage.objects.connect import open_object_store
from danube_fast.storage.objects.format import HEADER_SIZE, Footer, check_header, parse_footer
from danube_fast.storage.objects.store import ObjectStore, object_key, read_footer

__all__ = ["HEADER_SIZE", "Footer", "FrameCorrupt", "ObjectCorrupt", "ObjectNotFound", "ObjectStore",
           "check_header", "frames", "load_descriptors", "object_key", "open_object_store", "parse_footer",
           "read_footer"]

"""Cluster metadata: the MetadataStore protocol and its two implementations (etcd, embedded SQLite).

EtcdStore lives in `danube_fast.meta.etcd`, imported on demand: standalone mode needs no gRPC.
"""

from typing import TYPE_CHECKING

from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.store import (
    MAX_REQUEST_BYTES,
    MAX_TXN_OPS,
    MAX_VALUE_BYTES,
    Compacted,
    Compare,
    Delete,
    Get,
    InvalidKey,
    InvalidRevision,
    InvalidTransaction,
    KeyValue,
    LeaseNotFound,
    MetadataCorrupt,
    MetadataError,
    MetadataReadOnly,
    MetadataRefused,
    MetadataStore,
    MetadataStoreFull,
    MetadataUnavailable,
    Op,
    Put,
    TxnResult,
    ValueTooLarge,
    WatchEvent,
)

__all__ = [
    "MAX_REQUEST_BYTES",
    "MAX_TXN_OPS",
    "MAX_VALUE_BYTES",
    "Compacted",
    "Compare",
    "Delete",
    "EmbeddedStore",
    "Get",
    "InvalidKey",
    "InvalidRevision",
    "InvalidTransaction",
    "KeyValue",
    "LeaseNotFound",
    "MetadataCorrupt",
    "MetadataError",
    "MetadataReadOnly",
    "MetadataRefused",
    "MetadataStore",
    "MetadataStoreFull",
    "MetadataUnavailable",
    "Op",
    "Put",
    "TxnResult",
    "ValueTooLarge",
    "WatchEvent",
]

if TYPE_CHECKING:
    from danube_fast.meta.etcd import EtcdStore

    def _implement_the_protocol(embedded: EmbeddedStore, etcd: EtcdStore) -> list[MetadataStore]:
        return [embedded, etcd]  # mypy checks both against MetadataStore

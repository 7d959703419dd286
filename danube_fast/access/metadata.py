"""The metadata store, read-only, for readers outside the package (danube_fast/access)."""

from danube_fast import names
from danube_fast.meta import keys
from danube_fast.meta.etcd_access import ETCD_PASSWORD_ENV, EtcdAccess, EtcdAccessError
from danube_fast.meta.reader import MetadataReader, open_reader
from danube_fast.meta.resources import (
    BrokerRegistration,
    DeliveryMode,
    SchemaKind,
    SchemaMetadata,
    TopicDelivery,
    TopicSchemaConfig,
)
from danube_fast.meta.resources_storage import ObjectDescriptor, TableCatalog, TablePointer
from danube_fast.names import parse_topic

__all__ = ["ETCD_PASSWORD_ENV", "BrokerRegistration", "DeliveryMode", "EtcdAccess", "EtcdAccessError",
           "MetadataReader", "ObjectDescriptor", "SchemaKind",
           "SchemaMetadata", "TableCatalog", "TablePointer", "TopicDelivery", "TopicSchemaConfig", "keys",
           "names", "open_reader", "parse_topic"]

"""What a unary admin call needs to be made by name: the protobuf message shape it sends and answers, the
method's path from the generated descriptors, and the `host:port` of a registered address. Shared by the CLI,
by a broker that forwards a call to another (broker/services/forward.py) and by the web console."""

from __future__ import annotations

from typing import Protocol, Self, TypeVar

from danube_fast.proto import (
    BrokerStats_pb2,
    DanubeAdmin_pb2,
    PolicyAdmin_pb2,
    Replication_pb2,
    SchemaRegistry_pb2,
    SecurityAdmin_pb2,
    SubscriptionAdmin_pb2,
    TableAdmin_pb2,
)

# The files whose services are called by name: every service of the admin port.
_BY_NAME = (DanubeAdmin_pb2.DESCRIPTOR, TableAdmin_pb2.DESCRIPTOR, SubscriptionAdmin_pb2.DESCRIPTOR,
            PolicyAdmin_pb2.DESCRIPTOR, SchemaRegistry_pb2.DESCRIPTOR, SecurityAdmin_pb2.DESCRIPTOR,
            BrokerStats_pb2.DESCRIPTOR, Replication_pb2.DESCRIPTOR)


class WireMessage(Protocol):
    """A generated protobuf message class, as far as a call by name needs it."""

    def SerializeToString(self, deterministic: bool = ...) -> bytes: ...

    @classmethod
    def FromString(cls, s: bytes) -> Self: ...


M = TypeVar("M", bound=WireMessage)


def dial_target(admin_addr: str) -> str:
    """`host:port` from a registered address, which Danube writes as a URL (`http://0.0.0.0:50051`)."""
    for scheme in ("http://", "https://"):
        if admin_addr.startswith(scheme):
            admin_addr = admin_addr[len(scheme):]
    return admin_addr.rstrip("/")


def method_path(service: str, method: str) -> str:
    """`/danube_admin.TopicAdmin/DeleteTopic` for ("TopicAdmin", "DeleteTopic"), from the descriptors."""
    descriptor = next(d.services_by_name[service] for d in _BY_NAME if service in d.services_by_name)
    return f"/{descriptor.full_name}/{descriptor.methods_by_name[method].name}"

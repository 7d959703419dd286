"""Our .proto files against the reference descriptors (docs/WIRE.md A.1-A.4).

* DanubeApi and SchemaRegistry: the FileDescriptorProtos must be byte-identical to the ones inside the
  danube-client 0.5.0 wheel once source info, file options and json_name are cleared. Each side is loaded in
  its own interpreter: both register the same file names in protobuf's default pool, so a mismatch would
  otherwise surface as an import error instead of a diff.
* DanubeAdmin (the client has no copy): method paths, request/response types and every field's number, type
  and label are checked against the A.4 tables below.
* The checked-in generated code is exactly what `make proto` produces now.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, text_format

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "danube_fast" / "proto"
GENERATED = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
SHARED_WITH_CLIENT = ("DanubeApi", "SchemaRegistry")
ALL_PROTOS = (*SHARED_WITH_CLIENT, "DanubeAdmin", "FastApi", "SecurityAdmin", "PolicyAdmin", "TableAdmin",
               "SubscriptionAdmin", "BrokerStats", "Replication")

FDP = descriptor_pb2.FileDescriptorProto
FIELD = descriptor_pb2.FieldDescriptorProto

# Contract A.4 (v0.7.3 DanubeAdmin.proto), row for row: (full method path, request, response, streaming) and
# (field number, name, type, label) in the contract's words; "optional" means proto3 explicit presence.
ADMIN_METHODS: list[tuple[str, str, str, str]] = [
    ("/danube_admin.BrokerAdmin/ListBrokers", "Empty", "BrokerListResponse", "unary"),
    ("/danube_admin.BrokerAdmin/GetLeaderBroker", "Empty", "BrokerResponse", "unary"),
    ("/danube_admin.BrokerAdmin/ListNamespaces", "Empty", "NamespaceListResponse", "unary"),
    ("/danube_admin.BrokerAdmin/UnloadBroker", "UnloadBrokerRequest", "UnloadBrokerResponse", "unary"),
    ("/danube_admin.BrokerAdmin/ActivateBroker", "ActivateBrokerRequest", "ActivateBrokerResponse", "unary"),
    (
        "/danube_admin.BrokerAdmin/GetClusterBalance", "ClusterBalanceRequest", "ClusterBalanceResponse",
        "unary",
    ),
    ("/danube_admin.BrokerAdmin/TriggerRebalance", "RebalanceRequest", "RebalanceResponse", "unary"),
    ("/danube_admin.NamespaceAdmin/GetNamespaceTopics", "NamespaceRequest", "TopicListResponse", "unary"),
    ("/danube_admin.NamespaceAdmin/GetNamespacePolicies", "NamespaceRequest", "PolicyResponse", "unary"),
    ("/danube_admin.NamespaceAdmin/CreateNamespace", "NamespaceRequest", "NamespaceResponse", "unary"),
    ("/danube_admin.NamespaceAdmin/DeleteNamespace", "NamespaceRequest", "NamespaceResponse", "unary"),
    ("/danube_admin.TopicAdmin/ListNamespaceTopics", "NamespaceRequest", "TopicInfoListResponse", "unary"),
    ("/danube_admin.TopicAdmin/ListBrokerTopics", "BrokerRequest", "TopicInfoListResponse", "unary"),
    ("/danube_admin.TopicAdmin/CreateTopic", "NewTopicRequest", "TopicResponse", "unary"),
    ("/danube_admin.TopicAdmin/CreatePartitionedTopic", "PartitionedTopicRequest", "TopicResponse", "unary"),
    ("/danube_admin.TopicAdmin/DeleteTopic", "TopicRequest", "TopicResponse", "unary"),
    ("/danube_admin.TopicAdmin/UnloadTopic", "TopicRequest", "TopicResponse", "unary"),
    ("/danube_admin.TopicAdmin/ListSubscriptions", "TopicRequest", "SubscriptionListResponse", "unary"),
    ("/danube_admin.TopicAdmin/Unsubscribe", "SubscriptionRequest", "SubscriptionResponse", "unary"),
    ("/danube_admin.TopicAdmin/DescribeTopic", "DescribeTopicRequest", "DescribeTopicResponse", "unary"),
]
ADMIN_ENUMS: dict[str, list[tuple[int, str]]] = {
    "DispatchStrategy": [(0, "NonReliable"), (1, "Reliable")],
}
ADMIN_MESSAGES: dict[str, list[tuple[int, str, str, str]]] = {
    "Empty": [],
    "NamespaceRequest": [
        (1, "name", "string", "singular"),
    ],
    "NamespaceResponse": [
        (1, "success", "bool", "singular"),
    ],
    "NewTopicRequest": [
        (1, "name", "string", "singular"),
        (2, "schema_subject", "string", "optional"),
        (3, "dispatch_strategy", "DispatchStrategy (enum)", "singular"),
    ],
    "TopicRequest": [
        (1, "name", "string", "singular"),
    ],
    "TopicResponse": [
        (1, "success", "bool", "singular"),
    ],
    "PartitionedTopicRequest": [
        (1, "base_name", "string", "singular"),
        (2, "partitions", "uint32", "singular"),
        (3, "schema_subject", "string", "optional"),
        (4, "dispatch_strategy", "DispatchStrategy (enum)", "singular"),
    ],
    "SubscriptionRequest": [
        (1, "topic", "string", "singular"),
        (2, "subscription", "string", "singular"),
    ],
    "SubscriptionResponse": [
        (1, "success", "bool", "singular"),
    ],
    "BrokerListResponse": [
        (1, "brokers", "BrokerInfo", "repeated"),
    ],
    "BrokerInfo": [
        (1, "broker_id", "string", "singular"),
        (2, "broker_addr", "string", "singular"),
        (3, "broker_role", "string", "singular"),
        (4, "admin_addr", "string", "singular"),
        (5, "metrics_addr", "string", "singular"),
        (6, "broker_status", "string", "singular"),
    ],
    "BrokerResponse": [
        (1, "leader", "string", "singular"),
    ],
    "NamespaceListResponse": [
        (1, "namespaces", "string", "repeated"),
    ],
    "TopicListResponse": [
        (1, "topics", "string", "repeated"),
    ],
    "TopicInfo": [
        (1, "name", "string", "singular"),
        (2, "broker_id", "string", "singular"),
        (3, "delivery", "string", "singular"),
    ],
    "TopicInfoListResponse": [
        (1, "topics", "TopicInfo", "repeated"),
    ],
    "BrokerRequest": [
        (1, "broker_id", "string", "singular"),
    ],
    "PolicyResponse": [
        (1, "policies", "string", "singular"),
    ],
    "SubscriptionListResponse": [
        (1, "subscriptions", "string", "repeated"),
    ],
    "DescribeTopicRequest": [
        (1, "name", "string", "singular"),
    ],
    "DescribeTopicResponse": [
        (1, "name", "string", "singular"),
        (2, "subscriptions", "string", "repeated"),
        (3, "broker_id", "string", "singular"),
        (4, "delivery", "string", "singular"),
        (5, "schema_subject", "string", "optional"),
        (6, "schema_id", "uint64", "optional"),
        (7, "schema_version", "uint32", "optional"),
        (8, "schema_type", "string", "optional"),
        (9, "compatibility_mode", "string", "optional"),
    ],
    "UnloadBrokerRequest": [
        (1, "broker_id", "string", "singular"),
        (2, "max_parallel", "uint32", "singular"),
        (3, "namespaces_include", "string", "repeated"),
        (4, "namespaces_exclude", "string", "repeated"),
        (5, "dry_run", "bool", "singular"),
        (6, "timeout_seconds", "uint32", "singular"),
    ],
    "UnloadBrokerResponse": [
        (1, "started", "bool", "singular"),
        (2, "total", "uint32", "singular"),
        (3, "succeeded", "uint32", "singular"),
        (4, "failed", "uint32", "singular"),
        (5, "pending", "uint32", "singular"),
        (6, "failed_topics", "string", "repeated"),
    ],
    "ActivateBrokerRequest": [
        (1, "broker_id", "string", "singular"),
        (2, "reason", "string", "singular"),
    ],
    "ActivateBrokerResponse": [
        (1, "success", "bool", "singular"),
    ],
    "ClusterBalanceRequest": [],
    "ClusterBalanceResponse": [
        (1, "coefficient_of_variation", "double", "singular"),
        (2, "mean_load", "double", "singular"),
        (3, "max_load", "double", "singular"),
        (4, "min_load", "double", "singular"),
        (5, "std_deviation", "double", "singular"),
        (6, "broker_count", "uint32", "singular"),
        (7, "brokers", "BrokerLoadInfo", "repeated"),
        (8, "assignment_strategy", "string", "singular"),
    ],
    "BrokerLoadInfo": [
        (1, "broker_id", "uint64", "singular"),
        (2, "load", "double", "singular"),
        (3, "topic_count", "uint32", "singular"),
        (4, "is_overloaded", "bool", "singular"),
        (5, "is_underloaded", "bool", "singular"),
    ],
    "RebalanceRequest": [
        (1, "dry_run", "bool", "singular"),
        (2, "max_moves", "uint32", "optional"),
    ],
    "RebalanceResponse": [
        (1, "success", "bool", "singular"),
        (2, "moves_executed", "uint32", "singular"),
        (3, "proposed_moves", "ProposedMove", "repeated"),
        (4, "error_message", "string", "singular"),
    ],
    "ProposedMove": [
        (1, "topic_name", "string", "singular"),
        (2, "from_broker", "uint64", "singular"),
        (3, "to_broker", "uint64", "singular"),
        (4, "estimated_load", "double", "singular"),
        (5, "reason", "string", "singular"),
    ],
}


_DUMP_DESCRIPTOR = """
import importlib, sys
from google.protobuf import descriptor_pb2
fdp = descriptor_pb2.FileDescriptorProto()
importlib.import_module(sys.argv[1]).DESCRIPTOR.CopyToProto(fdp)
sys.stdout.buffer.write(fdp.SerializeToString())
"""


def _load_descriptor(module: str) -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto of a generated module, imported in a fresh interpreter (see the docstring)."""
    r = subprocess.run([sys.executable, "-c", _DUMP_DESCRIPTOR, module], cwd=ROOT, capture_output=True,
                       timeout=60)
    assert r.returncode == 0, f"importing {module} failed:\n{r.stderr.decode()}"
    return FDP.FromString(r.stdout)


def _strip_json_names(messages: Any) -> None:
    for message in messages:
        for field in (*message.field, *message.extension):
            field.ClearField("json_name")
        _strip_json_names(message.nested_type)


def _normalized(fdp: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """The appendix recipe: drop what protoc versions and build setups vary in but the wire never sees."""
    out = FDP()
    out.CopyFrom(fdp)
    out.ClearField("source_code_info")
    out.ClearField("options")
    for ext in out.extension:
        ext.ClearField("json_name")
    _strip_json_names(out.message_type)
    return out


def test_reference_is_danube_client_0_5_0() -> None:
    assert importlib.metadata.version("danube-client") == "0.5.0"


@pytest.mark.parametrize("name", SHARED_WITH_CLIENT)
def test_descriptor_matches_client(name: str) -> None:
    theirs = _normalized(_load_descriptor(f"danube.proto.{name}_pb2"))
    ours = _normalized(_load_descriptor(f"danube_fast.proto.{name}_pb2"))
    assert (ours.name, theirs.name) == (f"{name}.proto", f"{name}.proto")
    if ours.SerializeToString(deterministic=True) != theirs.SerializeToString(deterministic=True):
        diff = difflib.unified_diff(text_format.MessageToString(theirs).splitlines(),
                                    text_format.MessageToString(ours).splitlines(),
                                    f"danube-client 0.5.0 {name}.proto", f"danube_fast {name}.proto",
                                    lineterm="")
        pytest.fail(f"{name}.proto differs from the client's descriptor:\n" + "\n".join(diff))


@pytest.mark.parametrize("name", SHARED_WITH_CLIENT)
def test_client_and_our_gencode_share_one_process(name: str) -> None:
    """Tests that drive the real client against our server import both; the shared pool only accepts the
    second registration of a file name because the embedded descriptors are identical."""
    theirs = importlib.import_module(f"danube.proto.{name}_pb2")
    ours = importlib.import_module(f"danube_fast.proto.{name}_pb2")
    assert ours.DESCRIPTOR.serialized_pb == theirs.DESCRIPTOR.serialized_pb


class _RecordingChannel:
    """Stands in for a grpc channel: records the method path and call kind each stub registers."""

    def __init__(self) -> None:
        self.methods: dict[str, str] = {}

    def _recorder(self, kind: str) -> Callable[..., None]:
        def record(path: str, *args: object, **kwargs: object) -> None:
            self.methods[path] = kind
        return record

    def __getattr__(self, kind: str) -> Callable[..., None]:
        if kind not in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            raise AttributeError(kind)
        return self._recorder(kind)


def _stub_methods(grpc_module: ModuleType) -> dict[str, str]:
    channel = _RecordingChannel()
    for attr, stub in vars(grpc_module).items():
        if attr.endswith("Stub") and isinstance(stub, type):
            stub(channel)
    return channel.methods


@pytest.mark.parametrize("name", SHARED_WITH_CLIENT)
def test_stub_paths_match_client(name: str) -> None:
    theirs = _stub_methods(importlib.import_module(f"danube.proto.{name}_pb2_grpc"))
    ours = _stub_methods(importlib.import_module(f"danube_fast.proto.{name}_pb2_grpc"))
    assert theirs
    assert ours == theirs


_STREAMING = {"unary": "unary_unary", "server-streaming": "unary_stream"}


def test_admin_stub_paths_match_contract() -> None:
    ours = _stub_methods(importlib.import_module("danube_fast.proto.DanubeAdmin_pb2_grpc"))
    assert ours == {path: _STREAMING[kind] for path, _, _, kind in ADMIN_METHODS}


@pytest.fixture(scope="module")
def admin() -> descriptor_pb2.FileDescriptorProto:
    return _load_descriptor("danube_fast.proto.DanubeAdmin_pb2")


def _local_name(type_name: str) -> str:
    package_prefix = ".danube_admin."
    assert type_name.startswith(package_prefix), type_name
    return type_name.removeprefix(package_prefix)


def test_admin_file_and_methods(admin: descriptor_pb2.FileDescriptorProto) -> None:
    assert (admin.name, admin.package, admin.syntax) == ("DanubeAdmin.proto", "danube_admin", "proto3")
    methods = [
        (f"/{admin.package}.{service.name}/{method.name}", _local_name(method.input_type),
         _local_name(method.output_type),
         {(False, False): "unary", (False, True): "server-streaming"}[
             (method.client_streaming, method.server_streaming)])
        for service in admin.service for method in service.method
    ]
    assert methods == ADMIN_METHODS


def test_admin_enums(admin: descriptor_pb2.FileDescriptorProto) -> None:
    enums = {enum.name: [(value.number, value.name) for value in enum.value] for enum in admin.enum_type}
    assert enums == ADMIN_ENUMS


def _field_row(message: descriptor_pb2.DescriptorProto,
               field: descriptor_pb2.FieldDescriptorProto) -> tuple[int, str, str, str]:
    if field.type == FIELD.TYPE_MESSAGE:
        type_ = _local_name(field.type_name)
    elif field.type == FIELD.TYPE_ENUM:
        type_ = f"{_local_name(field.type_name)} (enum)"
    else:
        type_ = FIELD.Type.Name(field.type).removeprefix("TYPE_").lower()
    if field.label == FIELD.LABEL_REPEATED:
        label = "repeated"
    elif field.proto3_optional:
        label = "optional"
    elif field.HasField("oneof_index"):
        label = f"oneof `{message.oneof_decl[field.oneof_index].name}`"
    else:
        label = "singular"
    return field.number, field.name, type_, label


def test_admin_declares_exactly_the_contract_messages(admin: descriptor_pb2.FileDescriptorProto) -> None:
    assert [m.name for m in admin.message_type] == list(ADMIN_MESSAGES)
    assert not [m.name for m in admin.message_type if m.nested_type or m.enum_type]


@pytest.mark.parametrize("message_name", list(ADMIN_MESSAGES))
def test_admin_message_fields(admin: descriptor_pb2.FileDescriptorProto, message_name: str) -> None:
    message = next(m for m in admin.message_type if m.name == message_name)
    assert [_field_row(message, field) for field in message.field] == ADMIN_MESSAGES[message_name]


def _generated_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.is_file() and p.name.endswith(GENERATED))


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    """Runs the Makefile's own `proto` recipe into a scratch directory (`-o` keeps make from reinstalling
    the venv first) with this interpreter's tools and compares the output with the checked-in files."""
    make = shutil.which("make")
    assert make, "make is needed (scripts/system-deps.sh installs it)"
    r = subprocess.run([make, "-s", "-o", ".venv/.installed", "proto", f"PROTO_OUT={tmp_path}",
                        f"BIN={Path(sys.executable).parent}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _generated_files(tmp_path) == sorted(f"{n}{suffix}" for n in ALL_PROTOS for suffix in GENERATED)
    assert _generated_files(PROTO_DIR) == _generated_files(tmp_path)
    stale = []
    for name in _generated_files(tmp_path):
        fresh, checked_in = (tmp_path / name).read_text(), (PROTO_DIR / name).read_text()
        if fresh != checked_in:
            stale.append("\n".join(difflib.unified_diff(checked_in.splitlines(), fresh.splitlines(),
                                                          f"checked-in {name}", f"make proto {name}",
                                                          lineterm="", n=1)))
    assert not stale, "generated code is stale, run `make proto`:\n" + "\n".join(stale)[:20000]


@pytest.mark.parametrize("name", [f"{n}{suffix}" for n in ALL_PROTOS for suffix in GENERATED])
def test_generated_files_say_so(name: str) -> None:
    head = (PROTO_DIR / name).read_text().splitlines()[:2]
    assert any("Generated by the" in line and "DO NOT EDIT!" in line for line in head), head


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _requirement(requirements: list[str], name: str, operator: str) -> str:
    found = [req.removeprefix(name + operator) for req in requirements if req.startswith(name + operator)]
    assert len(found) == 1, f"expected one {name}{operator}... in {requirements}"
    return found[0]


def test_dependency_floors_cover_the_gencode() -> None:
    """The generated modules refuse to import on a grpcio or protobuf older than the versions stamped in them,
    so the dependency floors must be at least those; grpcio-tools must be the pinned one (it decides them)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dependencies = project["dependencies"]
    grpc_floor = _version(_requirement(dependencies, "grpcio", ">="))
    protobuf_floor = _version(_requirement(dependencies, "protobuf", ">="))
    tools_pin = _requirement(project["optional-dependencies"]["test"], "grpcio-tools", "==")
    assert importlib.metadata.version("grpcio-tools") == tools_pin
    for name in ALL_PROTOS:
        grpc_code = (PROTO_DIR / f"{name}_pb2_grpc.py").read_text()
        stamped = re.search(r"^GRPC_GENERATED_VERSION = '([\d.]+)'$", grpc_code, re.MULTILINE)
        assert stamped, f"{name}_pb2_grpc.py carries no GRPC_GENERATED_VERSION"
        assert grpc_floor >= _version(stamped.group(1))
        pb2_code = (PROTO_DIR / f"{name}_pb2.py").read_text()
        stamped = re.search(r"^# Protobuf Python Version: ([\d.]+)$", pb2_code, re.MULTILINE)
        assert stamped, f"{name}_pb2.py carries no protobuf version"
        assert protobuf_floor >= _version(stamped.group(1))

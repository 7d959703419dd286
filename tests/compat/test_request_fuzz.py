"""Random requests to every unary and server-streaming method of every service a broker serves (the Danube
API, the fast API, the admin API, the schema registry, the security admin), built from each method's
request descriptor with hostile values: empty, huge, control characters, unknown enum numbers, the largest
integers, valid names mixed in so that calls reach past the first check.

What a bug looks like, and what this test refuses: a status UNKNOWN (an exception no handler turned into a
status), an INTERNAL that a handler produced from an unexpected exception (`<method> failed: ...`, logged
with a traceback), a call that does not end within its deadline, a broker that stops answering, or one
that does not restart cleanly afterwards. Seeded: a failure names its seed and the request; FUZZ_SEED and
FUZZ_CALLS run it longer (seed 7 with 250 calls per method found nothing either).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from compat_support import run_async
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from danube_fast.proto import (
    DanubeAdmin_pb2,
    DanubeApi_pb2,
    FastApi_pb2,
    SchemaRegistry_pb2,
    SecurityAdmin_pb2,
)
from danube_fast.testing.broker import Broker, BrokerFactory

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SEED = int(os.environ.get("FUZZ_SEED", "20261125"))
CALLS_PER_METHOD = int(os.environ.get("FUZZ_CALLS", "60"))
DEADLINE = 5.0
STRINGS = ["", "/", "//", "/default/fuzz", "/default/fuzz-part-0", "default", "fuzz", "s", "users", "a" * 300,
           "/" + "n" * 70 + "/t", "\x00", "\n\r", "é\u202e", "../../etc", "*", "%s%n", "-1", "Exclusive",
           "http://127.0.0.1:1", "none", "enforce", "json_schema", "avro", '{"type":"string"}', "x" * 5000]
INTS = [0, 1, 2, 7, 255, 2**31 - 1, 2**31, 2**32 - 1, 2**53, 2**63 - 1]
SERVICES = [(module, service) for module in (DanubeApi_pb2, FastApi_pb2, DanubeAdmin_pb2, SchemaRegistry_pb2,
                                             SecurityAdmin_pb2)
            for service in module.DESCRIPTOR.services_by_name.values()]
# The calls that leave the broker unable to serve on by design (draining the only broker).
SKIP = {"UnloadBroker"}


def methods() -> Iterator[tuple[str, MethodDescriptor]]:
    for _, service in SERVICES:
        for method in service.methods:
            if not method.client_streaming and method.name not in SKIP:
                yield service.full_name, method


def fill(message: Message, rng: random.Random, depth: int = 0) -> Message:
    for field in message.DESCRIPTOR.fields:
        if rng.random() < 0.3:
            continue  # absent
        repeated = field.is_repeated
        for _ in range(rng.randint(0, 3) if repeated else 1):
            value = _value(message, field, rng, depth)
            if value is None:
                continue
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                if field.message_type.GetOptions().map_entry:
                    getattr(message, field.name)[rng.choice(STRINGS)] = rng.choice(STRINGS)
                elif repeated:
                    getattr(message, field.name).add().CopyFrom(value)
                else:
                    getattr(message, field.name).CopyFrom(value)
            elif repeated:
                getattr(message, field.name).append(value)
            else:
                setattr(message, field.name, value)
    return message


def _value(message: Message, field: FieldDescriptor, rng: random.Random, depth: int) -> Any:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        if depth > 3:
            return None
        return fill(GetMessageClass(field.message_type)(), rng, depth + 1)
    if kind == FieldDescriptor.TYPE_STRING:
        return rng.choice(STRINGS)
    if kind == FieldDescriptor.TYPE_BYTES:
        return rng.choice([b"", b"\x00" * 3, rng.randbytes(rng.randint(1, 200)), b'{"type":"string"}',
                           b"\xff" * 70_000])
    if kind == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if kind == FieldDescriptor.TYPE_ENUM:
        return rng.choice([*[v.number for v in field.enum_type.values], 99]) if field.enum_type.values else 0
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return rng.choice([0.0, -1.0, 1e300])
    bits = 32 if kind in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_INT32,
                          FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_SINT32,
                          FieldDescriptor.TYPE_SFIXED32) else 64
    signed = kind in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64,
                      FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
                      FieldDescriptor.TYPE_SFIXED32, FieldDescriptor.TYPE_SFIXED64)
    top = 2 ** (bits - 1) - 1 if signed else 2**bits - 1
    return min(rng.choice(INTS), top) * (rng.choice([1, -1]) if signed else 1)


async def hammer(broker: Broker, seed: int) -> list[str]:
    """Every method, CALLS_PER_METHOD random requests each; the problems found."""
    rng = random.Random(seed)
    problems: list[str] = []
    async with grpc.aio.insecure_channel(broker.target) as client, \
            grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as admin:
        for service, method in methods():
            channel = admin if service.startswith(("danube_admin", "danube_fast.security")) else client
            request_type = GetMessageClass(method.input_type)
            path = f"/{service}/{method.name}"
            for n in range(CALLS_PER_METHOD):
                request = fill(request_type(), rng)
                problem = await _call(channel, path, method, request)
                if problem is not None:
                    problems.append(f"{path} call {n} (seed {seed}): {problem}; request {request!r:.300}")
    return problems


async def _call(channel: grpc.aio.Channel, path: str, method: MethodDescriptor, request: Message
                ) -> str | None:
    serialize = type(request).SerializeToString
    try:
        if method.server_streaming:
            call = channel.unary_stream(path, request_serializer=serialize, response_deserializer=bytes)(
                request, timeout=DEADLINE)
            async for _ in call:
                break  # a stream that answers once is enough; cancelled below
            call.cancel()
        else:
            await channel.unary_unary(path, request_serializer=serialize, response_deserializer=bytes)(
                request, timeout=DEADLINE)
    except grpc.aio.AioRpcError as e:
        code, details = e.code(), e.details() or ""
        if code == grpc.StatusCode.UNKNOWN or (code == grpc.StatusCode.INTERNAL and " failed: " in details
                                               and "Error(" in details):
            return f"{code.name}: {details[:300]}"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and not method.server_streaming:
            return "no answer within the deadline"
    return None


def test_random_requests_get_statuses_and_the_broker_restarts(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start()
    problems = run_async(hammer(broker, SEED), timeout=250)
    assert not problems, "\n".join(problems[:10])
    assert "Traceback" not in broker.log_path.read_text(), broker.log_path.read_text()[-4000:]
    broker.restart()  # SIGTERM must end it with exit 0, and it must come back on its data
    assert broker.running


def test_the_generator_covers_every_method() -> None:
    names = {m.name for _, m in methods()}
    assert {"SendMessage", "Subscribe", "RegisterSchema", "CreateTopic", "DescribeTopic", "Offsets",
            "Read", "ReceiveMessages"} <= names
    rng = random.Random(1)
    for _, method in methods():
        request = fill(GetMessageClass(method.input_type)(), rng)
        type(request).FromString(request.SerializeToString())

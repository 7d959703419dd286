"""The schema registry through the official client: `client.schema()` calls, producers with a schema
subject (latest, pinned and minimum versions), topic validation policies on publish, the admin port's schema
fields, and the status codes of docs/WIRE.md C.13 (also B.11, C.4, C.14, D.15)."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from compat_support import Session, bounded, rpc_error, run_async, status_line
from danube import CompatibilityMode, SchemaType, SubType
from danube.proto import SchemaRegistry_pb2 as spb
from danube.proto import SchemaRegistry_pb2_grpc as spb_grpc

from danube_fast.proto import DanubeAdmin_pb2 as admin
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc
from danube_fast.testing.broker import Broker

CODE = grpc.StatusCode


def person(*extra: str, required: tuple[str, ...] = ("name",)) -> bytes:
    props = {"name": {"type": "string"}, **{e: {"type": "string"} for e in extra}}
    return json.dumps({"type": "object", "properties": props, "required": list(required)},
                      indent=2).encode()


async def register(s: Session, subject: str, data: bytes, kind: Any = SchemaType.JSON_SCHEMA) -> int:
    builder = s.client.schema().register_schema(subject).with_type(kind).with_schema_data(data)
    return int(await bounded(builder.execute(), f"register {subject}"))


async def schema_producer(s: Session, topic: str, name: str, *, subject: str, pinned: int | None = None,
                          minimum: int | None = None) -> Any:
    builder = s.client.new_producer().with_topic(topic).with_name(name)
    if pinned is not None:
        builder = builder.with_schema_version(subject, pinned)
    elif minimum is not None:
        builder = builder.with_schema_min_version(subject, minimum)
    else:
        builder = builder.with_schema_subject(subject)
    producer = builder.build()
    await bounded(producer.create(), f"create producer {name} on {topic} with subject {subject}", 15.0)
    s._producers.append(producer)  # closed with the session
    return producer


class Stubs:
    """Raw SchemaRegistry stubs (the client's descriptors) on one port, and TopicAdmin on the admin port."""

    def __init__(self, broker: Broker, port: int | None = None) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port or broker.broker_port}")
        self.registry: Any = spb_grpc.SchemaRegistryStub(self.channel)  # type: ignore[no-untyped-call]
        self.admin_channel = grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}")
        self.admin: Any = admin_grpc.TopicAdminStub(self.admin_channel)  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self.channel.close()
        await self.admin_channel.close()


def test_schema_registry_client_calls(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        stubs = Stubs(broker)
        try:
            async with Session(broker.url) as s:
                reg = s.client.schema()
                sid = await register(s, "cli-people", person())
                again = await stubs.registry.RegisterSchema(spb.RegisterSchemaRequest(
                    subject="cli-people", schema_type="json", schema_definition=person()))
                assert (again.schema_id, again.version, again.is_new_version) == (sid, 1, False)
                assert again.fingerprint.startswith("sha256:")
                assert await register(s, "cli-people", person("nick")) == sid  # the id is the subject's

                latest = await reg.get_latest_schema("cli-people")
                assert (latest.schema_id, latest.version, latest.subject, latest.schema_type) == (
                    sid, 2, "cli-people", "json_schema")
                assert latest.schema_definition == person("nick")  # the registered bytes, as they came
                v1 = await reg.get_schema_version(sid, 1)
                assert (v1.version, v1.schema_definition, v1.fingerprint) == (1, person(), again.fingerprint)
                assert (await reg.get_schema_by_id(sid)).version == 2
                assert await reg.list_versions("cli-people") == [1, 2]
                full = await stubs.registry.GetLatestSchema(spb.GetLatestSchemaRequest(subject="cli-people"))
                assert (full.compatibility_mode, full.created_by) == ("backward", "danube-py")

                breaking = person("nick", "age", required=("name", "age"))
                ok, errors = await reg.check_compatibility("cli-people", breaking, SchemaType.JSON_SCHEMA)
                assert not ok and any("age" in e for e in errors), errors
                ok, errors = await reg.check_compatibility("cli-people", breaking, SchemaType.JSON_SCHEMA,
                                                           CompatibilityMode.FORWARD)
                assert ok and errors == []
                assert (await reg.set_compatibility_mode("cli-people", CompatibilityMode.NONE))[0]
                assert await register(s, "cli-people", breaking) == sid
                assert await reg.list_versions("cli-people") == [1, 2, 3]
                done, message = await reg.delete_schema_version("cli-people", 2)
                assert done and "2" in message
                assert await reg.list_versions("cli-people") == [1, 3]

                await s.producer(topic, "plain")  # the topic must exist on this broker
                config = await reg.get_topic_schema_config(topic)
                assert (config.schema_subject, config.validation_policy, config.schema_id) == ("", "warn", 0)
                assert (await reg.configure_topic_schema(topic, "cli-people", "Warn"))[0]
                config = await reg.get_topic_schema_config(topic)
                assert (config.schema_subject, config.validation_policy, config.enable_payload_validation,
                        config.schema_id) == ("cli-people", "warn", False, sid)
                assert (await reg.update_topic_validation_policy(topic, "ENFORCE", True))[0]
                config = await reg.get_topic_schema_config(topic)
                assert (config.validation_policy, config.enable_payload_validation) == ("enforce", True)
        finally:
            await stubs.close()

    run_async(scenario())


def test_producer_with_schema_subject_stamps_its_messages(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        stubs = Stubs(broker)
        try:
            async with Session(broker.url) as s:
                sid = await register(s, "orders", person())
                producer = await schema_producer(s, topic, "p", subject="orders")  # auto-creates the topic
                config = await s.client.schema().get_topic_schema_config(topic)
                assert (config.schema_subject, config.schema_id) == ("orders", sid)
                consumer = await s.consumer(topic, "c", "sub", SubType.EXCLUSIVE)
                await bounded(producer.send(b'{"name": "a"}', None), "send")
                got = await consumer.get()
                assert got.HasField("schema_id") and got.HasField("schema_version")
                assert (got.schema_id, got.schema_version, bytes(got.payload)) == (sid, 1, b'{"name": "a"}')
                await consumer.ack(got)

                described = await stubs.admin.DescribeTopic(admin.DescribeTopicRequest(name=topic))
                assert (described.schema_subject, described.schema_id, described.schema_version,
                        described.schema_type, described.compatibility_mode) == (
                    "orders", sid, 1, "json_schema", "BACKWARD")
                plain = await stubs.admin.DescribeTopic(admin.DescribeTopicRequest(name="/default/nothing"))
                assert not plain.HasField("schema_subject") and not plain.HasField("schema_id")

                # The admin API's CreateTopic takes a registered subject, and refuses an unknown one.
                await stubs.admin.CreateTopic(admin.NewTopicRequest(name=topic + "_admin",
                                                                    schema_subject="orders"))
                config = await s.client.schema().get_topic_schema_config(topic + "_admin")
                assert config.schema_subject == "orders"
                refused = await rpc_error(stubs.admin.CreateTopic(admin.NewTopicRequest(
                    name=topic + "_unknown", schema_subject="nobody")), "CreateTopic with an unknown subject")
                assert refused.code() == CODE.NOT_FOUND, status_line(refused)
        finally:
            await stubs.close()

    run_async(scenario())


def test_pinned_and_minimum_versions(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        async with Session(broker.url) as s:
            sid = await register(s, "pinned", person())
            await register(s, "pinned", person("nick"))
            consumer_topic = topic
            await schema_producer(s, consumer_topic, "latest", subject="pinned")
            consumer = await s.consumer(consumer_topic, "c", "sub", SubType.EXCLUSIVE)
            old = await schema_producer(s, consumer_topic, "old", subject="pinned", pinned=1)
            new = await schema_producer(s, consumer_topic, "new", subject="pinned", minimum=2)
            await bounded(old.send(b"v1", None), "send pinned")
            await bounded(new.send(b"v2", None), "send min")
            got = await consumer.get_n(2)
            assert sorted((bytes(m.payload), m.schema_id, m.schema_version) for m in got) == [
                (b"v1", sid, 1), (b"v2", sid, 2)]
            for kwargs in ({"pinned": 5}, {"minimum": 3}):
                with pytest.raises(ValueError):
                    await schema_producer(s, consumer_topic, f"bad-{next(iter(kwargs))}", subject="pinned",
                                          **kwargs)

    run_async(scenario())


def test_enforce_policy_rejects_messages_without_the_topics_schema(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        async with Session(broker.url) as s:
            reg = s.client.schema()
            sid = await register(s, "strict", person())
            other = await register(s, "strict-other", b"bytes", SchemaType.BYTES)
            plain = await s.producer(topic, "plain")
            with_schema = await schema_producer(s, topic, "typed", subject="strict")
            await bounded(plain.send(b"no schema, warn policy", None), "send under warn")
            assert (await reg.update_topic_validation_policy(topic, "enforce"))[0]

            denied = await rpc_error(plain.send(b"no schema", None), "send without schema under enforce")
            assert denied.code() == CODE.PERMISSION_DENIED and "schema_id" in denied.details(), \
                status_line(denied)
            await bounded(with_schema.send(b'{"name": "ok"}', None), "send with the topic's schema")

            async with RawProducer(broker, topic) as raw:
                for schema_id in (other, 987_654):  # another subject's id, and an id nobody has
                    refused = await rpc_error(raw.send(schema_id), f"send with schema_id {schema_id}")
                    assert refused.code() == CODE.PERMISSION_DENIED, status_line(refused)
                await bounded(raw.send(sid), "send with the subject's id")
                assert (await reg.update_topic_validation_policy(topic, "warn"))[0]
                await bounded(raw.send(other), "another subject's id under warn")
                unknown = await rpc_error(raw.send(987_654), "an unknown id under warn")
                assert unknown.code() == CODE.PERMISSION_DENIED, status_line(unknown)

    run_async(scenario())


class RawProducer:
    """A producer made over the raw wire, to send schema ids the official client would not."""

    def __init__(self, broker: Broker, topic: str) -> None:
        self.target, self.topic = broker.target, topic

    async def __aenter__(self) -> RawProducer:
        self.channel = grpc.aio.insecure_channel(self.target)
        self.stub: Any = pb_grpc.ProducerServiceStub(self.channel)  # type: ignore[no-untyped-call]
        made = await self.stub.CreateProducer(pb.ProducerRequest(request_id=1, producer_name="raw",
                                                                 topic_name=self.topic))
        self.producer_id = made.producer_id
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()

    async def send(self, schema_id: int) -> Any:
        return await self.stub.SendMessage(pb.StreamMessage(
            request_id=2, msg_id=pb.MsgID(producer_id=self.producer_id, topic_name=self.topic),
            payload=b'{"name": "raw"}', schema_id=schema_id, schema_version=1))


def test_status_codes(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        stubs = Stubs(broker)
        on_admin = Stubs(broker, broker.admin_port)
        try:
            async with Session(broker.url) as s:
                r = stubs.registry
                await register(s, "codes", person())
                await register(s, "codes-other", b"s", SchemaType.STRING)
                await s.producer(topic, "plain")

                async def expect(call: Any, code: grpc.StatusCode, what: str, text: str = "") -> None:
                    error = await rpc_error(call, what)
                    assert error.code() == code and text in error.details(), f"{what}: {status_line(error)}"

                await expect(r.RegisterSchema(spb.RegisterSchemaRequest(
                    subject="codes", schema_type="yaml", schema_definition=b"x")), CODE.INTERNAL, "bad type")
                await expect(r.RegisterSchema(spb.RegisterSchemaRequest(
                    subject="codes", schema_type="json_schema", schema_definition=b"{bad")), CODE.INTERNAL,
                    "bad definition")
                await expect(r.RegisterSchema(spb.RegisterSchemaRequest(
                    subject="codes", schema_type="json_schema",
                    schema_definition=person("age", required=("name", "age")))), CODE.INTERNAL,
                    "incompatible")
                await expect(r.GetSchema(spb.GetSchemaRequest(schema_id=424_242)), CODE.NOT_FOUND,
                             "unknown id", "Schema not found for ID: 424242")
                await expect(r.GetLatestSchema(spb.GetLatestSchemaRequest(subject="nobody")), CODE.NOT_FOUND,
                             "unknown subject", "Schema not found for subject: nobody")
                await expect(r.ListVersions(spb.ListVersionsRequest(subject="nobody")), CODE.NOT_FOUND,
                             "ListVersions")
                await expect(r.CheckCompatibility(spb.CheckCompatibilityRequest(
                    subject="nobody", new_schema_definition=b"s", schema_type="string")), CODE.INTERNAL,
                    "CheckCompatibility")
                await expect(r.SetCompatibilityMode(spb.SetCompatibilityModeRequest(
                    subject="codes", compatibility_mode="sideways")), CODE.INVALID_ARGUMENT, "bad mode")
                await expect(r.SetCompatibilityMode(spb.SetCompatibilityModeRequest(
                    subject="nobody", compatibility_mode="full")), CODE.INTERNAL, "mode of unknown subject")
                for version, what in ((9, "delete an unknown version"), (1, "delete the only version")):
                    await expect(r.DeleteSchemaVersion(spb.DeleteSchemaVersionRequest(subject="codes",
                                                                                      version=version)),
                                 CODE.INTERNAL, what)
                await expect(r.ConfigureTopicSchema(spb.ConfigureTopicSchemaRequest(
                    topic_name=topic, schema_subject="codes", validation_policy="strict")),
                    CODE.INVALID_ARGUMENT, "bad policy")
                await expect(r.ConfigureTopicSchema(spb.ConfigureTopicSchemaRequest(
                    topic_name=topic, schema_subject="nobody", validation_policy="warn")), CODE.NOT_FOUND,
                    "unknown subject")
                await expect(r.ConfigureTopicSchema(spb.ConfigureTopicSchemaRequest(
                    topic_name="/default/not_here", schema_subject="codes", validation_policy="warn")),
                    CODE.NOT_FOUND, "topic not served")
                await expect(r.UpdateTopicValidationPolicy(spb.UpdateTopicValidationPolicyRequest(
                    topic_name=topic, validation_policy="warn")), CODE.FAILED_PRECONDITION, "no subject")
                await expect(r.UpdateTopicValidationPolicy(spb.UpdateTopicValidationPolicyRequest(
                    topic_name=topic, validation_policy="loud")), CODE.INVALID_ARGUMENT, "bad policy")
                await expect(r.UpdateTopicValidationPolicy(spb.UpdateTopicValidationPolicyRequest(
                    topic_name="/default/not_here", validation_policy="warn")), CODE.NOT_FOUND, "no topic")
                await expect(r.GetTopicSchemaConfig(spb.GetTopicSchemaConfigRequest(
                    topic_name="/default/not_here")), CODE.NOT_FOUND, "config of no topic")

                # CreateProducer's schema_ref (C.4): unregistered or conflicting subjects fail the create.
                with pytest.raises(grpc.aio.AioRpcError) as unregistered:
                    await schema_producer(s, topic + "_new", "p1", subject="nobody")
                assert unregistered.value.code() == CODE.FAILED_PRECONDITION
                assert await s.partitions(topic + "_new") == []  # nothing was auto-created
                await schema_producer(s, topic, "p2", subject="codes")  # the topic adopts "codes"
                with pytest.raises(grpc.aio.AioRpcError) as conflict:
                    await schema_producer(s, topic, "p3", subject="codes-other")
                assert conflict.value.code() == CODE.FAILED_PRECONDITION
                assert "codes" in (conflict.value.details() or "")

                # The same registry answers on the admin port.
                latest = await on_admin.registry.GetLatestSchema(spb.GetLatestSchemaRequest(subject="codes"))
                assert latest.subject == "codes" and latest.version == 1
        finally:
            await stubs.close()
            await on_admin.close()

    run_async(scenario())


def test_registry_and_topic_configuration_survive_a_restart(broker_factory: Any) -> None:
    b = broker_factory.start()
    topic = "/default/restarted"

    async def before() -> int:
        async with Session(b.url) as s:
            sid = await register(s, "kept", person())
            await schema_producer(s, topic, "p", subject="kept")
            assert (await s.client.schema().update_topic_validation_policy(topic, "enforce"))[0]
            return sid

    async def after(sid: int) -> None:
        async with Session(b.url) as s:
            reg = s.client.schema()
            config = await reg.get_topic_schema_config(topic)
            assert (config.schema_subject, config.validation_policy, config.schema_id) == (
                "kept", "enforce", sid)
            assert (await reg.get_latest_schema("kept")).schema_id == sid
            plain = await s.producer(topic, "plain")
            denied = await rpc_error(plain.send(b"no schema", None), "send without schema after restart")
            assert denied.code() == CODE.PERMISSION_DENIED, status_line(denied)
            assert await register(s, "new-after-restart", b"b", SchemaType.BYTES) == sid + 1

    sid = run_async(before())
    b.restart()
    run_async(after(sid))

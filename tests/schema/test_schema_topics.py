"""A topic's schema configuration and the publish gate: subject adoption, validation policies, payload
validation, persistence, and that a topic whose checks cannot refuse anything has no gate."""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from danube_fast.broker.ownership import Unfenced
from danube_fast.broker.topic import NonReliableTopic, Topic
from danube_fast.meta import keys
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.resources import Policy, TopicRoot, TopicSchemaConfig, ValidationPolicy
from danube_fast.names import TopicName
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.schema import (
    InvalidSetting,
    SchemaRegistry,
    SchemaRejected,
    SubjectConflict,
    SubjectNotFound,
    TopicGone,
    TopicSchemas,
)

Run = Callable[..., Any]
PERSON = json.dumps({"type": "object", "properties": {"name": {"type": "string"}},
                     "required": ["name"]}).encode()


@dataclass
class Env:
    store: EmbeddedStore
    registry: SchemaRegistry
    schemas: TopicSchemas

    async def people_and_other(self) -> None:
        """Subjects "people" (JSON Schema PERSON, id 1) and "other" (string, id 2)."""
        await self.registry.register("people", "json_schema", PERSON)
        await self.registry.register("other", "string", b"s")

    async def topic(self, short: str) -> Topic:
        """A topic as the broker has it, with its root key in the store."""
        name = TopicName("default", short)
        await self.store.put(keys.topic_root("default", short), TopicRoot(0).to_json())
        return NonReliableTopic(name, Policy(), Unfenced(self.store))


@asynccontextmanager
async def env_at(path: Path) -> AsyncIterator[Env]:
    store = await EmbeddedStore.open(path / "meta.db")
    try:
        registry = SchemaRegistry(store)
        yield Env(store, registry, TopicSchemas(store, registry))
    finally:
        await store.close()


def msg(schema_id: int | None = None, payload: bytes = b'{"name": "x"}',
        version: int | None = None) -> pb.StreamMessage:
    m = pb.StreamMessage(request_id=1, payload=payload)
    if schema_id is not None:
        m.schema_id = schema_id
    if version is not None:
        m.schema_version = version
    return m


async def accepted(topic: Topic, m: pb.StreamMessage) -> bool:
    assert topic.schema_gate is not None
    try:
        await topic.schema_gate.check(m)
    except SchemaRejected:
        return False
    return True


def test_defaults_and_subject_adoption(run: Run, tmp_path: Path) -> None:
    async def main() -> None:
        async with env_at(tmp_path) as env:
            topic = await env.topic("t")
            config = env.schemas.config(topic)
            assert (config.schema_subject, config.validation_policy, config.enable_payload_validation) == (
                None, ValidationPolicy.WARN, False)
            assert topic.schema_gate is None  # warn without a subject can refuse nothing
            with pytest.raises(SubjectNotFound):
                await env.schemas.assign_subject(topic, "people")
            assert await env.store.get(keys.topic_schema("default", "t")) is None

            await env.people_and_other()
            await env.schemas.assign_subject(topic, "people")
            kv = await env.store.get(keys.topic_schema("default", "t"))
            assert kv is not None
            assert TopicSchemaConfig.from_json(kv.value) == TopicSchemaConfig("people", ValidationPolicy.WARN)
            assert topic.schema_gate is not None and topic.schema_gate.subject_id == 1
            await env.schemas.assign_subject(topic, "people")  # the same subject again: fine
            with pytest.raises(SubjectConflict, match="uses schema subject 'people', cannot use 'other'"):
                await env.schemas.assign_subject(topic, "other")

            info = await env.schemas.describe(topic)
            assert info is not None
            assert (info.subject, info.schema_id, info.version) == ("people", 1, 1)
            assert (info.schema_type, info.compatibility_mode) == ("json_schema", "BACKWARD")
            assert await env.schemas.describe(await env.topic("plain")) is None

    run(main())


def test_a_producers_subject_before_the_stored_config_is_loaded_keeps_it(run: Run, tmp_path: Path) -> None:
    """A topic that has just been loaded (cluster mode: before `load` applied its stored configuration)
    serves a producer with a schema_ref: the stored subject and ENFORCE hold, nothing is overwritten."""
    async def main() -> None:
        async with env_at(tmp_path) as env:
            await env.people_and_other()
            earlier = await env.topic("t")
            await env.schemas.configure(earlier, "people", "enforce", False)
            loaded = await env.topic("t")  # the same topic as a broker that has not applied the config yet
            assert loaded.schema_config is None
            with pytest.raises(SubjectConflict, match="uses schema subject 'people'"):
                await env.schemas.assign_subject(loaded, "other")
            kv = await env.store.get(keys.topic_schema("default", "t"))
            assert kv is not None and TopicSchemaConfig.from_json(kv.value) == TopicSchemaConfig(
                "people", ValidationPolicy.ENFORCE)
            assert loaded.schema_config == TopicSchemaConfig("people", ValidationPolicy.ENFORCE)
            assert loaded.schema_gate is not None  # applied: its sends are checked from now on
            await env.schemas.assign_subject(loaded, "people")  # its own subject: fine

    run(main())


def test_warn_policy_accepts_all_but_unknown_ids(run: Run, tmp_path: Path, caplog: Any) -> None:
    async def main() -> None:
        async with env_at(tmp_path) as env:
            await env.people_and_other()
            topic = await env.topic("t")
            await env.schemas.assign_subject(topic, "people")
            assert await accepted(topic, msg(1))
            assert await accepted(topic, msg(None))
            assert await accepted(topic, msg(2))  # another subject's id: logged, accepted
            assert not await accepted(topic, msg(99))  # no subject has it: refused even under warn

    with caplog.at_level(logging.WARNING, logger="danube_fast.schema"):
        run(main())
    assert any("missing schema_id" in r.getMessage() for r in caplog.records)


def test_enforce_policy(run: Run, tmp_path: Path) -> None:
    async def main() -> None:
        async with env_at(tmp_path) as env:
            await env.people_and_other()
            topic = await env.topic("t")
            await env.schemas.configure(topic, "people", "ENFORCE", False)
            assert env.schemas.config(topic).validation_policy is ValidationPolicy.ENFORCE
            assert await accepted(topic, msg(1))
            assert await accepted(topic, msg(1, payload=b"not even json"))  # payload validation is off
            for bad in (msg(None), msg(2), msg(99)):
                assert not await accepted(topic, bad)
            with pytest.raises(SchemaRejected, match="missing schema_id"):
                assert topic.schema_gate is not None
                await topic.schema_gate.check(msg(None))

            bare = await env.topic("bare")
            await env.schemas.set_config(bare, TopicSchemaConfig(None, ValidationPolicy.ENFORCE))
            assert not await accepted(bare, msg(None)) and not await accepted(bare, msg(1))

            await env.schemas.update_policy(topic, "none", False)
            assert topic.schema_gate is None  # nothing is checked
            assert env.schemas.config(topic).schema_subject == "people"

    run(main())


def test_payload_validation_against_the_messages_version(run: Run, tmp_path: Path) -> None:
    async def main() -> None:
        async with env_at(tmp_path) as env:
            await env.registry.register("people", "json_schema", PERSON)
            await env.registry.set_mode("people", "none")
            v2 = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}},
                             "required": ["id"]}).encode()
            await env.registry.register("people", "json_schema", v2)
            topic = await env.topic("t")
            await env.schemas.configure(topic, "people", "enforce", True)
            assert await accepted(topic, msg(1, b'{"name": "x"}', version=1))
            assert not await accepted(topic, msg(1, b'{"id": 3}', version=1))
            assert await accepted(topic, msg(1, b'{"id": 3}', version=2))
            assert await accepted(topic, msg(1, b'{"id": 3}'))  # no version: the latest
            assert not await accepted(topic, msg(1, b'{"name": "x"}', version=7))  # no such version

            await env.schemas.update_policy(topic, "Warn", True)
            assert await accepted(topic, msg(1, b"garbage", version=1))  # logged, accepted

            await env.registry.register("numbers", "number", b"n")
            numbers = await env.topic("numbers")
            await env.schemas.configure(numbers, "numbers", "enforce", True)
            assert await accepted(numbers, msg(2, struct.pack("<q", 5), version=1))
            assert not await accepted(numbers, msg(2, b"123", version=1))

    run(main())


def test_policy_errors_and_a_deleted_topic(run: Run, tmp_path: Path) -> None:
    async def main() -> None:
        async with env_at(tmp_path) as env:
            await env.registry.register("people", "json_schema", PERSON)
            topic = await env.topic("t")
            with pytest.raises(SubjectConflict, match="no schema subject"):
                await env.schemas.update_policy(topic, "enforce", False)
            with pytest.raises(InvalidSetting):
                await env.schemas.configure(topic, "people", "strict", False)
            with pytest.raises(SubjectNotFound):
                await env.schemas.configure(topic, "nobody", "warn", False)
            await env.store.delete(keys.topic_root("default", "t"))
            with pytest.raises(TopicGone):
                await env.schemas.configure(topic, "people", "warn", False)
            assert await env.store.get(keys.topic_schema("default", "t")) is None

    run(main())


def test_configuration_survives_a_restart(run: Run, tmp_path: Path) -> None:
    async def main() -> None:
        async with env_at(tmp_path) as env:
            await env.registry.register("people", "json_schema", PERSON)
            await env.schemas.configure(await env.topic("t"), "people", "enforce", True)
            await env.topic("plain")
        async with env_at(tmp_path) as env:
            name = TopicName("default", "t")
            topic = NonReliableTopic(name, Policy(), Unfenced(env.store))
            plain = NonReliableTopic(TopicName("default", "plain"), Policy(), Unfenced(env.store))
            await env.schemas.load([topic, plain])
            assert env.schemas.config(topic) == TopicSchemaConfig("people", ValidationPolicy.ENFORCE, True)
            assert topic.schema_gate is not None and topic.schema_gate.subject_id == 1
            assert not await accepted(topic, msg(None))
            assert plain.schema_config is None and plain.schema_gate is None

    run(main())

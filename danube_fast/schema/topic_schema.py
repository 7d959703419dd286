"""A topic's schema configuration (`/topics/{ns}/{topic}/schema`, TopicSchemaConfig) and the gate that
validates what producers publish on it (docs/WIRE.md C.4, C.13).

Configuration: a subject (none until the first producer with a `schema_ref` or ConfigureTopicSchema sets
one), a validation policy (`none`, `warn` or `enforce`; default `warn`) and `enable_payload_validation`.
A topic without a stored configuration has the defaults.

Validation on publish:
* `none`: nothing is checked.
* no subject: `enforce` refuses every message; `warn` accepts them.
* with a subject, a `schema_id` that no subject owns is refused under `warn` and `enforce`;
* under `enforce`, a message without `schema_id`, or with the id of another subject, is refused; under
  `warn` it is accepted and logged (at most once per LOG_EVERY seconds per topic);
* with `enable_payload_validation`, a message carrying the subject's id has its payload validated against
  the version it names (the latest if it names none); a mismatch is handled as the policy says.
Refusals are SchemaRejected: SendMessage answers PERMISSION_DENIED.

Cost on the publish path: a topic whose checks cannot refuse anything (policy `none`, or `warn` without a
subject) has no gate (`topic.schema_gate is None`), so its messages pay one attribute test.

Ownership: the configuration and the gate live on the Topic object, so they go with it when the topic is
deleted; they are changed only here, under one lock (configuration changes are rare; the lock makes "adopt
the subject unless the topic has one" atomic), and written to the store before memory, guarded by the
topic's root key so that a topic deleted meanwhile does not get an orphaned configuration.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from danube_fast.meta import keys
from danube_fast.meta.resources import TopicSchemaConfig, ValidationPolicy
from danube_fast.meta.store import Compare, MetadataStore, Put
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.schema.errors import SchemaRejected, SubjectConflict, SubjectNotFound, TopicGone
from danube_fast.schema.registry import SchemaRegistry
from danube_fast.schema.types import parse_policy, type_of

log = logging.getLogger("danube_fast.schema")

LOG_EVERY = 10.0  # seconds between warnings of one topic under the warn policy
DEFAULT = TopicSchemaConfig(None)


class _Name(Protocol):
    @property
    def namespace(self) -> str: ...

    @property
    def topic(self) -> str: ...


class SchemaTopic(Protocol):
    """What the schema layer needs of a broker Topic (danube_fast.broker.topic.Topic)."""

    @property
    def name(self) -> _Name: ...

    @property
    def full(self) -> str: ...

    @property
    def schema_config(self) -> TopicSchemaConfig | None: ...

    @property
    def schema_gate(self) -> SchemaGate | None: ...

    def set_schema(self, config: TopicSchemaConfig, gate: SchemaGate | None) -> None: ...


class SchemaGate:
    """The checks of one topic's configuration; see the module docstring."""

    def __init__(self, topic: str, config: TopicSchemaConfig, subject_id: int | None,
                 registry: SchemaRegistry) -> None:
        self.topic = topic
        self.subject = config.schema_subject
        self.subject_id = subject_id
        self.enforce = config.validation_policy is ValidationPolicy.ENFORCE
        self.payload_validation = config.enable_payload_validation
        self._registry = registry
        self._logged_at = -LOG_EVERY
        self._unlogged = 0

    async def check(self, msg: pb.StreamMessage) -> None:
        """Return if `msg` may be published; SchemaRejected if not."""
        if self.subject is None:
            raise SchemaRejected(f"Topic {self.topic} requires a schema but none is configured (validation "
                                 "policy enforce)")
        if not msg.HasField("schema_id"):
            self._violation(f"Message missing schema_id for topic {self.topic} (expected schema_id: "
                            f"{self.subject_id}, subject {self.subject!r})")
            return
        schema_id = msg.schema_id
        if schema_id != self.subject_id:
            owner = await self._registry.subject_of(schema_id)
            if owner is None:
                raise SchemaRejected(f"Unknown schema_id {schema_id} on topic {self.topic}: no subject of "
                                     "the registry has it")
            self._violation(f"Schema mismatch for topic {self.topic}: message has schema_id={schema_id} "
                            f"(subject {owner!r}), expected={self.subject_id} (subject {self.subject!r})")
            return
        if self.payload_validation:
            version = msg.schema_version if msg.HasField("schema_version") else None
            validator = await self._registry.validator(self.subject, version)
            problem = validator if isinstance(validator, str) else validator(msg.payload)
            if problem is not None:
                self._violation(f"Payload validation failed on topic {self.topic} (subject {self.subject!r}, "
                                f"version {version if version is not None else 'latest'}): {problem}")

    def _violation(self, reason: str) -> None:
        if self.enforce:
            raise SchemaRejected(reason)
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY:
            more = f" ({self._unlogged} more since the last warning)" if self._unlogged else ""
            log.warning("%s; accepted under the warn policy%s", reason, more)
            self._logged_at, self._unlogged = now, 0
        else:
            self._unlogged += 1


@dataclass(frozen=True)
class TopicSchemaInfo:
    """The schema of a topic with a subject, as DescribeTopic shows it."""

    subject: str
    schema_id: int
    version: int
    schema_type: str
    compatibility_mode: str  # UPPERCASE, as v0.7.3's DescribeTopic has it


class TopicSchemas:
    def __init__(self, store: MetadataStore, registry: SchemaRegistry) -> None:
        self._store = store
        self.registry = registry
        self._lock = asyncio.Lock()

    async def load(self, topics: Iterable[SchemaTopic]) -> None:
        """Apply the stored configuration of each topic (at startup, before the topics serve producers)."""
        for topic in topics:
            key = keys.topic_schema(topic.name.namespace, topic.name.topic)
            kv = await self._store.get(key)
            if kv is not None:
                config = TopicSchemaConfig.from_json(kv.value, key=key)
                await self._apply(topic, config)

    @staticmethod
    def config(topic: SchemaTopic) -> TopicSchemaConfig:
        return topic.schema_config or DEFAULT

    async def configure(self, topic: SchemaTopic, subject: str, policy: str,
                        payload_validation: bool) -> None:
        """ConfigureTopicSchema: set all three (the subject must be registered)."""
        chosen = parse_policy(policy)
        if await self.registry.subject_id(subject) is None:
            raise SubjectNotFound(subject)
        async with self._lock:
            await self._write(topic, TopicSchemaConfig(subject, chosen, payload_validation))

    async def update_policy(self, topic: SchemaTopic, policy: str, payload_validation: bool) -> None:
        """UpdateTopicValidationPolicy: only for a topic that has a subject."""
        chosen = parse_policy(policy)
        async with self._lock:
            current = self.config(topic)
            if current.schema_subject is None:
                raise SubjectConflict(f"topic {topic.full} has no schema subject: configure one first "
                                      "(ConfigureTopicSchema, or a producer with a schema subject)")
            await self._write(topic, TopicSchemaConfig(current.schema_subject, chosen, payload_validation,
                                                       current.extra))

    async def set_config(self, topic: SchemaTopic, config: TopicSchemaConfig) -> None:
        """Store `config` as it is (no checks): for tools and tests."""
        async with self._lock:
            await self._write(topic, config)

    async def assign_subject(self, topic: SchemaTopic, subject: str) -> None:
        """A producer's `schema_ref` (C.4): the topic adopts `subject` if it has none and the subject is
        registered; SubjectConflict if it uses another one, SubjectNotFound if the subject is unknown."""
        current = self.config(topic)
        if current.schema_subject == subject:
            return
        async with self._lock:
            current = await self._stored(topic)
            if current.schema_subject == subject:
                return
            if current.schema_subject is not None:
                raise SubjectConflict(f"Topic '{topic.full}' uses schema subject '{current.schema_subject}', "
                                      f"cannot use '{subject}'")
            if await self.registry.subject_id(subject) is None:
                raise SubjectNotFound(subject)
            await self._write(topic, TopicSchemaConfig(subject, current.validation_policy,
                                                       current.enable_payload_validation, current.extra))

    async def describe(self, topic: SchemaTopic) -> TopicSchemaInfo | None:
        subject = self.config(topic).schema_subject
        if subject is None:
            return None
        try:
            view = await self.registry.latest(subject)
        except SubjectNotFound:
            return None
        return TopicSchemaInfo(subject, view.schema_id, view.version.version,
                               type_of(view.version.schema_def).value, view.compatibility_mode.value.upper())

    async def _stored(self, topic: SchemaTopic) -> TopicSchemaConfig:
        """The topic's configuration, read from the store (and applied) when the topic has none in memory:
        a topic just loaded in cluster mode serves producers before `load` has applied what is stored, and
        a decision on the defaults would overwrite a stored subject or policy."""
        if topic.schema_config is not None:
            return topic.schema_config
        key = keys.topic_schema(topic.name.namespace, topic.name.topic)
        kv = await self._store.get(key)
        if kv is None:
            return DEFAULT
        config = TopicSchemaConfig.from_json(kv.value, key=key)
        await self._apply(topic, config)
        return config

    async def _write(self, topic: SchemaTopic, config: TopicSchemaConfig) -> None:
        ns, short = topic.name.namespace, topic.name.topic
        txn = await self._store.transaction([Compare(keys.topic_root(ns, short), "version", ">", 0)],
                                            [Put(keys.topic_schema(ns, short), config.to_json())])
        if not txn.succeeded:
            raise TopicGone(f"topic {topic.full} was deleted")
        await self._apply(topic, config)

    async def _apply(self, topic: SchemaTopic, config: TopicSchemaConfig) -> None:
        gate = None
        policy = config.validation_policy
        if policy is not ValidationPolicy.NONE and (config.schema_subject is not None
                                                   or policy is ValidationPolicy.ENFORCE):
            subject_id = None
            if config.schema_subject is not None:
                subject_id = await self.registry.subject_id(config.schema_subject)
            gate = SchemaGate(topic.full, config, subject_id, self.registry)
        topic.set_schema(config, gate)

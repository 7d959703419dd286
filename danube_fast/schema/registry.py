"""The schema registry: subjects, their versions and compatibility modes, in the metadata store
(docs/METADATA.md#schema-keys: `/schemas/_global/next_schema_id`, `/schemas/{subject}/metadata`,
`/schemas/{subject}/versions/{version}`, `/schemas/_index/by_id/{schema_id}`).

Semantics (docs/WIRE.md C.13):
* A subject gets its `schema_id` from the global counter (ids start at 1) when its first version is
  registered; the id names the subject, not a version. Versions are 1, 2, ... per subject.
* Registering a definition whose fingerprint equals that of any version returns that version
  (`is_new_version` false). Otherwise the definition must be compatible with the latest version under the
  subject's mode (default backward, see `compat`), and becomes a new version.
* Version numbers are never reused: `latest_version` in the metadata is the highest number ever assigned,
  the latest version is the highest one still present. Deleting a subject's only version is refused, so
  a subject always has a version and its id always resolves (the registry has no subject deletion).

Ownership and consistency: the store is the only state. Every change is one transaction guarded by the
`mod_revision` of what it read (the subject's metadata; for a new subject also the id counter), retried from
a fresh read when another writer got there first, so concurrent registrations never lose an update nor hand
out an id twice. Reads go to the store directly. Two memos live in memory, both safe because what they
remember never changes: schema id -> subject (ids are never reassigned), and the payload validator of a
(subject, version) (versions are immutable; a deleted one is dropped from the memo).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from danube_fast.meta import keys
from danube_fast.meta.resources import (
    CompatibilityMode,
    NextSchemaId,
    SchemaIndexEntry,
    SchemaMetadata,
    SchemaVersion,
)
from danube_fast.meta.store import Compare, Delete, InvalidKey, MetadataStore, Op, Put
from danube_fast.schema.compat import compatibility_errors
from danube_fast.schema.errors import (
    IncompatibleSchema,
    InvalidSchema,
    RegistryContention,
    SchemaNotFound,
    SubjectNotFound,
    VersionNotDeletable,
)
from danube_fast.schema.types import build_definition, mode_name, parse_mode, parse_type
from danube_fast.schema.validators import Validator, validator_for

MAX_ATTEMPTS = 64  # compare-and-swap rounds before a write gives up (each loser re-reads and retries)


@dataclass(frozen=True)
class Registered:
    schema_id: int
    version: int
    is_new_version: bool
    fingerprint: str


@dataclass(frozen=True)
class SchemaView:
    """One version of a subject, with what GetSchema answers around it."""

    schema_id: int
    subject: str
    compatibility_mode: CompatibilityMode
    version: SchemaVersion


def latest_version(meta: SchemaMetadata) -> SchemaVersion:
    return max(meta.versions, key=lambda v: v.version)


class SchemaRegistry:
    def __init__(self, store: MetadataStore, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock
        self._subject_by_id: dict[int, str] = {}
        self._validators: dict[tuple[str, int], Validator] = {}

    async def load(self) -> None:
        """Fill the id memo from the index (it is also filled lazily; this saves the first lookups)."""
        for kv in await self._store.get_prefix(keys.schemas_prefix()):
            try:
                keys.parse_schema_by_id(kv.key)
            except InvalidKey:
                continue
            entry = SchemaIndexEntry.from_json(kv.value, key=kv.key)
            self._subject_by_id[entry.schema_id] = entry.subject

    # -- reads ---------------------------------------------------------------------------------------

    async def metadata(self, subject: str) -> SchemaMetadata:
        try:
            key = keys.schema_metadata(subject)
        except InvalidKey:
            raise SubjectNotFound(subject) from None  # a name that cannot be stored is not registered
        kv = await self._store.get(key)
        if kv is None:
            raise SubjectNotFound(subject)
        return SchemaMetadata.from_json(kv.value, key=key)

    async def subjects(self) -> list[str]:
        """Every registered subject, sorted (a listing of the store: the console's schema page)."""
        out = []
        for kv in await self._store.get_prefix(keys.schemas_prefix()):
            try:
                out.append(keys.parse_schema_metadata(kv.key))
            except InvalidKey:
                continue
        return sorted(out)

    async def subject_id(self, subject: str) -> int | None:
        try:
            return (await self.metadata(subject)).id
        except SubjectNotFound:
            return None

    async def subject_of(self, schema_id: int) -> str | None:
        """The subject that owns `schema_id`, None if no subject does."""
        subject = self._subject_by_id.get(schema_id)
        if subject is None:
            try:
                key = keys.schema_by_id(schema_id)
            except InvalidKey:
                return None
            kv = await self._store.get(key)
            if kv is None:
                return None
            subject = SchemaIndexEntry.from_json(kv.value, key=key).subject
            self._subject_by_id[schema_id] = subject
        return subject

    async def latest(self, subject: str) -> SchemaView:
        meta = await self.metadata(subject)
        return SchemaView(meta.id, subject, meta.compatibility_mode, latest_version(meta))

    async def by_id(self, schema_id: int, version: int | None = None) -> SchemaView:
        """The subject's `version` (its latest if None) of the subject owning `schema_id`."""
        subject = await self.subject_of(schema_id)
        if subject is None:
            raise SchemaNotFound(f"Schema not found for ID: {schema_id}")
        meta = await self.metadata(subject)
        if version is None:
            return SchemaView(meta.id, subject, meta.compatibility_mode, latest_version(meta))
        for v in meta.versions:
            if v.version == version:
                return SchemaView(meta.id, subject, meta.compatibility_mode, v)
        raise SchemaNotFound(f"Schema not found for ID: {schema_id} (subject {subject!r} has no version "
                             f"{version})")

    async def check(self, subject: str, schema_type: str, data: bytes, mode: str | None = None) -> list[str]:
        """Why `data` could not become the subject's next version (empty: it could), under `mode` or, when
        None, the subject's own mode."""
        definition = build_definition(parse_type(schema_type), data)
        meta = await self.metadata(subject)
        chosen = meta.compatibility_mode if mode is None else parse_mode(mode)
        return compatibility_errors(latest_version(meta).schema_def, definition, chosen)

    async def validator(self, subject: str, version: int | None) -> Validator | str:
        """The payload validator of the subject's `version` (its latest if None), or why there is none."""
        if version is not None:
            found = self._validators.get((subject, version))
            if found is not None:
                return found
        try:
            meta = await self.metadata(subject)
        except SubjectNotFound as e:
            return str(e)
        chosen = latest_version(meta) if version is None else next(
            (v for v in meta.versions if v.version == version), None)
        if chosen is None:
            return f"subject {subject!r} has no schema version {version}"
        try:
            validator = validator_for(chosen.schema_def)
        except InvalidSchema as e:  # stored before the registry checked definitions as it does now
            return f"subject {subject!r} version {chosen.version} cannot validate payloads: {e}"
        self._validators[(subject, chosen.version)] = validator
        return validator

    # -- writes --------------------------------------------------------------------------------------

    async def register(self, subject: str, schema_type: str, data: bytes, *, description: str = "",
                       created_by: str = "", tags: Sequence[str] = ()) -> Registered:
        definition = build_definition(parse_type(schema_type), data)
        fingerprint = definition.fingerprint
        assert fingerprint is not None
        try:
            meta_key = keys.schema_metadata(subject)
        except InvalidKey as e:
            raise InvalidSchema(f"invalid subject name {subject!r}: {e}") from e
        id_key = keys.schema_next_id()
        for _ in range(MAX_ATTEMPTS):
            now = int(self._clock())
            kv = await self._store.get(meta_key)
            if kv is None:
                # A new subject: take the next id from the global counter.
                id_kv = await self._store.get(id_key)
                schema_id = max(1, NextSchemaId.from_json(id_kv.value, key=id_key).next_id) if id_kv else 1
                first = SchemaVersion(1, fingerprint, definition, now, created_by, description, tuple(tags),
                                      False)
                meta = SchemaMetadata(schema_id, subject, CompatibilityMode.BACKWARD, 1, (first,), (), now,
                                      created_by, now)
                txn = await self._store.transaction(
                    [Compare(meta_key, "version", "==", 0),
                     Compare(id_key, "mod_revision", "==", id_kv.mod_revision if id_kv else 0)],
                    [Put(id_key, NextSchemaId(schema_id + 1).to_json()), Put(meta_key, meta.to_json()),
                     Put(keys.schema_version(subject, 1), first.to_json()),
                     Put(keys.schema_by_id(schema_id), SchemaIndexEntry(schema_id, subject).to_json())])
                if txn.succeeded:
                    self._subject_by_id[schema_id] = subject
                    return Registered(schema_id, 1, True, fingerprint)
                continue
            meta = SchemaMetadata.from_json(kv.value, key=meta_key)
            for v in meta.versions:
                if v.fingerprint == fingerprint:
                    return Registered(meta.id, v.version, False, fingerprint)
            if meta.versions:
                latest = latest_version(meta)
                errors = compatibility_errors(latest.schema_def, definition, meta.compatibility_mode)
                if errors:
                    raise IncompatibleSchema(subject, mode_name(meta.compatibility_mode), errors)
            number = max([meta.latest_version, *(v.version for v in meta.versions)]) + 1
            added = SchemaVersion(number, fingerprint, definition, now, created_by, description, tuple(tags),
                                  False)
            changed = dataclasses.replace(meta, latest_version=number, versions=(*meta.versions, added),
                                          updated_at=now)
            txn = await self._store.transaction(
                [Compare(meta_key, "mod_revision", "==", kv.mod_revision)],
                [Put(meta_key, changed.to_json()),
                 Put(keys.schema_version(subject, number), added.to_json())])
            if txn.succeeded:
                return Registered(meta.id, number, True, fingerprint)
        raise RegistryContention(f"registering a schema for {subject!r} lost {MAX_ATTEMPTS} races in a row")

    async def set_mode(self, subject: str, mode: str) -> CompatibilityMode:
        chosen = parse_mode(mode)
        await self._modify(subject, lambda meta: (
            dataclasses.replace(meta, compatibility_mode=chosen, updated_at=int(self._clock())), []))
        return chosen

    async def delete_version(self, subject: str, version: int) -> None:
        def change(meta: SchemaMetadata) -> tuple[SchemaMetadata, list[Op]]:
            kept = tuple(v for v in meta.versions if v.version != version)
            if len(kept) == len(meta.versions):
                raise SchemaNotFound(f"subject {subject!r} has no version {version}")
            if not kept:
                raise VersionNotDeletable(f"version {version} is the only version of subject {subject!r}: a "
                                          "subject keeps at least one version")
            return (dataclasses.replace(meta, versions=kept, updated_at=int(self._clock())),
                    [Delete(keys.schema_version(subject, version))])

        await self._modify(subject, change)
        self._validators.pop((subject, version), None)

    async def _modify(self, subject: str,
                      change: Callable[[SchemaMetadata], tuple[SchemaMetadata, list[Op]]]) -> SchemaMetadata:
        """Read the subject's metadata, apply `change`, write it back unless someone changed it meanwhile
        (then start over)."""
        try:
            key = keys.schema_metadata(subject)
        except InvalidKey:
            raise SubjectNotFound(subject) from None
        for _ in range(MAX_ATTEMPTS):
            kv = await self._store.get(key)
            if kv is None:
                raise SubjectNotFound(subject)
            meta = SchemaMetadata.from_json(kv.value, key=key)
            changed, ops = change(meta)
            txn = await self._store.transaction([Compare(key, "mod_revision", "==", kv.mod_revision)],
                                                [Put(key, changed.to_json()), *ops])
            if txn.succeeded:
                return changed
        raise RegistryContention(f"changing subject {subject!r} lost {MAX_ATTEMPTS} races in a row")

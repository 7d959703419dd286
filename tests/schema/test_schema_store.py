"""The registry over a real (embedded) metadata store: ids, versions, dedup, compatibility, modes, deletion,
the stored layout, and no lost update under concurrent registration."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from danube_fast.meta import keys
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.resources import (
    CompatibilityMode,
    NextSchemaId,
    SchemaIndexEntry,
    SchemaKind,
    SchemaMetadata,
    SchemaVersion,
)
from danube_fast.schema import (
    IncompatibleSchema,
    InvalidSchema,
    InvalidSetting,
    SchemaNotFound,
    SchemaRegistry,
    SubjectNotFound,
    VersionNotDeletable,
)

Run = Callable[..., Any]


def user(*extra: str, required: tuple[str, ...] = ("name",)) -> bytes:
    props = {"name": {"type": "string"}, **{e: {"type": "string"} for e in extra}}
    return json.dumps({"type": "object", "properties": props, "required": list(required)}).encode()


@asynccontextmanager
async def registry_at(path: Path) -> AsyncIterator[tuple[EmbeddedStore, SchemaRegistry]]:
    store = await EmbeddedStore.open(path / "meta.db")
    try:
        yield store, SchemaRegistry(store, clock=lambda: 1_768_728_611.5)
    finally:
        await store.close()


def test_ids_per_subject_versions_per_subject_and_dedup(run: Run, tmp_path: Path) -> None:
    async def main() -> None:
        async with registry_at(tmp_path) as (store, reg):
            first = await reg.register("users", "json_schema", user(), created_by="me", description="v1",
                                       tags=["a"])
            assert (first.schema_id, first.version, first.is_new_version) == (1, 1, True)
            again = await reg.register("users", "JSON", b'{"required":["name"],"type":"object",'
                                                        b'"properties":{"name":{"type":"string"}}}')
            assert (again.schema_id, again.version, again.is_new_version) == (1, 1, False)
            assert again.fingerprint == first.fingerprint
            second = await reg.register("users", "json_schema", user("nick"))
            assert (second.schema_id, second.version, second.is_new_version) == (1, 2, True)
            back_to_first = await reg.register("users", "json_schema", user())
            assert (back_to_first.version, back_to_first.is_new_version) == (1, False)
            other = await reg.register("events", "string", b"utf8 text")
            assert (other.schema_id, other.version, other.fingerprint) == (2, 1, "string")
            assert (await reg.register("events", "string", b"other bytes")).is_new_version is False

            # The layout of docs/METADATA.md#schema-keys, readable by the typed resources.
            kv = await store.get(keys.schema_next_id())
            assert kv is not None and NextSchemaId.from_json(kv.value).next_id == 3
            kv = await store.get(keys.schema_by_id(2))
            assert kv is not None and SchemaIndexEntry.from_json(kv.value) == SchemaIndexEntry(2, "events")
            kv = await store.get(keys.schema_metadata("users"))
            assert kv is not None
            meta = SchemaMetadata.from_json(kv.value)
            assert (meta.id, meta.subject, meta.latest_version, meta.compatibility_mode) == (
                1, "users", 2, CompatibilityMode.BACKWARD)
            assert json.loads(kv.value)["compatibility_mode"] == "Backward"
            assert [v.version for v in meta.versions] == [1, 2]
            kv = await store.get(keys.schema_version("users", 1))
            assert kv is not None
            v1 = SchemaVersion.from_json(kv.value)
            assert (v1.created_by, v1.description, v1.tags, v1.created_at, v1.is_deprecated) == (
                "me", "v1", ("a",), 1_768_728_611, False)
            assert v1.schema_def.kind is SchemaKind.JSON_SCHEMA
            assert v1.schema_def.raw_schema == user().decode()

    run(main())


def test_reads_by_id_version_and_latest(run: Run, tmp_path: Path) -> None:
    async def main() -> None:
        async with registry_at(tmp_path) as (_, reg):
            await reg.register("users", "json_schema", user())
            await reg.register("users", "json_schema", user("nick"))
            latest = await reg.latest("users")
            assert (latest.schema_id, latest.version.version, latest.subject) == (1, 2, "users")
            v1 = await reg.by_id(1, 1)
            assert v1.version.version == 1 and v1.version.schema_def.raw_schema == user().decode()
            assert (await reg.by_id(1)).version.version == 2
            with pytest.raises(SchemaNotFound, match="Schema not found for ID: 9"):
                await reg.by_id(9)
            with pytest.raises(SchemaNotFound, match="Schema not found for ID: 1"):
                await reg.by_id(1, 7)
            for subject in ("nobody", "", "a/b", "_index"):
                with pytest.raises(SubjectNotFound, match="Schema not found for subject"):
                    await reg.latest(subject)
            assert await reg.subject_of(1) == "users" and await reg.subject_of(5) is None
            assert await reg.subject_id("users") == 1 and await reg.subject_id("nobody") is None

    run(main())


def test_compatibility_is_checked_against_the_latest_by_the_subjects_mode(run: Run, tmp_path: Path) -> None:
    async def main() -> None:
        async with registry_at(tmp_path) as (store, reg):
            await reg.register("users", "json_schema", user())
            breaking = user("age", required=("name", "age"))  # a new required field breaks backward
            assert await reg.check("users", "json_schema", breaking)
            assert await reg.check("users", "json_schema", breaking, "forward") == []
            with pytest.raises(IncompatibleSchema, match="backward") as caught:
                await reg.register("users", "json_schema", breaking)
            assert caught.value.errors and "'age'" in caught.value.errors[0]
            assert [v.version for v in (await reg.metadata("users")).versions] == [1]
            with pytest.raises(IncompatibleSchema, match="Schema types must match"):
                await reg.register("users", "string", b"s")

            assert await reg.set_mode("users", "NONE") is CompatibilityMode.NONE
            assert (await reg.register("users", "json_schema", breaking)).version == 2
            assert (await reg.register("users", "string", b"s")).version == 3
            assert await reg.set_mode("users", "full") is CompatibilityMode.FULL
            kv = await store.get(keys.schema_metadata("users"))
            assert kv is not None and json.loads(kv.value)["compatibility_mode"] == "Full"
            with pytest.raises(InvalidSetting):
                await reg.set_mode("users", "sideways")
            with pytest.raises(SubjectNotFound):
                await reg.set_mode("nobody", "full")
            with pytest.raises(SubjectNotFound):
                await reg.check("nobody", "string", b"s")
            with pytest.raises(InvalidSchema):
                await reg.register("users", "yaml", b"x")
            with pytest.raises(InvalidSchema):
                await reg.register("a/b", "string", b"x")

    run(main())


def test_delete_version_never_reuses_numbers_and_keeps_one_version(run: Run, tmp_path: Path) -> None:
    async def main() -> None:
        async with registry_at(tmp_path) as (store, reg):
            for extra in ((), ("a",), ("a", "b")):
                await reg.register("users", "json_schema", user(*extra))
            await reg.delete_version("users", 3)
            assert await store.get(keys.schema_version("users", 3)) is None
            assert (await reg.latest("users")).version.version == 2
            assert (await reg.register("users", "json_schema", user("c"))).version == 4  # 3 is not reused
            await reg.delete_version("users", 1)
            assert [v.version for v in (await reg.metadata("users")).versions] == [2, 4]
            with pytest.raises(SchemaNotFound):
                await reg.by_id(1, 1)
            with pytest.raises(SchemaNotFound):
                await reg.delete_version("users", 1)
            await reg.delete_version("users", 2)
            with pytest.raises(VersionNotDeletable):
                await reg.delete_version("users", 4)
            with pytest.raises(SubjectNotFound):
                await reg.delete_version("nobody", 1)
            assert (await reg.by_id(1)).version.version == 4

    run(main())


def test_concurrent_registrations_lose_nothing(run: Run, tmp_path: Path) -> None:
    async def main() -> None:
        async with registry_at(tmp_path) as (_, reg):
            await reg.register("users", "json_schema", user())
            done = await asyncio.gather(*(reg.register("users", "json_schema", user(f"f{i}"))
                                          for i in range(16)))
            assert sorted(d.version for d in done) == list(range(2, 18))
            assert all(d.is_new_version and d.schema_id == 1 for d in done)
            meta = await reg.metadata("users")
            assert sorted(v.version for v in meta.versions) == list(range(1, 18))
            assert meta.latest_version == 17
            by_version = {d.version: d.fingerprint for d in done}
            assert all(by_version[v.version] == v.fingerprint for v in meta.versions if v.version > 1)

            subjects = await asyncio.gather(*(reg.register(f"s{i}", "bytes", b"b") for i in range(12)))
            assert sorted(s.schema_id for s in subjects) == list(range(2, 14))
            same = await asyncio.gather(*(reg.register("dup", "string", b"s") for _ in range(6)))
            assert {s.schema_id for s in same} == {14} and sum(s.is_new_version for s in same) == 1

    run(main())


def test_a_new_registry_over_the_same_store_sees_everything(run: Run, tmp_path: Path) -> None:
    async def main() -> None:
        async with registry_at(tmp_path) as (_, reg):
            await reg.register("users", "avro", json.dumps(
                {"type": "record", "name": "U", "fields": [{"name": "id", "type": "long"}]}).encode())
        async with registry_at(tmp_path) as (_, reg):
            await reg.load()
            assert await reg.subject_of(1) == "users"
            assert (await reg.latest("users")).version.schema_def.kind is SchemaKind.AVRO
            assert (await reg.register("other", "number", b"n")).schema_id == 2

    run(main())


def test_a_stored_version_that_no_longer_compiles_refuses_payloads_with_a_reason(run: Run,
                                                                                  tmp_path: Path) -> None:
    """Definitions stored before the registry checked them against the metaschema may not compile now:
    validating against one answers why instead of raising on the publish path."""
    async def main() -> None:
        async with registry_at(tmp_path) as (store, reg):
            await reg.register("users", "json_schema", user())
            kv = await store.get(keys.schema_metadata("users"))
            assert kv is not None
            meta = SchemaMetadata.from_json(kv.value)
            old = meta.versions[0]
            stale = replace(old, schema_def=replace(old.schema_def, raw_schema='{"minLength": -1}'))
            await store.put(keys.schema_metadata("users"), replace(meta, versions=(stale,)).to_json())
        async with registry_at(tmp_path) as (_, reg):
            await reg.load()
            found = await reg.validator("users", 1)
            assert isinstance(found, str) and "version 1 cannot validate payloads" in found
            assert "minimum of 0" in found

    run(main())

"""Compatibility of a new definition with the latest one, by mode (docs/WIRE.md C.13).

* `none`: everything is compatible.
* `backward`: the new schema reads data written with the old one (consumers upgrade first). A field the new
  schema requires (JSON Schema: `required` without a `default`; Avro: a field without a default) that the
  old one did not guarantee breaks it.
* `forward`: the old schema reads data written with the new one (producers upgrade first). Removing a field
  the old schema requires (JSON Schema: `required` without a `default`; Avro: a field without a default)
  breaks it.
* `full`: both.

A change of schema type is incompatible in every mode but `none`. Avro and JSON Schema are checked as
docs/SCHEMAS.md describes (`avro`, `jsonschema`). Protobuf definitions are not parsed, so any protobuf
change is accepted (as v0.7.3 does). `bytes`, `string` and `number` have a single definition each:
always compatible with themselves.
"""

from __future__ import annotations

from danube_fast.meta.resources import CompatibilityMode, SchemaDefinition, SchemaKind
from danube_fast.schema import avro, jsonschema
from danube_fast.schema.types import parsed_json, type_of

_NEW, _OLD = "new schema", "old schema"


def _one_way(old: SchemaDefinition, new: SchemaDefinition, backward: bool) -> list[str]:
    reader, writer = (new, old) if backward else (old, new)
    rl, wl = (_NEW, _OLD) if backward else (_OLD, _NEW)
    label = "backward" if backward else "forward"
    if old.kind is SchemaKind.AVRO:
        errors = avro.resolution_errors(avro.parse(parsed_json(reader)), avro.parse(parsed_json(writer)),
                                        rl, wl)
    elif old.kind is SchemaKind.JSON_SCHEMA:
        errors = jsonschema.acceptance_errors(parsed_json(reader), parsed_json(writer), rl, wl)
    else:
        errors = []
    return [f"{label}: {e}" for e in errors]


def compatibility_errors(old: SchemaDefinition, new: SchemaDefinition, mode: CompatibilityMode) -> list[str]:
    """Why `new` may not follow `old` under `mode` (empty: it may)."""
    if mode is CompatibilityMode.NONE:
        return []
    if old.kind is not new.kind:
        return [f"Schema types must match: cannot change from {type_of(old).value} to {type_of(new).value}"]
    errors: list[str] = []
    if mode in (CompatibilityMode.BACKWARD, CompatibilityMode.FULL):
        errors += _one_way(old, new, backward=True)
    if mode in (CompatibilityMode.FORWARD, CompatibilityMode.FULL):
        errors += _one_way(old, new, backward=False)
    return errors

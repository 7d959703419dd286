"""JSON Schema: a structural check of definitions, compatibility by object structure, and payload validation
over a documented subset of the keywords. Pure Python, no JSON Schema library.

Definitions: an object or a boolean; `type` must name JSON Schema types; the keywords that hold schemas
(`properties`, `items`, `additionalProperties`, `allOf`/`anyOf`/`oneOf`/`not`) must hold schemas; `required`
is an array of strings. Other keywords are accepted and ignored.

Compatibility asks whether a reader schema accepts every instance a writer schema accepts, judged on
structure: types (an `integer` writer is read by a `number` reader), `required` (a field the reader
requires and the writer does not guarantee breaks, unless the reader gives it a `default`), shared
properties recursively, `additionalProperties: false` in the reader against the writer's extra properties,
array `items`, and `enum` sets. Backward is reader = new, writer = old; forward is the reverse. It is an
approximation (it does not reason about `pattern`, numeric bounds or combinators), which errs towards
"compatible" exactly there.

Payload validation supports `type`, `enum`, `const`, `properties`, `required`, `additionalProperties`,
`items` (one schema or an array of them), `minItems`/`maxItems`, `minLength`/`maxLength`,
`minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum`, `pattern`, `allOf`, `anyOf`, `oneOf` and `not`;
`$ref` and the rest are not checked.
"""

from __future__ import annotations

import json
import re
from typing import Any

from danube_fast.schema.errors import InvalidSchema

TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")


def check_schema(schema: Any, where: str = "schema") -> None:
    """InvalidSchema unless `schema` is a structurally valid JSON Schema."""
    try:
        _check(schema, where)
    except RecursionError as e:
        raise InvalidSchema("Invalid JSON Schema: nested too deeply") from e


def _check(schema: Any, where: str) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise InvalidSchema(f"Invalid JSON Schema: {where} must be an object or a boolean")
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        bad = [k for k in kinds if not isinstance(k, str) or k not in TYPES]
        if bad or not kinds:
            raise InvalidSchema(f"Invalid JSON Schema: {where}.type: {bad or kind!r} is not a JSON Schema "
                                "type")
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise InvalidSchema(f"Invalid JSON Schema: {where}.properties must be an object")
        for name, sub in props.items():
            _check(sub, f"{where}.properties.{name}")
    required = schema.get("required")
    if required is not None and (not isinstance(required, list)
                                 or not all(isinstance(r, str) for r in required)):
        raise InvalidSchema(f"Invalid JSON Schema: {where}.required must be an array of strings")
    items = schema.get("items")
    if isinstance(items, list):
        for i, sub in enumerate(items):
            _check(sub, f"{where}.items[{i}]")
    elif items is not None:
        _check(items, f"{where}.items")
    if "additionalProperties" in schema:
        _check(schema["additionalProperties"], f"{where}.additionalProperties")
    if "not" in schema:
        _check(schema["not"], f"{where}.not")
    for key in _SCHEMA_LISTS:
        if key in schema:
            subs = schema[key]
            if not isinstance(subs, list) or not subs:
                raise InvalidSchema(f"Invalid JSON Schema: {where}.{key} must be a non-empty array")
            for i, sub in enumerate(subs):
                _check(sub, f"{where}.{key}[{i}]")
    if "pattern" in schema:
        try:
            re.compile(schema["pattern"])
        except (re.error, TypeError) as e:
            raise InvalidSchema(f"Invalid JSON Schema: {where}.pattern: {e}") from e


# ---------------------------------------------------------------------------------------- compatibility

def _types(schema: Any) -> set[str] | None:
    """The types a schema admits; None for any."""
    if schema is False:
        return set()
    if not isinstance(schema, dict) or "type" not in schema:
        return None
    kind = schema["type"]
    return set(kind) if isinstance(kind, list) else {kind}


def acceptance_errors(reader: Any, writer: Any, reader_label: str, writer_label: str) -> list[str]:
    """Why some instance valid under `writer` may be refused by `reader` (empty: none found)."""
    errors: list[str] = []
    _accepts(reader, writer, "", errors, reader_label, writer_label)
    return errors


def _accepts(reader: Any, writer: Any, path: str, errors: list[str], rl: str, wl: str) -> None:
    where = path or "the top level"
    if reader is True or writer is False:
        return
    rt, wt = _types(reader), _types(writer)
    if rt is not None:
        if wt is None:
            errors.append(f"{where}: the {rl} restricts the type to {sorted(rt)}, the {wl} allows any")
            return
        extra = sorted(t for t in wt if t not in rt and not (t == "integer" and "number" in rt))
        if extra:
            errors.append(f"{where}: the {wl} allows {extra}, the {rl} does not")
    if not isinstance(reader, dict) or not isinstance(writer, dict):
        return
    if isinstance(reader.get("enum"), list):
        w_enum = writer.get("enum")
        if not isinstance(w_enum, list):
            errors.append(f"{where}: the {rl} restricts values to an enum, the {wl} does not")
        else:
            missing = [v for v in w_enum if v not in reader["enum"]]
            if missing:
                errors.append(f"{where}: the {rl}'s enum lacks {missing} of the {wl}")
    r_props: dict[str, Any] = reader.get("properties") or {}
    w_props: dict[str, Any] = writer.get("properties") or {}
    w_required = set(writer.get("required") or ())
    for name in reader.get("required") or ():
        if name not in w_required:
            sub = r_props.get(name)
            if not (isinstance(sub, dict) and "default" in sub):
                at = f"{path}.{name}" if path else name
                errors.append(f"field {at!r} is required by the {rl} (without a default) but not by the {wl}")
    additional = reader.get("additionalProperties", True)
    for name, w_sub in w_props.items():
        at = f"{path}.{name}" if path else name
        if name in r_props:
            _accepts(r_props[name], w_sub, at, errors, rl, wl)
        elif additional is False:
            errors.append(f"field {at!r} of the {wl} is not allowed by the {rl} (additionalProperties false)")
        elif isinstance(additional, dict):
            _accepts(additional, w_sub, at, errors, rl, wl)
    r_items, w_items = reader.get("items"), writer.get("items")
    if isinstance(r_items, dict | bool) and isinstance(w_items, dict | bool):
        _accepts(r_items, w_items, f"{path}[]", errors, rl, wl)


# -------------------------------------------------------------------------------------- validation

def payload_errors(schema: Any, payload: bytes) -> str | None:
    """Why `payload` is not a JSON instance of `schema` (None: it is)."""
    try:
        instance = json.loads(payload)
    except (ValueError, RecursionError) as e:
        return f"Invalid JSON data: {e}"
    errors: list[str] = []
    try:
        _validate(schema, instance, "$", errors)
    except RecursionError:
        return "JSON Schema validation failed: nested too deeply"
    return "JSON Schema validation failed: " + "; ".join(errors[:5]) if errors else None


def _is_type(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or \
            (isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, list)
    return isinstance(value, dict)


def _valid(schema: Any, value: Any) -> bool:
    errors: list[str] = []
    _validate(schema, value, "$", errors)
    return not errors


def _validate(schema: Any, value: Any, path: str, errors: list[str]) -> None:
    if schema is True:
        return
    if schema is False:
        errors.append(f"{path}: no value is allowed")
        return
    if not isinstance(schema, dict):
        return
    kinds = _types(schema)
    if kinds is not None and not any(_is_type(value, k) for k in kinds):
        errors.append(f"{path}: {json.dumps(value)[:40]} is not of type {sorted(kinds)}")
        return
    if "enum" in schema and isinstance(schema["enum"], list) and value not in schema["enum"]:
        errors.append(f"{path}: {json.dumps(value)[:40]} is not one of {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: {json.dumps(value)[:40]} is not {schema['const']!r}")
    if isinstance(value, dict):
        _validate_object(schema, value, path, errors)
    elif isinstance(value, list):
        _validate_array(schema, value, path, errors)
    elif isinstance(value, str):
        if isinstance(schema.get("minLength"), int) and len(value) < schema["minLength"]:
            errors.append(f"{path}: shorter than {schema['minLength']}")
        if isinstance(schema.get("maxLength"), int) and len(value) > schema["maxLength"]:
            errors.append(f"{path}: longer than {schema['maxLength']}")
        if isinstance(schema.get("pattern"), str) and not re.search(schema["pattern"], value):
            errors.append(f"{path}: does not match {schema['pattern']!r}")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _validate_number(schema, value, path, errors)
    for key in ("allOf", "anyOf", "oneOf"):
        subs = schema.get(key)
        if isinstance(subs, list):
            passed = sum(_valid(s, value) for s in subs)
            if (key == "allOf" and passed < len(subs)) or (key == "anyOf" and not passed) or \
                    (key == "oneOf" and passed != 1):
                errors.append(f"{path}: {key} fails ({passed} of {len(subs)} subschemas match)")
    if "not" in schema and _valid(schema["not"], value):
        errors.append(f"{path}: matches the schema under 'not'")


def _validate_object(schema: dict[str, Any], value: dict[str, Any], path: str, errors: list[str]) -> None:
    for name in schema.get("required") or ():
        if name not in value:
            errors.append(f"{path}: required property {name!r} is missing")
    props = schema.get("properties") or {}
    additional = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in props:
            _validate(props[name], item, f"{path}.{name}", errors)
        else:
            _validate(additional, item, f"{path}.{name}", errors)


def _validate_array(schema: dict[str, Any], value: list[Any], path: str, errors: list[str]) -> None:
    items = schema.get("items")
    if isinstance(items, list):
        for i, (sub, item) in enumerate(zip(items, value, strict=False)):
            _validate(sub, item, f"{path}[{i}]", errors)
    elif items is not None:
        for i, item in enumerate(value):
            _validate(items, item, f"{path}[{i}]", errors)
    if isinstance(schema.get("minItems"), int) and len(value) < schema["minItems"]:
        errors.append(f"{path}: fewer than {schema['minItems']} items")
    if isinstance(schema.get("maxItems"), int) and len(value) > schema["maxItems"]:
        errors.append(f"{path}: more than {schema['maxItems']} items")


def _validate_number(schema: dict[str, Any], value: float, path: str, errors: list[str]) -> None:
    def bound(key: str) -> float | None:
        b = schema.get(key)
        return b if isinstance(b, int | float) and not isinstance(b, bool) else None

    low, high = bound("minimum"), bound("maximum")
    xlow, xhigh = bound("exclusiveMinimum"), bound("exclusiveMaximum")
    if (low is not None and value < low) or (xlow is not None and value <= xlow):
        errors.append(f"{path}: {value} is below the minimum")
    if (high is not None and value > high) or (xhigh is not None and value >= xhigh):
        errors.append(f"{path}: {value} is above the maximum")

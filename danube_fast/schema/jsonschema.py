"""JSON Schema: definitions and payloads are checked by jsonschema-rs (the Python binding of the Rust
`jsonschema` crate); the compatibility of two versions is judged by our own rules, which no library offers.

Definitions: the dialect is the one `$schema` names (drafts 4, 6, 7, 2019-09 and 2020-12), 2020-12 without
it. A definition must validate against its dialect's metaschema (so `{"minLength": -1}` or an unknown
`type` is refused) and compile: its patterns must be regular expressions the validator runs, and every
`$ref` must resolve inside the definition (`#/$defs/...`, anchors, the ids it declares). A reference to
anything else is refused when the schema is registered: the broker never fetches a URL because a client
named one. `format` is an annotation, as 2020-12 makes it by default, not an assertion.

Payloads: JSON text (NaN and Infinity are not JSON, nor are numbers beyond a double's range) that the
compiled validator accepts, with the library's semantics, which pass the official JSON Schema test suite
(tests/schema/test_json_schema_suite.py): `true` is not `1`, `uniqueItems`, `multipleOf`, `if`/`then`,
`patternProperties`, `prefixItems` and the rest all hold. Measured about 3 us for a 390-byte object with
ten constraints, against 20 us for the hand-written subset this replaced (docs/SCHEMAS.md).

Compatibility asks whether a reader schema accepts every instance a writer schema accepts, judged on
structure: types (an `integer` writer is read by a `number` reader), `required` (a field the reader
requires and the writer does not guarantee breaks, unless the reader gives it a `default`), shared
properties recursively, `additionalProperties: false` in the reader against the writer's extra properties,
array `items`, and `enum` sets. Backward is reader = new, writer = old; forward is the reverse. It is an
approximation (it does not reason about `pattern`, numeric bounds, `$ref` or combinators), which errs
towards "compatible" exactly there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import jsonschema_rs

from danube_fast.schema.errors import InvalidSchema

PayloadCheck = Callable[[bytes], str | None]
_MAX_ERRORS = 5
_MAX_MESSAGE = 200  # characters of one reason


def _no_retrieval(uri: str) -> Any:
    raise ValueError(f"{uri} is outside the definition; only references within it are allowed")


def _where(path: Any) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def compile_schema(schema: Any) -> jsonschema_rs.Validator:
    """The compiled validator of `schema`; InvalidSchema says why it is not a usable JSON Schema."""
    if not isinstance(schema, dict | bool):
        raise InvalidSchema("Invalid JSON Schema: a schema is an object or a boolean")
    try:
        return jsonschema_rs.validator_for(schema, retriever=_no_retrieval)
    except jsonschema_rs.ValidationError as e:
        path = list(e.instance_path)
        # The metaschema's own words for a bad `type` are "not valid under any of the schemas listed in the
        # 'anyOf' keyword".
        bad_type = path[-1:] == ["type"] and list(e.schema_path)[-2:] == ["type", "anyOf"]
        message = f"{json.dumps(e.instance)} is not a JSON Schema type" if bad_type else e.message
        raise InvalidSchema(f"Invalid JSON Schema: {_where(path)}: {message}") from e
    except (ValueError, RecursionError) as e:  # a pattern the regex engine refuses, nesting too deep
        raise InvalidSchema(f"Invalid JSON Schema: {e}") from e


def check_schema(schema: Any) -> None:
    """InvalidSchema unless `schema` is a valid JSON Schema that compiles."""
    compile_schema(schema)


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

def _clip(message: str) -> str:
    """The library's message quotes the offending instance whole: a large payload must not come back whole
    in the error its producer gets and the log keeps."""
    return message if len(message) <= _MAX_MESSAGE else message[:_MAX_MESSAGE - 20] + " ... " + message[-15:]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def finite(text: str) -> float:
    """A JSON number with a fraction or exponent, refused beyond a double's range: 1e999 would become
    infinity, which the validator sees as null, so `{"maximum": 5}` would let it through."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def payload_check(schema: Any) -> PayloadCheck:
    """A function telling why a payload is not a JSON instance of `schema` (None: it is)."""
    validator = compile_schema(schema)

    def errors(payload: bytes) -> str | None:
        try:
            instance = json.loads(payload, parse_constant=_no_constant, parse_float=finite)
        except (ValueError, RecursionError) as e:
            return f"Invalid JSON data: {e}"
        found = []
        try:
            if validator.is_valid(instance):  # the common case: no error objects built
                return None
            for error in validator.iter_errors(instance):
                found.append(f"{_where(error.instance_path)}: {_clip(error.message)}")
                if len(found) == _MAX_ERRORS:
                    break
        except ValueError as e:  # "Recursion limit reached": a payload nested deeper than the validator goes
            return f"JSON Schema validation failed: {e}"
        return "JSON Schema validation failed: " + "; ".join(found)

    return errors

"""What every typed metadata resource shares: strict JSON in and out, and field readers that name the value.

A resource is a frozen dataclass with `from_json(bytes, key=...)` and `to_json() -> bytes`. Parsing is
strict (the field names and JSON types of docs/METADATA.md; no NaN, no duplicate object keys, integers are
integers, not floats or booleans) and every `BadValue` says which resource, which key when known, and which
field. Fields a resource does not know are kept in its `extra` mapping and written back, so a value written by
a newer broker survives a read-modify-write by an older one.

Output is compact UTF-8 JSON (what serde_json writes), fields in the order upstream writes them, unknown
fields after.
"""

from __future__ import annotations

import json
import math
from enum import IntEnum, StrEnum
from typing import ClassVar, Self, TypeAlias, TypeVar

from danube_fast.meta.store import BadValue

JSON: TypeAlias = "bool | int | float | str | list[JSON] | dict[str, JSON] | None"
JSONObject: TypeAlias = dict[str, JSON]

U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1
NULL = b"null"

StrE = TypeVar("StrE", bound=StrEnum)
IntE = TypeVar("IntE", bound=IntEnum)


class _NotJson(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, JSON]]) -> JSONObject:
    obj: JSONObject = {}
    for name, value in pairs:
        if name in obj:
            raise _NotJson(f"duplicate field {name!r}")
        obj[name] = value
    return obj


def _no_constants(name: str) -> JSON:
    raise _NotJson(f"{name} is not JSON")


def _finite(text: str) -> float:
    """A JSON number with a fraction or exponent; one beyond a double's range (1e999) would come back as
    infinity, which no JSON can hold, so the value could be read but never written again."""
    value = float(text)
    if not math.isfinite(value):
        raise _NotJson(f"the number {text[:40]} is out of range")
    return value


def load_json(data: bytes, where: str) -> JSON:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise BadValue(f"{where}: value must be bytes, got {type(data).__name__}")
    try:
        text = bytes(data).decode("utf-8")
        return json.loads(text, object_pairs_hook=_no_duplicates,  # type: ignore[no-any-return]
                          parse_constant=_no_constants, parse_float=_finite)
    except (ValueError, RecursionError) as e:  # bad UTF-8, bad JSON, _NotJson, int digit limit, nesting
        raise BadValue(f"{where}: value is not valid JSON ({e}): {bytes(data)[:80]!r}") from e


def dump_json(value: JSON) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def describe(resource: str, key: str | None) -> str:
    return f"{resource} at {key}" if key else resource


def _show(value: JSON) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value: JSON) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(value), type(value).__name__)


def bad(where: str, field: str, expected: str, value: JSON) -> BadValue:
    return BadValue(f"{where}: {field} must be {expected}, got {_kind(value)} {_show(value)}")


def as_uint(value: JSON, where: str, field: str, maximum: int = U64_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        bits = 32 if maximum == U32_MAX else 64
        raise bad(where, field, f"an unsigned {bits}-bit integer", value)
    return value


def as_str(value: JSON, where: str, field: str) -> str:
    if not isinstance(value, str):
        raise bad(where, field, "a string", value)
    return value


def as_bool(value: JSON, where: str, field: str) -> bool:
    if not isinstance(value, bool):
        raise bad(where, field, "a boolean", value)
    return value


def as_list(value: JSON, where: str, field: str) -> list[JSON]:
    if not isinstance(value, list):
        raise bad(where, field, "an array", value)
    return value


def as_object(value: JSON, where: str, field: str) -> JSONObject:
    if not isinstance(value, dict):
        raise bad(where, field, "an object", value)
    return value


def as_str_enum(value: JSON, where: str, field: str, enum: type[StrE]) -> StrE:
    """A StrEnum member from its JSON string (exact case, as docs/METADATA.md shows it)."""
    text = as_str(value, where, field)
    try:
        return enum(text)
    except ValueError as e:
        raise bad(where, field, "one of " + ", ".join(repr(m.value) for m in enum), value) from e


def as_int_enum(value: JSON, where: str, field: str, enum: type[IntE]) -> IntE:
    """An IntEnum member from its JSON integer (never a boolean or a float that equals one)."""
    number = as_uint(value, where, field)
    try:
        return enum(number)
    except ValueError as e:
        raise bad(where, field, "one of " + ", ".join(str(m.value) for m in enum), value) from e


class Fields:
    """Reads the fields of one JSON object; what it did not read is `extra()`."""

    def __init__(self, value: JSON, where: str, path: str = "") -> None:
        self.where = where
        self.path = path
        self._obj = as_object(value, where, path or "the value")
        self._read: set[str] = set()

    def name(self, field: str) -> str:
        return f"field {self.path}.{field}" if self.path else f"field {field!r}"

    def has(self, field: str) -> bool:
        return field in self._obj

    def get(self, field: str) -> JSON:
        self._read.add(field)
        if field not in self._obj:
            raise BadValue(f"{self.where}: {self.name(field)} is missing")
        return self._obj[field]

    def uint(self, field: str, maximum: int = U64_MAX) -> int:
        return as_uint(self.get(field), self.where, self.name(field), maximum)

    def string(self, field: str) -> str:
        return as_str(self.get(field), self.where, self.name(field))

    def boolean(self, field: str) -> bool:
        return as_bool(self.get(field), self.where, self.name(field))

    def array(self, field: str) -> list[JSON]:
        return as_list(self.get(field), self.where, self.name(field))

    def strings(self, field: str) -> tuple[str, ...]:
        name = self.name(field)
        return tuple(as_str(v, self.where, f"{name}[{i}]") for i, v in enumerate(self.array(field)))

    def nullable_uint(self, field: str) -> int | None:
        """Present, and either null or an unsigned integer."""
        value = self.get(field)
        return None if value is None else as_uint(value, self.where, self.name(field))

    def nullable_str(self, field: str) -> str | None:
        value = self.get(field)
        return None if value is None else as_str(value, self.where, self.name(field))

    def optional_str(self, field: str) -> str | None:
        """Absent is None; present must be a string."""
        return self.string(field) if self.has(field) else None

    def optional_uint(self, field: str) -> int | None:
        return self.uint(field) if self.has(field) else None

    def optional_bool(self, field: str) -> bool | None:
        return self.boolean(field) if self.has(field) else None

    def optional_strings(self, field: str) -> tuple[str, ...] | None:
        return self.strings(field) if self.has(field) else None

    def extra(self) -> JSONObject:
        return {k: v for k, v in self._obj.items() if k not in self._read}


def with_extra(obj: JSONObject, extra: JSONObject) -> JSONObject:
    for name, value in extra.items():
        obj.setdefault(name, value)
    return obj


def present(obj: JSONObject, **optional: JSON) -> JSONObject:
    """Add the optional fields that are not None (absent fields stay absent)."""
    obj.update({name: value for name, value in optional.items() if value is not None})
    return obj


class Resource:
    """Base of every typed value: subclasses define RESOURCE, `from_obj` and `to_obj`."""

    RESOURCE: ClassVar[str] = "value"

    @classmethod
    def from_json(cls, data: bytes, *, key: str | None = None) -> Self:
        where = describe(cls.RESOURCE, key)
        return cls.from_obj(load_json(data, where), where)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        raise NotImplementedError

    def to_obj(self) -> JSON:
        raise NotImplementedError

    def to_json(self) -> bytes:
        """Compact JSON; checked by parsing it back first, so that nothing is written that cannot be read."""
        obj = self.to_obj()
        type(self).from_obj(obj, f"{self.RESOURCE} being written")
        return dump_json(obj)

"""Avro schemas: parsing (with named types), schema resolution rules for compatibility, and datum decoding
for payload validation. Pure Python, no Avro library.

Compatibility follows the Avro specification's schema resolution, which is what "a reader can read data a
writer wrote" means: a reader field missing from the writer needs a default; writer fields the reader lacks
are skipped; primitives may be promoted (int to long, float or double; long to float or double; float to
double; string and bytes either way); a reader union must have a branch that reads the writer's type, and
every branch of a writer union must be readable; enums need the writer's symbols unless the reader has a
default; named types must have the same name (or the reader lists the writer's name among its aliases).
Field aliases in the reader are honoured. Logical types are read as their underlying type.

Payload validation decodes the payload as one Avro binary datum (not an object container file) and requires
it to consume the payload exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

from danube_fast.schema.errors import InvalidSchema

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# (writer, reader) pairs the spec allows besides identical types.
_PROMOTIONS = frozenset({
    ("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"), ("long", "double"),
    ("float", "double"), ("string", "bytes"), ("bytes", "string"),
})


@dataclass(eq=False)
class Record:
    name: str  # full name
    fields: list[Field] = field(default_factory=list)
    aliases: frozenset[str] = frozenset()


@dataclass(eq=False)
class Field:
    name: str
    type: Node
    has_default: bool
    aliases: frozenset[str] = frozenset()


@dataclass(eq=False)
class Enum:
    name: str
    symbols: list[str]
    has_default: bool
    aliases: frozenset[str] = frozenset()


@dataclass(eq=False)
class Fixed:
    name: str
    size: int
    aliases: frozenset[str] = frozenset()


@dataclass(eq=False)
class Array:
    items: Node


@dataclass(eq=False)
class Map:
    values: Node


@dataclass(eq=False)
class Union:
    branches: list[Node]


Node: TypeAlias = "str | Record | Enum | Fixed | Array | Map | Union"
Named = Record | Enum | Fixed
N = TypeVar("N", Record, Enum, Fixed)


# -------------------------------------------------------------------------------------------------- parsing

def parse(value: Any) -> Node:
    """The schema tree of a parsed Avro JSON value; InvalidSchema says what is wrong and where."""
    try:
        return _Parser().node(value, "", "schema")
    except RecursionError as e:
        raise InvalidSchema("Invalid Avro schema: nested too deeply") from e


class _Parser:
    def __init__(self) -> None:
        self.named: dict[str, Named] = {}

    def node(self, value: Any, namespace: str, where: str) -> Node:
        if isinstance(value, str):
            if value in PRIMITIVES:
                return value
            return self._reference(value, namespace, where)
        if isinstance(value, list):
            branches = [self.node(v, namespace, f"{where}[{i}]") for i, v in enumerate(value)]
            if any(isinstance(b, Union) for b in branches):
                raise InvalidSchema(f"Invalid Avro schema: {where}: a union may not contain a union")
            return Union(branches)
        if not isinstance(value, dict):
            raise InvalidSchema(f"Invalid Avro schema: {where}: expected a type name, an object or a union")
        kind = value.get("type")
        if isinstance(kind, str) and kind in PRIMITIVES:
            return kind
        if kind in ("record", "error"):
            return self._record(value, namespace, where)
        if kind == "enum":
            name, aliases = self._declare_name(value, namespace, where)
            symbols = value.get("symbols")
            if not isinstance(symbols, list) or len(set(symbols)) != len(symbols) \
                    or not all(isinstance(s, str) and _NAME.match(s) for s in symbols):
                raise InvalidSchema(f"Invalid Avro schema: {where}: enum {name} needs unique symbol names")
            return self._define(Enum(name, symbols, "default" in value, aliases), where)
        if kind == "fixed":
            name, aliases = self._declare_name(value, namespace, where)
            size = value.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidSchema(f"Invalid Avro schema: {where}: fixed {name} needs a size >= 0")
            return self._define(Fixed(name, size, aliases), where)
        if kind == "array":
            if "items" not in value:
                raise InvalidSchema(f"Invalid Avro schema: {where}: array without items")
            return Array(self.node(value["items"], namespace, f"{where}.items"))
        if kind == "map":
            if "values" not in value:
                raise InvalidSchema(f"Invalid Avro schema: {where}: map without values")
            return Map(self.node(value["values"], namespace, f"{where}.values"))
        if isinstance(kind, str):
            return self._reference(kind, namespace, where)
        raise InvalidSchema(f"Invalid Avro schema: {where}: unknown type {kind!r}")

    def _record(self, value: dict[str, Any], namespace: str, where: str) -> Record:
        name, aliases = self._declare_name(value, namespace, where)
        record = self._define(Record(name, aliases=aliases), where)  # defined first: fields may refer to it
        fields = value.get("fields")
        if not isinstance(fields, list):
            raise InvalidSchema(f"Invalid Avro schema: {where}: record {name} needs a fields array")
        inner = name.rpartition(".")[0]
        seen: set[str] = set()
        for i, f in enumerate(fields):
            at = f"{where}.fields[{i}]"
            if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not _NAME.match(f["name"]):
                raise InvalidSchema(f"Invalid Avro schema: {at}: a field needs a valid name")
            if f["name"] in seen:
                raise InvalidSchema(f"Invalid Avro schema: {at}: duplicate field {f['name']!r}")
            seen.add(f["name"])
            if "type" not in f:
                raise InvalidSchema(f"Invalid Avro schema: {at}: field {f['name']!r} has no type")
            record.fields.append(Field(f["name"], self.node(f["type"], inner, f"{at}.type"), "default" in f,
                                       _aliases(f, where)))
        return record

    def _declare_name(self, value: dict[str, Any], namespace: str, where: str) -> tuple[str, frozenset[str]]:
        name = value.get("name")
        if not isinstance(name, str) or not all(_NAME.match(p) for p in name.split(".")):
            raise InvalidSchema(f"Invalid Avro schema: {where}: a named type needs a valid name")
        space = value.get("namespace", namespace)
        if not isinstance(space, str):
            raise InvalidSchema(f"Invalid Avro schema: {where}: namespace must be a string")
        full = name if "." in name or not space else f"{space}.{name}"
        return full, _aliases(value, where)

    def _define(self, named: N, where: str) -> N:
        if named.name in self.named:
            raise InvalidSchema(f"Invalid Avro schema: {where}: {named.name} is defined twice")
        self.named[named.name] = named
        return named

    def _reference(self, name: str, namespace: str, where: str) -> Named:
        for candidate in (f"{namespace}.{name}" if namespace and "." not in name else None, name):
            if candidate is not None and candidate in self.named:
                return self.named[candidate]
        raise InvalidSchema(f"Invalid Avro schema: {where}: unknown type {name!r}")


def _aliases(value: dict[str, Any], where: str) -> frozenset[str]:
    aliases = value.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise InvalidSchema(f"Invalid Avro schema: {where}: aliases must be an array of names")
    return frozenset(aliases)


# ---------------------------------------------------------------------------------------- compatibility

def _short(name: str) -> str:
    return name.rpartition(".")[2]


def _describe(node: Node) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, Record | Enum | Fixed):
        return f"{type(node).__name__.lower()} {node.name}"
    return type(node).__name__.lower()


def _same_name(reader: Named, writer: Named) -> bool:
    names = {reader.name, _short(reader.name)} | reader.aliases | {_short(a) for a in reader.aliases}
    return writer.name in names or _short(writer.name) in names


def resolution_errors(reader: Node, writer: Node, reader_label: str, writer_label: str) -> list[str]:
    """Why data written with `writer` cannot be read with `reader` (empty: it can)."""
    errors: list[str] = []
    _resolve(reader, writer, "", set(), errors, reader_label, writer_label)
    return errors


def _resolve(reader: Node, writer: Node, path: str, seen: set[tuple[int, int]], errors: list[str],
             rl: str, wl: str) -> None:
    where = path or "the top level"
    if isinstance(writer, Union):
        for branch in writer.branches:
            _resolve(reader, branch, path, seen, errors, rl, wl)
        return
    if isinstance(reader, Union):
        for branch in reader.branches:
            trial: list[str] = []
            _resolve(branch, writer, path, set(seen), trial, rl, wl)
            if not trial:
                return
        errors.append(f"{where}: no branch of the {rl}'s union reads the {wl}'s {_describe(writer)}")
        return
    if isinstance(reader, str) or isinstance(writer, str):
        if reader != writer and (writer, reader) not in _PROMOTIONS:
            errors.append(f"{where}: the {wl}'s {_describe(writer)} cannot be read as the {rl}'s "
                          f"{_describe(reader)}")
        return
    if isinstance(reader, Record) and isinstance(writer, Record):
        if not _same_name(reader, writer):
            errors.append(f"{where}: record {writer.name} of the {wl} is not {reader.name} of the {rl}")
            return
        pair = (id(reader), id(writer))
        if pair in seen:
            return
        seen.add(pair)
        by_name = {f.name: f for f in writer.fields}
        for rf in reader.fields:
            wf = by_name.get(rf.name) or next((by_name[a] for a in rf.aliases if a in by_name), None)
            at = f"{path}.{rf.name}" if path else rf.name
            if wf is None:
                if not rf.has_default:
                    errors.append(f"field {at!r} of the {rl} has no default and the {wl} does not have it")
            else:
                _resolve(rf.type, wf.type, at, seen, errors, rl, wl)
        return
    if isinstance(reader, Enum) and isinstance(writer, Enum):
        if not _same_name(reader, writer):
            errors.append(f"{where}: enum {writer.name} of the {wl} is not {reader.name} of the {rl}")
        elif not reader.has_default:
            missing = [s for s in writer.symbols if s not in reader.symbols]
            if missing:
                errors.append(f"{where}: the {rl}'s enum {reader.name} lacks symbols {missing} of the {wl} "
                              "and has no default")
        return
    if isinstance(reader, Fixed) and isinstance(writer, Fixed):
        if not _same_name(reader, writer) or reader.size != writer.size:
            errors.append(f"{where}: fixed {writer.name}({writer.size}) of the {wl} is not "
                          f"{reader.name}({reader.size}) of the {rl}")
        return
    if isinstance(reader, Array) and isinstance(writer, Array):
        _resolve(reader.items, writer.items, f"{path}[]", seen, errors, rl, wl)
        return
    if isinstance(reader, Map) and isinstance(writer, Map):
        _resolve(reader.values, writer.values, f"{path}{{}}", seen, errors, rl, wl)
        return
    errors.append(f"{where}: the {wl}'s {_describe(writer)} cannot be read as the {rl}'s {_describe(reader)}")


# ------------------------------------------------------------------------------------------- decoding

class _Malformed(ValueError):
    pass


def datum_errors(schema: Node, payload: bytes) -> str | None:
    """Why `payload` is not one binary Avro datum of `schema` (None: it is)."""
    try:
        end = _Decoder(payload).datum(schema, 0)
    except _Malformed as e:
        return f"not an Avro datum of the schema: {e}"
    except RecursionError:
        return "not an Avro datum of the schema: nested too deeply"
    if end != len(payload):
        return f"not an Avro datum of the schema: {len(payload) - end} bytes left after the datum"
    return None


class _Decoder:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def long(self, pos: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            if pos >= len(self.data):
                raise _Malformed("truncated varint")
            b = self.data[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return (value >> 1) ^ -(value & 1), pos
            shift += 7
            if shift > 63:
                raise _Malformed("varint longer than 10 bytes")

    def take(self, pos: int, n: int) -> int:
        if n < 0 or pos + n > len(self.data):
            raise _Malformed(f"needs {n} bytes at byte {pos}, has {len(self.data) - pos}")
        return pos + n

    def datum(self, node: Node, pos: int) -> int:
        if isinstance(node, str):
            return self._primitive(node, pos)
        if isinstance(node, Record):
            for f in node.fields:
                pos = self.datum(f.type, pos)
            return pos
        if isinstance(node, Enum):
            index, pos = self.long(pos)
            if not 0 <= index < len(node.symbols):
                raise _Malformed(f"enum index {index} outside 0..{len(node.symbols) - 1}")
            return pos
        if isinstance(node, Fixed):
            return self.take(pos, node.size)
        if isinstance(node, Union):
            index, pos = self.long(pos)
            if not 0 <= index < len(node.branches):
                raise _Malformed(f"union index {index} outside 0..{len(node.branches) - 1}")
            return self.datum(node.branches[index], pos)
        items = node.items if isinstance(node, Array) else node.values
        while True:
            count, pos = self.long(pos)
            if count == 0:
                return pos
            if count < 0:
                count = -count
                _, pos = self.long(pos)  # the block's size in bytes
            for _ in range(count):
                if isinstance(node, Map):
                    pos = self._primitive("string", pos)
                pos = self.datum(items, pos)

    def _primitive(self, name: str, pos: int) -> int:
        if name == "null":
            return pos
        if name == "boolean":
            end = self.take(pos, 1)
            if self.data[pos] > 1:
                raise _Malformed(f"boolean byte {self.data[pos]} is neither 0 nor 1")
            return end
        if name in ("int", "long"):
            value, pos = self.long(pos)
            if name == "int" and not -(2**31) <= value < 2**31:
                raise _Malformed(f"int {value} out of range")
            return pos
        if name == "float":
            return self.take(pos, 4)
        if name == "double":
            return self.take(pos, 8)
        length, pos = self.long(pos)
        end = self.take(pos, length)
        if name == "string":
            try:
                self.data[pos:end].decode("utf-8")
            except UnicodeDecodeError as e:
                raise _Malformed(f"string is not UTF-8: {e}") from e
        return end


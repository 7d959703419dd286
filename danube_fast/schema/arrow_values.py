"""A topic's values decoded with its registered Avro or JSON schema into one typed Arrow array per batch.

Two readers share this: the Spark source (`valueFormat=avro|json`, spark/pyspark_danube/values.py, which
resolves the subject on the driver and gives Spark the type `from_arrow_type` makes of `arrow_type`), and
tables typed by a topic's schema. Neither Spark nor the broker is imported here.

What is decoded is a `Resolved` subject: its latest version, which fixes the Arrow type (`arrow_type`), and
the definitions a decoder may need (Avro: every version, the writers; JSON: the latest). A decoder takes a
batch with the columns `value` (binary), `schema_id` and `schema_version` (int64, null when a record carries
none) and answers a `Decoded`: the values as one array of the type, and the rows that did not decode.

Decoding, per batch; measured on one core with 100,000 records of six fields: about 4 us a record for Avro
(7 us when resolving an older version; fastavro's own decoding is most of it), 1.5 us for JSON (read_json
is most of it):
- Avro, per record with fastavro (C-accelerated) into Python values, then one pyarrow array per batch. A
  record is read with the version its `schema_version` names as the writer schema and the latest as the
  reader schema (Avro schema resolution: added fields get their defaults, removed ones are skipped, numbers
  are promoted); a record without a schema id or version is read as written with the latest. A record with
  another subject's schema id, or a version the subject did not have at resolution, does not decode.
- JSON, batch-wise with pyarrow.json.read_json over the payloads of the batch, one per line, with an
  explicit schema; when the mapping holds raw-JSON string parts (which pyarrow cannot produce), per record
  with the json module. JSON is self-describing: every record is read by field name with the latest version
  whatever version or subject id it carries (a missing field is null).
A value that does not decode (not valid Avro or JSON, bytes left over, a field of another type, a value the
Arrow type cannot hold such as a decimal wider than its precision) is null in `Decoded.values` and its row
is in `Decoded.bad`. A payload that decodes to null (an Avro null branch, the JSON text `null`) is a null
value, not a bad row.

Avro to Arrow, chosen so that Spark's converter (pyspark's `from_arrow_type`) gives what Spark's own Avro
source (spark-avro's SchemaConverters) gives (spark/pyspark_danube/values.py has that table):

| Avro                                          | Arrow                                                      |
|-----------------------------------------------|------------------------------------------------------------|
| null, boolean, int, long, float, double       | null, bool, int32, int64, float32, float64                 |
| bytes, fixed                                  | binary                                                     |
| string, enum                                  | string                                                     |
| record                                        | struct (fields not null unless a union with null)          |
| array                                         | list<element: T> (element nullable if T is)                |
| map                                           | map<string, value: T> (value nullable if T is)             |
| union [null, T]                               | T, nullable                                                |
| union of int and long / of float and double   | int64 / float64 (nullable with null)                       |
| any other union                               | struct<member0, ..., memberN> over the non-null branches,  |
|                                               | each nullable: the branch read is set                      |
| timestamp-millis, timestamp-micros            | timestamp("us", tz="UTC")                                  |
| local-timestamp-millis, -micros               | timestamp("us")                                            |
| date                                          | date32                                                     |
| decimal(p, s) on bytes or fixed (p <= 38)     | decimal128(p, s)                                           |
| time-millis / time-micros                     | int32 / int64 (ms / us after midnight)                     |
| uuid on string                                | string                                                     |
A recursive record has no Arrow type: AvroMapping raises ValueSchemaError.

JSON Schema to Arrow (every field nullable): `object` with `properties` -> struct of them in their order,
`string` -> string, `integer` -> int64, `number` -> float64, `boolean` -> bool, `array` with one `items`
schema -> list<element> (nullable items), `"type": [X, "null"]` -> X. Anything else (no type, several types,
oneOf/anyOf/allOf/not/$ref, an object without properties, tuple items, a boolean schema) -> string holding
the JSON text of that part: the payload itself at the top, a compact re-serialisation (json.dumps) inside.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

Convert = Callable[[Any], Any]


class ValueSchemaError(ValueError):
    """A subject's schema cannot type or decode values: a schema with no Arrow type (a recursive record, a
    decimal wider than 38 digits) or one fastavro cannot read. The Spark source raises it too for what stops
    valueFormat on the driver (a topic without a subject, topics with different subjects, a subject of
    another kind) or on an executor (no resolved schema)."""


@dataclass(frozen=True)
class Resolved:
    """A schema subject as resolved for decoding: its id, its latest version at resolution and the
    definitions a decoder may need (Avro: every version, the writers; JSON: the latest). `to_json` is the
    form it travels in (the Spark source's options) and the key `decoder_for` caches by."""

    format: str  # avro or json
    subject: str
    schema_id: int
    version: int
    definitions: dict[int, str]

    def to_json(self) -> str:
        return json.dumps({"format": self.format, "subject": self.subject, "schema_id": self.schema_id,
                           "version": self.version,
                           "definitions": {str(v): d for v, d in self.definitions.items()}})

    @classmethod
    def from_json(cls, text: str) -> Resolved:
        obj = json.loads(text)
        return cls(obj["format"], obj["subject"], obj["schema_id"], obj["version"],
                   {int(v): d for v, d in obj["definitions"].items()})

    @property
    def latest(self) -> str:
        return self.definitions[self.version]


def arrow_type(resolved: Resolved) -> pa.DataType:
    """The Arrow type of the values: the latest version's, mapped as the module docstring says
    (ValueSchemaError when it has none)."""
    if resolved.format == "avro":
        return AvroMapping(json.loads(resolved.latest)).type
    return json_mapping(json.loads(resolved.latest))[0]


# -- Avro ----------------------------------------------------------------------------------------------------

_AVRO_PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
    "double": pa.float64(), "bytes": pa.binary(), "string": pa.string()}
_MAX_PRECISION = 38  # decimal128's, and Spark's DecimalType's
_TIMESTAMP = pa.timestamp("us", tz="UTC")  # Spark's TimestampType
_LOCAL_TIMESTAMP = pa.timestamp("us")  # Spark's TimestampNTZType


@dataclass(frozen=True)
class _Mapped:
    arrow: pa.DataType
    nullable: bool
    convert: Convert | None  # fastavro's value -> what pyarrow takes for `arrow`; None: as it is
    python: tuple[type, ...] = ()  # what fastavro returns for it, to find a general union's branch


class AvroMapping:
    """A parsed Avro schema (`parsed`: fastavro's, with its named types), its Arrow type (`type`) and the
    conversion of what fastavro reads into what pyarrow builds that type from (`convert`, None when
    fastavro's values are already that).

    A general union needs to know which branch was read: fastavro then returns named branches as (name,
    value) (`tagged`: pass it as return_named_type), and unnamed ones are told apart by their Python type.
    """

    def __init__(self, schema: Any) -> None:
        self.named: dict[str, Any] = {}
        try:
            self.parsed = fastavro.parse_schema(schema, named_schemas=self.named)
        except Exception as e:  # fastavro raises SchemaParseError, UnknownType, ValueError, KeyError, ...
            raise ValueSchemaError(f"not an Avro schema fastavro can read: {e}") from e
        self.tagged = self._general_union(self.parsed, set())
        self._inside: list[str] = []
        root = self._map(self.parsed)
        self.type: pa.DataType = root.arrow
        self.convert: Convert | None = root.convert

    def _definition(self, node: Any) -> Any:
        if isinstance(node, str) and node not in _AVRO_PRIMITIVES:
            if node not in self.named:
                raise ValueSchemaError(f"unknown Avro type {node!r}")
            return self.named[node]
        return node

    def _general_union(self, node: Any, seen: set[str]) -> bool:
        node = self._definition(node)
        if isinstance(node, list):
            branches = [b for b in node if not _is_null(b)]
            return (len(branches) > 1 and _merged(branches) is None) or \
                any(self._general_union(b, seen) for b in branches)
        if not isinstance(node, dict):
            return False
        kind = node.get("type")
        if kind in ("record", "error"):
            if node["name"] in seen:
                return False
            seen.add(node["name"])
            return any(self._general_union(f["type"], seen) for f in node["fields"])
        if kind == "array":
            return self._general_union(node["items"], seen)
        if kind == "map":
            return self._general_union(node["values"], seen)
        if kind in ("enum", "fixed") or kind in _AVRO_PRIMITIVES:
            return False
        return self._general_union(kind, seen)  # {"type": <a type>}

    def _map(self, node: Any) -> _Mapped:
        node = self._definition(node)
        if isinstance(node, str):
            return _Mapped(_AVRO_PRIMITIVES[node], node == "null", None, _PYTHON[node])
        if isinstance(node, list):
            return self._union(node)
        kind = node.get("type")
        if kind in ("record", "error"):
            name = node["name"]
            if name in self._inside:
                raise ValueSchemaError(f"Avro record {name} contains itself: a recursive type has no Arrow "
                                       "type (nor a Spark one)")
            self._inside.append(name)
            try:
                fields = [(f["name"], self._map(f["type"])) for f in node["fields"]]
            finally:
                self._inside.pop()
            converts = [(n, m.convert) for n, m in fields if m.convert is not None]
            return _Mapped(pa.struct([pa.field(n, m.arrow, m.nullable) for n, m in fields]), False,
                           _record(converts) if converts else None, (dict,))
        if kind == "enum":
            return _Mapped(pa.string(), False, None, (str,))
        if kind == "array":
            items = self._map(node["items"])
            return _Mapped(pa.list_(pa.field("element", items.arrow, items.nullable)), False,
                           _each(items.convert) if items.convert else None, (list,))
        if kind == "map":
            values = self._map(node["values"])
            return _Mapped(pa.map_(pa.string(), pa.field("value", values.arrow, values.nullable)), False,
                           _each_value(values.convert) if values.convert else None, (dict,))
        if kind == "fixed" or kind in _AVRO_PRIMITIVES:
            return self._logical(kind, node)
        return self._map(kind)  # {"type": <a type>}

    def _logical(self, kind: str, node: dict[str, Any]) -> _Mapped:
        """fastavro converts exactly these (fastavro.read.LOGICAL_READERS keys); others stay their type."""
        logical = f"{kind}-{node.get('logicalType')}"
        if logical in ("bytes-decimal", "fixed-decimal"):
            precision, scale = node.get("precision"), node.get("scale", 0)
            if not isinstance(precision, int) or not 0 < precision <= _MAX_PRECISION:
                raise ValueSchemaError(f"decimal precision {precision!r}: Arrow's decimal128 (and Spark's "
                                       f"decimals) hold 1 to {_MAX_PRECISION} digits")
            return _Mapped(pa.decimal128(precision, scale), False, None, (Decimal,))
        if logical == "int-date":
            return _Mapped(pa.date32(), False, None, (dt.date,))
        if logical in ("long-timestamp-millis", "long-timestamp-micros"):
            return _Mapped(_TIMESTAMP, False, None, (dt.datetime,))
        if logical in ("long-local-timestamp-millis", "long-local-timestamp-micros"):
            return _Mapped(_LOCAL_TIMESTAMP, False, None, (dt.datetime,))
        if logical == "int-time-millis":
            return _Mapped(pa.int32(), False, _time_of_day(1000), (dt.time,))
        if logical == "long-time-micros":
            return _Mapped(pa.int64(), False, _time_of_day(1), (dt.time,))
        if logical == "string-uuid":
            return _Mapped(pa.string(), False, str, (uuid.UUID,))
        if kind == "fixed":
            return _Mapped(pa.binary(), False, None, (bytes,))
        return _Mapped(_AVRO_PRIMITIVES[kind], kind == "null", None, _PYTHON[kind])

    def _union(self, node: list[Any]) -> _Mapped:
        branches = [b for b in node if not _is_null(b)]
        nullable = len(branches) < len(node)
        if not branches:
            return _Mapped(pa.null(), True, None, (type(None),))
        if len(branches) == 1:
            inner = self._map(branches[0])
            convert = inner.convert
            if self.tagged and self._name(branches[0]) is not None:
                convert = _untag(convert)
            return _Mapped(inner.arrow, nullable or inner.nullable, convert, inner.python)
        merged = _merged(branches)
        if merged is not None:
            return _Mapped(merged, nullable, None, (int,) if merged == pa.int64() else (float, int))
        mapped = [self._map(b) for b in branches]
        by_name = {name: (i, m.convert) for i, (b, m) in enumerate(zip(branches, mapped, strict=True))
                   if (name := self._name(b)) is not None}
        by_type: dict[type, tuple[int, Convert | None]] = {}
        for i, (b, m) in enumerate(zip(branches, mapped, strict=True)):
            if self._name(b) is None:
                for python in m.python:
                    by_type.setdefault(python, (i, m.convert))
        member = pa.struct([pa.field(f"member{i}", m.arrow, True) for i, m in enumerate(mapped)])
        return _Mapped(member, nullable, _branch(by_name, by_type, _int_then_long(branches)), ())

    def _name(self, node: Any) -> str | None:
        node = self._definition(node)
        if isinstance(node, dict) and node.get("type") in ("record", "error", "enum", "fixed"):
            return str(node["name"])
        return None


_PYTHON: dict[str, tuple[type, ...]] = {
    "null": (type(None),), "boolean": (bool,), "int": (int,), "long": (int,), "float": (float,),
    "double": (float,), "bytes": (bytes,), "string": (str,)}


def _is_null(node: Any) -> bool:
    return node == "null" or (isinstance(node, dict) and node.get("type") == "null")


def _plain(node: Any) -> str | None:
    """The primitive type of `node` when it is one without a logical type."""
    if isinstance(node, str):
        return node
    if isinstance(node, dict) and "logicalType" not in node and isinstance(node.get("type"), str):
        return str(node["type"])
    return None


def _merged(branches: list[Any]) -> pa.DataType | None:
    """spark-avro reads a union of int and long as long, of float and double as double."""
    kinds = {_plain(b) for b in branches}
    if kinds == {"int", "long"}:
        return pa.int64()
    if kinds == {"float", "double"}:
        return pa.float64()
    return None


def _int_then_long(branches: list[Any]) -> int | None:
    """The long branch of a general union that also has an int one: an int outside int32 goes there."""
    kinds = [_plain(b) for b in branches]
    return kinds.index("long") if "int" in kinds and "long" in kinds else None


def _record(converts: list[tuple[str, Convert]]) -> Convert:
    def convert(value: dict[str, Any]) -> dict[str, Any]:
        for name, c in converts:
            value[name] = c(value[name])
        return value
    return convert


def _each(c: Convert) -> Convert:
    return lambda items: [c(x) for x in items]


def _each_value(c: Convert) -> Convert:
    return lambda entries: {k: c(x) for k, x in entries.items()}


def _untag(c: Convert | None) -> Convert:
    """A [null, named] union read with return_named_type: (name, value) -> the value."""
    def convert(value: Any) -> Any:
        if type(value) is tuple:
            value = value[1]
        return value if c is None or value is None else c(value)
    return convert


def _time_of_day(unit_us: int) -> Convert:
    def convert(t: dt.time) -> int:
        micros = ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond
        return micros // unit_us
    return convert


def _branch(by_name: dict[str, tuple[int, Convert | None]], by_type: dict[type, tuple[int, Convert | None]],
            long_branch: int | None) -> Convert:
    """A general union's value -> {"memberI": value} of the branch that was read."""
    def convert(value: Any) -> dict[str, Any] | None:
        if value is None:
            return None
        if type(value) is tuple:
            index, c = by_name[value[0]]
            value = value[1]
        else:
            index, c = by_type[type(value)]
            if long_branch is not None and type(value) is int and not -2**31 <= value < 2**31:
                index = long_branch
        return {f"member{index}": value if c is None else c(value)}
    return convert


# -- JSON Schema ---------------------------------------------------------------------------------------------


class _NotOfType(ValueError):
    """A JSON value does not fit its Arrow type."""


_JSON_TYPES: dict[str, tuple[pa.DataType, tuple[type, ...]]] = {
    "string": (pa.string(), (str,)), "integer": (pa.int64(), (int,)), "number": (pa.float64(), (int, float)),
    "boolean": (pa.bool_(), (bool,))}
_COMBINATORS = ("oneOf", "anyOf", "allOf", "not", "$ref")


def json_mapping(node: Any) -> tuple[pa.DataType, Convert, bool]:
    """The Arrow type of a JSON Schema, a conversion of a parsed value (json.loads) into it that raises
    _NotOfType as pyarrow's reader would refuse it, and whether some part is raw JSON text."""
    if isinstance(node, dict) and not any(k in node for k in _COMBINATORS):
        kind = node.get("type")
        if isinstance(kind, list):
            others = [k for k in kind if k != "null"]
            kind = others[0] if len(others) == 1 else None
        if kind == "object" and isinstance(node.get("properties"), dict) and node["properties"]:
            fields = [(str(name), *json_mapping(sub)) for name, sub in node["properties"].items()]
            return (pa.struct([pa.field(n, t, True) for n, t, _, _ in fields]),
                    _json_object([(n, c) for n, _, c, _ in fields]), any(r for _, _, _, r in fields))
        if kind == "array" and isinstance(node.get("items"), dict):
            items, convert, raw = json_mapping(node["items"])
            return pa.list_(pa.field("element", items, True)), _json_array(convert), raw
        if isinstance(kind, str) and kind in _JSON_TYPES:
            arrow, python = _JSON_TYPES[kind]
            return arrow, _json_scalar(python, float if kind == "number" else None), False
    return pa.string(), _json_text, True


def _json_scalar(python: tuple[type, ...], cast: Callable[[Any], Any] | None) -> Convert:
    def convert(value: Any) -> Any:
        if value is None:
            return None
        if type(value) not in python:  # type(): a bool is not an integer here, as in pyarrow
            raise _NotOfType(f"{type(value).__name__} where {python[0].__name__} was expected")
        return value if cast is None else cast(value)
    return convert


def _json_object(fields: list[tuple[str, Convert]]) -> Convert:
    def convert(value: Any) -> Any:
        if value is None:
            return None
        if type(value) is not dict:
            raise _NotOfType(f"{type(value).__name__} where an object was expected")
        return {name: c(value.get(name)) for name, c in fields}
    return convert


def _json_array(c: Convert) -> Convert:
    def convert(value: Any) -> Any:
        if value is None:
            return None
        if type(value) is not list:
            raise _NotOfType(f"{type(value).__name__} where an array was expected")
        return [c(x) for x in value]
    return convert


def _json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# -- decoding ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decoded:
    """A batch's values. `bad` holds the indices, within the batch, of the rows whose value did not decode:
    an int64 array, ascending, without nulls, usable as is with `batch.take(bad)`. Those rows are null in
    `values`; a null in `values` at a row not in `bad` is a value that decoded to null."""

    values: pa.Array  # of the decoder's Arrow type
    bad: pa.Array
    reason: str | None  # why the first bad row failed

    @property
    def failed(self) -> int:
        return len(self.bad)


@lru_cache(maxsize=16)  # a reader decodes many batches of one subject: parse its schemas once
def decoder_for(resolved_json_text: str, value_type: pa.DataType) -> AvroDecoder | JsonDecoder:
    """The decoder of the subject `Resolved.to_json` gave, producing `value_type` (`arrow_type` of it, or a
    type equal to that)."""
    resolved = Resolved.from_json(resolved_json_text)
    if resolved.format == "avro":
        return AvroDecoder(resolved, value_type)
    return JsonDecoder(resolved, value_type)


class AvroDecoder:
    """Per record with fastavro, each read with the version it names as the writer schema (module
    docstring); `decode` takes a batch with the columns value, schema_id and schema_version."""

    def __init__(self, resolved: Resolved, value_type: pa.DataType) -> None:
        self.resolved = resolved
        self.type = value_type
        self.mapping = AvroMapping(json.loads(resolved.latest))
        self._writers: dict[int, Any] = {resolved.version: self.mapping.parsed}
        self._pairs: dict[tuple[int | None, int | None], tuple[Any, Any] | str] = {}

    def _pair(self, schema_id: int | None, version: int | None) -> tuple[Any, Any] | str:
        """(writer, reader) schemas of a record, or why it cannot be read."""
        r = self.resolved
        if schema_id is not None and schema_id != r.schema_id:
            return f"schema id {schema_id} is not that of subject {r.subject!r} ({r.schema_id})"
        v = r.version if version is None else version
        if v not in self._writers:
            if v not in r.definitions:
                return f"subject {r.subject!r} had no Avro version {v} when it was resolved"
            try:
                self._writers[v] = fastavro.parse_schema(json.loads(r.definitions[v]))
            except Exception as e:  # the registry's Avro parser accepted what fastavro's refuses
                return f"fastavro cannot read version {v} of subject {r.subject!r}: {e}"
        return self._writers[v], None if v == r.version else self.mapping.parsed

    def decode(self, batch: pa.RecordBatch) -> Decoded:
        payloads = batch.column("value").to_pylist()
        ids = batch.column("schema_id").to_pylist()
        versions = batch.column("schema_version").to_pylist()
        tagged, convert = self.mapping.tagged, self.mapping.convert
        out: list[Any] = []
        bad: list[int] = []
        reason = None
        for i, (payload, schema_id, version) in enumerate(zip(payloads, ids, versions, strict=True)):
            pair = self._pairs.get((schema_id, version))
            if pair is None:
                pair = self._pairs[(schema_id, version)] = self._pair(schema_id, version)
            try:
                if isinstance(pair, str):
                    raise ValueError(pair)
                fo = io.BytesIO(payload)
                value = fastavro.schemaless_reader(fo, pair[0], pair[1], return_named_type=tagged)
                if fo.tell() != len(payload):
                    raise ValueError(f"{len(payload) - fo.tell()} bytes left after the value")
                out.append(value if convert is None else convert(value))
            except Exception as e:  # fastavro: EOFError, ValueError, IndexError, UnicodeDecodeError, ...
                bad.append(i)
                reason = reason or f"{type(e).__name__}: {e}"
                out.append(None)
        return _to_arrow(out, self.type, bad, reason)


def _to_arrow(values: list[Any], value_type: pa.DataType, bad: list[int], reason: str | None) -> Decoded:
    """One array of `value_type` from `values`, where the rows `bad` (ascending) are None already. A value
    that does not fit the type (a decimal too wide, a date out of range) is null too, and its row bad."""
    try:
        return Decoded(pa.array(values, type=value_type), pa.array(bad, pa.int64()), reason)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    unfit: list[int] = []
    for i, value in enumerate(values):
        if value is None:
            continue
        try:
            pa.array([value], type=value_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            unfit.append(i)
            reason = reason or f"{type(e).__name__}: {e}"
            values[i] = None
    return Decoded(pa.array(values, type=value_type), pa.array(sorted(bad + unfit), pa.int64()), reason)


class JsonDecoder:
    """One read_json call per batch; the payloads become the lines `{"v":<payload>}`: the wrapper makes every
    payload exactly one row or a parse error (an empty payload would be a skipped line, two documents in one
    payload two rows), and reads a schema whose top is not an object. A failed read is bisected down to the
    records that fail. `decode` takes a batch with the column value (the others are not read)."""

    PREFIX, SUFFIX = b'{"v":', b"}\n"
    MIN_BLOCK = 1 << 20  # read_json's default block; a block must hold the longest line

    def __init__(self, resolved: Resolved, value_type: pa.DataType) -> None:
        self.type = value_type
        mapped, self.convert, self.raw = json_mapping(json.loads(resolved.latest))
        self.whole_text = self.raw and pa.types.is_string(mapped)  # the top itself is raw text
        self.schema = pa.schema([pa.field("v", value_type)])

    def decode(self, batch: pa.RecordBatch) -> Decoded:
        if self.raw:
            return self._per_record(batch.column("value").to_pylist())
        payloads = batch.column("value").fill_null(b"")
        for newline in ("\n", "\r"):  # JSON allows them only as whitespace between tokens
            payloads = pc.replace_substring(payloads, newline, " ")
        lines = pc.binary_join_element_wise(self.PREFIX, payloads, self.SUFFIX, b"")
        if lines.type != pa.binary():
            lines = lines.cast(pa.binary())
        _validity, offsets_buffer, data = lines.buffers()
        offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[lines.offset:lines.offset + len(lines) + 1]
        longest = int(np.diff(offsets).max()) if len(lines) else 0
        reader = _LineReader(data, offsets, self.schema, max(self.MIN_BLOCK, longest + 1))
        pieces: list[pa.Array] = []
        bad: list[int] = []
        reader.read(0, len(lines), pieces, bad)
        values = pa.concat_arrays(pieces) if pieces else pa.array([], type=self.type)
        return Decoded(values, pa.array(bad, pa.int64()), reader.reason)

    def _per_record(self, payloads: list[bytes | None]) -> Decoded:
        out: list[Any] = []
        bad: list[int] = []
        reason = None
        for i, payload in enumerate(payloads):
            try:
                parsed = json.loads(payload or b"")
                if self.whole_text:
                    out.append(None if parsed is None else (payload or b"").decode())
                else:
                    out.append(self.convert(parsed))
            except ValueError as e:  # json's errors, UnicodeDecodeError and _NotOfType are ValueErrors
                bad.append(i)
                reason = reason or f"{type(e).__name__}: {e}"
                out.append(None)
        return _to_arrow(out, self.type, bad, reason)


class _LineReader:
    def __init__(self, data: pa.Buffer, offsets: Any, schema: pa.Schema, block: int) -> None:
        self.data, self.offsets, self.schema = data, offsets, schema
        self.read_options = pa_json.ReadOptions(use_threads=False, block_size=block)  # a reader is one core
        self.parse_options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        self.reason: str | None = None

    def read(self, low: int, high: int, pieces: list[pa.Array], bad: list[int]) -> None:
        """Append the values of lines [low, high) to `pieces` and the lines that fail to `bad`, in order."""
        start, end = int(self.offsets[low]), int(self.offsets[high])
        try:
            table = pa_json.read_json(pa.BufferReader(self.data.slice(start, end - start)),
                                      read_options=self.read_options, parse_options=self.parse_options)
            if table.num_rows == high - low:
                column = table.column(0)
                column.validate(full=True)  # the reader copies strings without checking their UTF-8
                pieces.extend(_as_type(column.chunks, self.schema.field(0).type))
                return
            problem = f"{table.num_rows} rows from {high - low} payloads (several documents in one)"
        except pa.ArrowInvalid as e:
            problem = f"ArrowInvalid: {e}"
        if high - low == 1:
            self.reason = self.reason or problem
            pieces.append(pa.nulls(1, self.schema.field(0).type))
            bad.append(low)
            return
        middle = (low + high) // 2
        self.read(low, middle, pieces, bad)
        self.read(middle, high, pieces, bad)


def _as_type(chunks: list[pa.Array], value_type: pa.DataType) -> Iterator[pa.Array]:
    for chunk in chunks:
        yield chunk if chunk.type == value_type else chunk.cast(value_type)

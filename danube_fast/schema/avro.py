"""Avro schemas: Apache `avro` (the reference implementation) parses definitions and judges compatibility;
fastavro checks field defaults and decodes payloads. docs/SCHEMAS.md gives the rules.

A definition is refused when the reference parser refuses it (an unknown type, a union with two branches
of one type, an enum default outside its symbols, ...), when fastavro does (a field default that does not
match the field's type), or when an array's items encode in no bytes at all (`null`, a zero-size fixed, a
record of such fields): a payload of ten bytes could then claim 2^60 items, and decoding it would not end.

Compatibility is the reference `ReaderWriterCompatibilityChecker`: "data written with the writer schema can
be read with the reader schema", the Avro specification's schema resolution.

Payload validation decodes the payload as one Avro binary datum (not an object container file), about 2 us
for a four-field record with fastavro, and requires it to consume the payload exactly. A recursive schema's
payloads go through the reference reader instead (about 14 us): see AvroSchema.recursive. Like both
libraries, it does not refuse a boolean byte other than 0 or 1, or an `int` wider than 32 bits.
"""

from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass
from typing import Any

import avro.errors
import avro.io
import avro.schema
import fastavro
from avro.compatibility import (
    ReaderWriterCompatibilityChecker,
    SchemaCompatibilityType,
    SchemaIncompatibilityType,
)

from danube_fast.schema.errors import InvalidSchema

# What a malformed definition makes either library raise besides its own exception types.
_PARSE_ERRORS = (avro.errors.AvroException, fastavro.schema.SchemaParseException, ValueError, TypeError,
                 KeyError, AttributeError)
# What fastavro or the reference reader raises on a payload that is not a datum of the schema.
_DECODE_ERRORS = (EOFError, IndexError, ValueError, KeyError, TypeError, OverflowError, struct.error,
                  avro.errors.AvroException)


@dataclass(frozen=True, eq=False)
class AvroSchema:
    reference: avro.schema.Schema  # Apache avro's tree: compatibility, and decoding when `recursive`
    decoder: Any  # fastavro's parsed form: payload decoding
    # A named type inside itself (a linked list, a tree): a payload may nest as deep as it likes, and
    # fastavro's C reader, which recurses per level, overflows the stack at about 10,000 levels (a 10 KB
    # payload killed the process). Such schemas are decoded by the reference reader, whose recursion is
    # Python's and stops with RecursionError.
    recursive: bool = False


def parse(value: Any) -> AvroSchema:
    """The parsed schema of a JSON value; InvalidSchema says what is wrong."""
    try:
        reference = avro.schema.parse(json.dumps(value))
        decoder = fastavro.parse_schema(value)
    except RecursionError as e:
        raise InvalidSchema("Invalid Avro schema: nested too deeply") from e
    except _PARSE_ERRORS as e:
        raise InvalidSchema(f"Invalid Avro schema: {e}") from e
    empty = _zero_width_items(reference, set())
    if empty is not None:
        raise InvalidSchema(f"Invalid Avro schema: an array of {empty} takes no bytes per item, so a short "
                            "payload could claim any number of them")
    return AvroSchema(reference, decoder, _recursive(reference, []))


def _recursive(schema: avro.schema.Schema, path: list[int]) -> bool:
    """Whether a named type on `path` (the types being expanded) appears again below itself."""
    if id(schema) in path:
        return True
    if isinstance(schema, avro.schema.RecordSchema):
        children = [f.type for f in schema.fields]
    elif isinstance(schema, avro.schema.UnionSchema):
        children = list(schema.schemas)
    elif isinstance(schema, avro.schema.ArraySchema):
        children = [schema.items]
    elif isinstance(schema, avro.schema.MapSchema):
        children = [schema.values]
    else:
        return False
    path.append(id(schema))
    try:
        return any(_recursive(child, path) for child in children)
    finally:
        path.pop()


def _zero_width(schema: avro.schema.Schema, seen: set[int]) -> bool:
    """Whether a datum of `schema` encodes in no bytes."""
    if schema.type == "null":
        return True
    if isinstance(schema, avro.schema.FixedSchema):
        return bool(schema.size == 0)
    if isinstance(schema, avro.schema.RecordSchema):
        if id(schema) in seen:  # a recursive record holds a union or an array somewhere: not zero-width
            return False
        seen.add(id(schema))
        try:
            return all(_zero_width(f.type, seen) for f in schema.fields)
        finally:
            seen.discard(id(schema))
    return False


def _zero_width_items(schema: avro.schema.Schema, seen: set[int]) -> str | None:
    """The type of the first array whose items take no bytes, or None."""
    if id(schema) in seen:
        return None
    seen.add(id(schema))
    if isinstance(schema, avro.schema.ArraySchema):
        if _zero_width(schema.items, set()):
            return str(schema.items.type)
        return _zero_width_items(schema.items, seen)
    if isinstance(schema, avro.schema.MapSchema):
        return _zero_width_items(schema.values, seen)
    if isinstance(schema, avro.schema.UnionSchema):
        children = list(schema.schemas)
    elif isinstance(schema, avro.schema.RecordSchema):
        children = [f.type for f in schema.fields]
    else:
        return None
    for child in children:
        found = _zero_width_items(child, seen)
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------------------------------- compatibility

def resolution_errors(reader: AvroSchema, writer: AvroSchema, reader_label: str,
                      writer_label: str) -> list[str]:
    """Why data written with `writer` cannot be read with `reader` (empty: it can)."""
    result = ReaderWriterCompatibilityChecker().get_compatibility(reader.reference, writer.reference)
    if result.compatibility is not SchemaCompatibilityType.incompatible:
        return []
    # The checker keeps its messages and locations as two unpaired sets, so they are named side by side;
    # a missing default's message is the bare field name, worth a sentence when it is the only kind.
    kinds = {kind for kind in result.incompatibilities}
    at = ", ".join(sorted(result.locations))
    if kinds == {SchemaIncompatibilityType.reader_field_missing_default_value}:
        names = ", ".join(repr(m) for m in sorted(result.messages))
        return [f"field {names} of the {reader_label} has no default and the {writer_label} does not have it "
                f"(at {at})"]
    named = ", ".join(sorted(kind.value for kind in kinds))
    return [f"the {reader_label} cannot read data of the {writer_label} ({named}): "
            f"{'; '.join(sorted(result.messages))} (at {at})"]


# ------------------------------------------------------------------------------------------- decoding

class NotADatum(ValueError):
    """A payload that is not one binary Avro datum of the schema; the message says why."""


def read_datum(schema: AvroSchema, payload: bytes) -> Any:
    """The one binary Avro datum of `schema` that `payload` holds, or NotADatum. A recursive schema is read
    by the reference reader (see AvroSchema.recursive): a hostile payload cannot overflow the C stack."""
    stream = io.BytesIO(payload)
    try:
        if schema.recursive:
            datum = avro.io.DatumReader(schema.reference).read(avro.io.BinaryDecoder(stream))
        else:
            datum = fastavro.schemaless_reader(stream, schema.decoder, None)
    except RecursionError:
        raise NotADatum("not an Avro datum of the schema: nested too deeply") from None
    except _DECODE_ERRORS as e:
        raise NotADatum(f"not an Avro datum of the schema: {type(e).__name__}: {e}") from e
    left = len(payload) - stream.tell()
    if left:
        raise NotADatum(f"not an Avro datum of the schema: {left} bytes left after the datum")
    return datum


def datum_errors(schema: AvroSchema, payload: bytes) -> str | None:
    """Why `payload` is not one binary Avro datum of `schema` (None: it is)."""
    try:
        read_datum(schema, payload)
    except NotADatum as e:
        return str(e)
    return None

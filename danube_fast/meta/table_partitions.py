"""The policy's `tablePartitionBy` (docs/TABLES.md, "Partitioning"): a topic table's partition fields beyond
the publish time's period, in Spark's DDL syntax, comma-separated: a column (`region`, identity),
`bucket(16, user_id)`, `truncate(4, sku)`, `year|month|day|hour(event_time)` (Spark's plurals too).

Parsed where a policy is checked, so a malformed one is refused when it is set; whether its columns exist
and take the transform is the table writer's check (tables/partitions.py), against the table's schema.
Hand-written: pyiceberg parses no partition DDL, and this grammar is five forms."""

from __future__ import annotations

import re
from dataclasses import dataclass

# name in the policy -> Iceberg transform (Spark's DDL plurals included)
TRANSFORMS = {"identity": "identity", "bucket": "bucket", "truncate": "truncate", "year": "year",
              "years": "year", "month": "month", "months": "month", "day": "day", "days": "day",
              "hour": "hour", "hours": "hour"}
WIDTHS = ("bucket", "truncate")  # the transforms that take a number first
OWN_SETTINGS = {"timestamp": "tablePartitioning", "partition": "the topic's partitions"}
MAX_WIDTH = 2**31 - 1
GRAMMAR = ("comma-separated columns, bucket(N, column), truncate(W, column) or year|month|day|hour(column), "
           "e.g. 'region, bucket(16, user_id)'")
_COLUMN = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_ITEM = re.compile(rf"\s*(?:(?P<transform>[A-Za-z]+)\s*\(\s*(?:(?P<width>\d+)\s*,\s*)?"
                   rf"(?P<inner>{_COLUMN})\s*\)|(?P<bare>{_COLUMN}))\s*(?P<end>,|$)")


@dataclass(frozen=True)
class PartitionField:
    transform: str  # identity, bucket, truncate, year, month, day or hour
    column: str  # a column of the table (dotted for a field of a struct column)
    width: int = 0  # bucket's count, truncate's width

    @property
    def name(self) -> str:
        """The Iceberg partition field's name (Spark's for the same DDL)."""
        if self.transform == "identity":
            return self.column.replace(".", "_")
        suffix = f"{self.transform}_{self.width}" if self.width else self.transform
        return f"{self.column.replace('.', '_')}_{suffix}"

    def __str__(self) -> str:
        if self.transform == "identity":
            return self.column
        return f"{self.transform}({self.width}, {self.column})" if self.width else \
            f"{self.transform}({self.column})"


def parse(text: str) -> tuple[PartitionField, ...]:
    """The fields `text` names, in order; ValueError saying what is wrong with it."""
    fields: list[PartitionField] = []
    text = text.strip()
    pos = 0
    while pos < len(text):
        m = _ITEM.match(text, pos)
        if m is None:
            raise ValueError(f"cannot read {text[pos:].strip()!r}: give {GRAMMAR}")
        pos = m.end()
        if m["bare"] is not None:
            field = PartitionField("identity", m["bare"])
        else:
            name = m["transform"].lower()
            transform = TRANSFORMS.get(name)
            if transform is None:
                raise ValueError(f"{m['transform']!r} is not a partition transform: give {GRAMMAR}")
            width = int(m["width"]) if m["width"] is not None else 0
            if transform in WIDTHS and not 0 < width <= MAX_WIDTH:
                raise ValueError(f"{transform} needs a number from 1 to {MAX_WIDTH} before its column: "
                                 f"{transform}(N, {m['inner']})")
            if transform not in WIDTHS and m["width"] is not None:
                raise ValueError(f"{transform} takes a column only: {transform}({m['inner']})")
            field = PartitionField(transform, m["inner"], width)
        if field.column in OWN_SETTINGS:
            raise ValueError(f"{field.column} is partitioned by {OWN_SETTINGS[field.column]}, not here")
        if any(f.column == field.column for f in fields):
            raise ValueError(f"column {field.column} is named twice: one partition field per column")
        fields.append(field)
        if m["end"] == "" and pos < len(text):
            raise ValueError(f"cannot read {text[pos:].strip()!r}: give {GRAMMAR}")
    return tuple(fields)


def canonical(text: str) -> str:
    """`text` as parse reads it, written back one way (what a policy stores); ValueError as parse."""
    return ", ".join(str(f) for f in parse(text))

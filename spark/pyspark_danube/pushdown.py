"""Filter pushdown (PySpark 4.1+, `spark.sql.python.filterPushdown.enabled`): which filters prune what.

- `offset` comparisons (=, <, <=, >, >=) narrow each stored topic's offsets: applied exactly (the reader
  cuts to them), so Spark does not evaluate them again; IN narrows to its values' range and goes back to
  Spark for the values in between.
- `topic` and `partition` equality and IN keep only the stored topics they name: exact too.
- `timestamp` comparisons prune whole objects by their footer's min/max publish time and are returned to
  Spark, which evaluates them on the rows: a timestamp literal may come without a time zone, so pruning uses
  a margin then and never drops a row that matches.
Anything else goes back to Spark untouched.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

NAIVE_MARGIN_MS = 14 * 3600 * 1000  # the widest UTC offset: a naive literal's instant is within this


@dataclass(frozen=True)
class Bounds:
    """What the pushed filters allow: offsets [min_offset, max_offset), publish times [min_time, max_time)
    in ms (for pruning only), the topic and partition values (None: any)."""

    min_offset: int = 0
    max_offset: int | None = None
    min_time: int | None = None
    max_time: int | None = None
    topics: frozenset[str] | None = None
    partitions: frozenset[int] | None = None
    empty: bool = False  # contradictory filters: nothing matches


def push(filters: list[Filter], bounds: Bounds) -> tuple[Bounds, list[Filter]]:
    """The bounds with every usable filter applied, and the filters Spark must still evaluate."""
    rest: list[Filter] = []
    for f in filters:
        attribute = getattr(f, "attribute", ())
        column = attribute if isinstance(attribute, tuple) else (attribute,)
        if len(column) != 1:
            rest.append(f)
            continue
        name = column[0]
        if name == "offset" and _is_int(f):
            bounds = _offsets(f, bounds)
            if isinstance(f, In):
                rest.append(f)  # narrowed to its range; Spark keeps only the listed offsets
        elif name in ("topic", "partition") and isinstance(f, (EqualTo, In)):
            values = frozenset(f.value if isinstance(f, In) else (f.value,))
            if name == "topic" and all(isinstance(v, str) for v in values):
                bounds = replace(bounds, topics=values if bounds.topics is None else bounds.topics & values)
            elif name == "partition" and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                bounds = replace(bounds, partitions=values if bounds.partitions is None
                                 else bounds.partitions & values)
            else:
                rest.append(f)
        elif name == "timestamp" and isinstance(f, (GreaterThan, GreaterThanOrEqual, LessThan,
                                                    LessThanOrEqual, EqualTo)) and \
                isinstance(f.value, dt.datetime):
            bounds = _times(f, bounds)
            rest.append(f)  # pruning only: Spark checks the rows
        else:
            rest.append(f)
    return bounds, rest


def _is_int(f: Filter) -> bool:
    values = f.value if isinstance(f, In) else (getattr(f, "value", None),)
    return isinstance(f, (EqualTo, In, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)) and \
        all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _offsets(f: Any, b: Bounds) -> Bounds:
    lo, hi = b.min_offset, b.max_offset
    if isinstance(f, EqualTo):
        lo, hi = max(lo, f.value), f.value + 1 if hi is None else min(hi, f.value + 1)
    elif isinstance(f, In):
        if not f.value:
            return replace(b, empty=True)
        lo = max(lo, min(f.value))
        top = max(f.value) + 1
        hi = top if hi is None else min(hi, top)
    elif isinstance(f, GreaterThan):
        lo = max(lo, f.value + 1)
    elif isinstance(f, GreaterThanOrEqual):
        lo = max(lo, f.value)
    elif isinstance(f, LessThan):
        hi = f.value if hi is None else min(hi, f.value)
    else:
        hi = f.value + 1 if hi is None else min(hi, f.value + 1)
    lo = max(lo, 0)
    return replace(b, min_offset=lo, max_offset=hi, empty=b.empty or (hi is not None and hi <= lo))


def _ms(value: dt.datetime, margin_sign: int) -> int:
    if value.tzinfo is not None:
        return int(value.timestamp() * 1000)
    # Naive: an instant in some time zone within NAIVE_MARGIN_MS of UTC; widen the bound outward.
    return int(value.replace(tzinfo=dt.UTC).timestamp() * 1000) + margin_sign * NAIVE_MARGIN_MS


def _times(f: Any, b: Bounds) -> Bounds:
    lo, hi = b.min_time, b.max_time
    if isinstance(f, (GreaterThan, GreaterThanOrEqual, EqualTo)):
        value = _ms(f.value, -1)  # ms precision: a > bound is kept as >= (conservative)
        lo = value if lo is None else max(lo, value)
    if isinstance(f, (LessThan, LessThanOrEqual, EqualTo)):
        value = _ms(f.value, +1) + 1
        hi = value if hi is None else min(hi, value)
    return replace(b, min_time=lo, max_time=hi)

"""Topic names (wire/CONTRACT.md C.2): `/namespace/topic`, partitions `<base>-part-<N>`, dead letters `-dlq`.

Stricter than v0.7.3 on purpose (its quirks let `//t`, `/ns/` and `a/b/c` through): exactly two non-empty
segments after a leading `/`, each of Unicode letters and digits, `_` and `-`. A name that passes is safe as a
metadata key component and as a directory name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from danube_fast.broker.errors import invalid

_PARTITION = re.compile(r"^(?P<base>.+)-part-(?P<index>0|[1-9][0-9]*)$")
DLQ_SUFFIX = "-dlq"


def _segment_ok(text: str) -> bool:
    return bool(text) and all(c.isalnum() or c in "_-" for c in text)


@dataclass(frozen=True)
class TopicName:
    namespace: str
    topic: str

    @property
    def full(self) -> str:
        return f"/{self.namespace}/{self.topic}"

    def __str__(self) -> str:
        return self.full


def parse_topic(name: str) -> TopicName:
    """A valid topic name split into (namespace, topic); INVALID_ARGUMENT with the contract's text if not."""
    parts = name.split("/")
    if len(parts) != 3 or parts[0] != "" or not _segment_ok(parts[1]) or not _segment_ok(parts[2]):
        raise invalid(f"The topic: {name} has an invalid format, should be: /namespace_name/topic_name")
    return TopicName(parts[1], parts[2])


def partition_base(topic: str) -> str | None:
    """The base of a partition's short name (`orders-part-2` -> `orders`), None for a plain topic."""
    m = _PARTITION.match(topic)
    return m.group("base") if m else None


def is_partition_of(topic: str, base: str) -> bool:
    """Exact `-part-N` matching: `orders_v2` is not a partition of `orders` (v0.7.3's prefix defect)."""
    return partition_base(topic) == base


def partition_index(topic: str) -> int:
    m = _PARTITION.match(topic)
    return int(m.group("index")) if m else -1


def dead_letter_topic(name: TopicName) -> TopicName:
    return TopicName(name.namespace, name.topic + DLQ_SUFFIX)

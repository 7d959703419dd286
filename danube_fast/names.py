"""Topic names (docs/WIRE.md C.2): `/namespace/topic`, partitions `<base>-part-<N>`, dead letters `-dlq`.

Stricter than v0.7.3 on purpose (its quirks let `//t`, `/ns/` and `a/b/c` through): exactly two non-empty
segments after a leading `/`, each of Unicode letters and digits, `_` and `-`. A name that passes is safe as a
metadata key component and as a directory name: the WAL lives in `{wal_root}/{namespace}/{topic}/`, so each
segment must fit a file system's NAME_MAX (255 bytes) with room for the `-dlq` suffix of its dead letters.

The other names clients choose (subscription, producer, consumer, schema subject) are bounded and free of
control characters too: they are metadata key components or values, and they come back in error messages,
which must stay small (gRPC carries them in a header; a 10 KB name would overflow the client's metadata
limit and turn the answer into RESOURCE_EXHAUSTED). `clip` shortens any client text quoted in a message.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from danube_fast.errors import invalid

_PARTITION = re.compile(r"^(?P<base>.+)-part-(?P<index>0|[1-9][0-9]*)$")
DLQ_SUFFIX = "-dlq"

MAX_NAMESPACE_BYTES = 64  # UTF-8 bytes of a namespace
MAX_TOPIC_BYTES = 192  # UTF-8 bytes of a topic's short name (a directory name: NAME_MAX is 255)
MAX_NAME_BYTES = 256  # UTF-8 bytes of a subscription, producer or consumer name, or a schema subject
_MAX_FULL_CHARS = 2 + MAX_NAMESPACE_BYTES + MAX_TOPIC_BYTES  # no valid full name has more characters
CLIP_CHARS = 100  # client text quoted in an error message beyond this is cut


def clip(text: str) -> str:
    """`text` for an error message: whole when short, else its start and its size."""
    if len(text) <= CLIP_CHARS:
        return text
    return f"{text[:CLIP_CHARS - 20]}... ({len(text.encode('utf-8', 'replace'))} bytes)"


def _segment_ok(text: str) -> bool:
    return bool(text) and all(c.isalnum() or c in "_-" for c in text)


def check_namespace(namespace: str) -> str:
    """`namespace` if it is a valid namespace name, else INVALID_ARGUMENT saying why."""
    if not _segment_ok(namespace) or len(namespace.encode()) > MAX_NAMESPACE_BYTES:
        raise invalid(f"namespace name {clip(namespace)!r} is invalid: use 1 to {MAX_NAMESPACE_BYTES} bytes "
                      "of letters, digits, '_' and '-'")
    return namespace


def check_name(value: str, what: str, *, slash: bool = True) -> str:
    """`value` if it is a valid client-chosen name (`what` says which, e.g. "Subscribe.subscription"):
    non-empty, at most MAX_NAME_BYTES, no control characters, and no `/` when `slash` is False (the name is a
    metadata key component)."""
    if not value:
        raise invalid(f"{what} is empty: give it a name")
    if len(value) > MAX_NAME_BYTES or len(value.encode()) > MAX_NAME_BYTES:
        raise invalid(f"{what} {clip(value)!r} is too long: at most {MAX_NAME_BYTES} bytes")
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise invalid(f"{what} {clip(value)!r} contains a control character")
    if not slash and "/" in value:
        raise invalid(f"{what} {clip(value)!r} must not contain '/'")
    return value


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
    if len(name) > _MAX_FULL_CHARS or len(name.encode()) > _MAX_FULL_CHARS:
        raise invalid(f"The topic: {clip(name)} is too long: at most {MAX_NAMESPACE_BYTES} bytes of "
                      f"namespace and {MAX_TOPIC_BYTES} bytes of topic")
    parts = name.split("/")
    if len(parts) != 3 or parts[0] != "" or not _segment_ok(parts[1]) or not _segment_ok(parts[2]):
        raise invalid(f"The topic: {name} has an invalid format, should be: /namespace_name/topic_name")
    if len(parts[1].encode()) > MAX_NAMESPACE_BYTES or len(parts[2].encode()) > MAX_TOPIC_BYTES:
        raise invalid(f"The topic: {name} is too long: at most {MAX_NAMESPACE_BYTES} bytes of namespace and "
                      f"{MAX_TOPIC_BYTES} bytes of topic")
    return TopicName(parts[1], parts[2])


def check_topic(name: TopicName) -> TopicName:
    """A name made by the broker (a dead-letter topic, a partition) within the same rules as a parsed one."""
    return parse_topic(name.full)


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

"""Every metadata key of the product, as a function: the etcd layout of Danube, exactly
(docs/METADATA.md#key-layout).

This module is the single owner of key paths. No other module builds or splits a path string: they call a
function here (a test scans the code base for path literals elsewhere). Upstream's layout places every key;
its resource mapping places the three it does not (`/topics/{ns}/{topic}/policy`,
`/topics/{ns}/{topic}/schema`, `/cluster/load_balance`), as docs/METADATA.md says. Object descriptors live
under `/danube-data/storage/...`, not the older `/storage/...` (docs/METADATA.md#storage-keys).

Rules kept here so that every key can be parsed back without ambiguity:
- names (cluster, namespace, topic, subscription, schema subject) are non-empty and contain no `/` or NUL;
- ids (broker, producer, consumer, schema) are unsigned 64-bit integers in canonical decimal; schema versions
  are unsigned 32-bit (Danube's `u32`); offsets are unsigned 64-bit, zero-padded to 20 digits in keys so that
  keys sort in offset order (20 digits hold any u64);
- a cluster name may not be one of the words `/cluster/` already uses, and a schema subject may not be
  `_global` or `_index`, so that those keys cannot collide with the fixed ones.
A violation raises `InvalidKey`. Parsers raise `InvalidKey` for a key of another shape, which is how a watch
handler tells apart the keys under one prefix (e.g. `broker_state` and `broker_topic` keys both sit under
`broker_topics_prefix`).

Every prefix ends with `/`: `/cluster/load` is a prefix of `/cluster/load_balance` and `/topics/ns/t` of
`/topics/ns/t2`, so a watch on a prefix without the slash would see keys it does not own.
"""

from __future__ import annotations

from danube_fast.meta.store import InvalidKey

U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1
OFFSET_DIGITS = 20  # len(str(U64_MAX)) == 20

_ANY = None  # a placeholder component in a key shape
_Shape = tuple[str | None, ...]

_CLUSTER_WORDS = frozenset({"register", "brokers", "unassigned", "load", "load_balance", "leader",
                            "replicas"})
_SCHEMA_WORDS = frozenset({"_global", "_index"})


# ---------------------------------------------------------------------------------------------- validation

def _name(value: str, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidKey(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidKey(f"{what} must not be empty")
    if "/" in value:
        raise InvalidKey(f"{what} {value!r} must not contain '/'")
    if "\x00" in value:
        raise InvalidKey(f"{what} {value!r} must not contain NUL")
    return value


def _uint(value: int, what: str, maximum: int = U64_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidKey(f"{what} must be an integer, got {type(value).__name__}")
    if not 0 <= value <= maximum:
        raise InvalidKey(f"{what} {value} is outside 0..{maximum}")
    return value


def _decimal(text: str, what: str, key: str, maximum: int = U64_MAX) -> int:
    """A canonical decimal component back to an int (int() alone would take '+1', ' 1', '1_0', '٣')."""
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0"):
        raise InvalidKey(f"{what} {text!r} in key {key!r} is not a canonical unsigned decimal")
    value = int(text)
    if value > maximum:
        raise InvalidKey(f"{what} {text} in key {key!r} is outside 0..{maximum}")
    return value


def pad_offset(offset: int) -> str:
    """An offset as the 20-digit zero-padded text used in object descriptor keys and `objects/cur`."""
    return f"{_uint(offset, 'offset'):0{OFFSET_DIGITS}d}"


def parse_padded_offset(text: str) -> int:
    if len(text) != OFFSET_DIGITS or not (text.isascii() and text.isdigit()):
        raise InvalidKey(f"offset {text!r} is not {OFFSET_DIGITS} zero-padded decimal digits")
    value = int(text)
    if value > U64_MAX:
        raise InvalidKey(f"offset {text} is outside 0..{U64_MAX}")
    return value


# ------------------------------------------------------------------------------------------ shape helpers

def _key(*parts: str) -> str:
    return "/" + "/".join(parts)


def _prefix(*parts: str) -> str:
    return "/" + "/".join(parts) + "/"


def _match(key: str, shape: _Shape, what: str) -> list[str]:
    """The placeholder components of `key` if it has `shape`; InvalidKey otherwise."""
    if not isinstance(key, str) or not key.startswith("/"):
        raise InvalidKey(f"{key!r} is not a {what} key (keys are absolute paths)")
    parts = key[1:].split("/")
    if len(parts) != len(shape):
        raise InvalidKey(f"{key!r} is not a {what} key")
    found: list[str] = []
    for part, expected in zip(parts, shape, strict=True):
        if expected is None:
            if not part or "\x00" in part:
                raise InvalidKey(f"{key!r} is not a {what} key (empty or NUL component)")
            found.append(part)
        elif part != expected:
            raise InvalidKey(f"{key!r} is not a {what} key")
    return found


# ------------------------------------------------------------------------------------------- topic names

def topic_name(namespace: str, topic: str) -> str:
    """Danube's topic name: `/{namespace}/{topic}`."""
    return _key(_name(namespace, "namespace"), _name(topic, "topic"))


def split_topic_name(name: str) -> tuple[str, str]:
    """`/{namespace}/{topic}` -> (namespace, topic)."""
    namespace, topic = _match(name, (_ANY, _ANY), "topic name")
    return namespace, topic


# ---------------------------------------------------------------------------------------------- /cluster

_CLUSTER_NAME: _Shape = ("cluster", _ANY)
_REGISTER: _Shape = ("cluster", "register", _ANY)
_BROKER_STATE: _Shape = ("cluster", "brokers", _ANY, "state")
_BROKER_TOPIC: _Shape = ("cluster", "brokers", _ANY, _ANY, _ANY)
_UNASSIGNED: _Shape = ("cluster", "unassigned", _ANY, _ANY)
_LOAD: _Shape = ("cluster", "load", _ANY)
_REPLICAS: _Shape = ("cluster", "replicas", _ANY, _ANY)


def cluster_name(cluster: str) -> str:
    """`/cluster/{CLUSTER_NAME}`, value null: the cluster exists."""
    name = _name(cluster, "cluster name")
    if name in _CLUSTER_WORDS:
        raise InvalidKey(f"cluster name {name!r} is reserved (it is a word of the /cluster/ layout)")
    return _key("cluster", name)


def parse_cluster_name(key: str) -> str:
    (name,) = _match(key, _CLUSTER_NAME, "cluster name")
    if name in _CLUSTER_WORDS:
        raise InvalidKey(f"{key!r} is not a cluster name key")
    return name


def register_prefix() -> str:
    return _prefix("cluster", "register")


def broker_register(broker_id: int) -> str:
    """`/cluster/register/{broker_id}`: the broker's endpoints, under its lease."""
    return _key("cluster", "register", str(_uint(broker_id, "broker_id")))


def parse_broker_register(key: str) -> int:
    (broker_id,) = _match(key, _REGISTER, "broker registration")
    return _decimal(broker_id, "broker_id", key)


def brokers_prefix() -> str:
    return _prefix("cluster", "brokers")


def broker_topics_prefix(broker_id: int) -> str:
    """What a broker watches for its assignments; its `broker_state` key is under it too."""
    return _prefix("cluster", "brokers", str(_uint(broker_id, "broker_id")))


def broker_state(broker_id: int) -> str:
    """`/cluster/brokers/{broker_id}/state`: {mode, reason}."""
    return _key("cluster", "brokers", str(_uint(broker_id, "broker_id")), "state")


def parse_broker_state(key: str) -> int:
    (broker_id,) = _match(key, _BROKER_STATE, "broker state")
    return _decimal(broker_id, "broker_id", key)


def broker_topic(broker_id: int, namespace: str, topic: str) -> str:
    """`/cluster/brokers/{broker_id}/{namespace}/{topic}`, value null: the topic is assigned to the broker."""
    return _key("cluster", "brokers", str(_uint(broker_id, "broker_id")),
                _name(namespace, "namespace"), _name(topic, "topic"))


def parse_broker_topic(key: str) -> tuple[int, str, str]:
    broker_id, namespace, topic = _match(key, _BROKER_TOPIC, "topic assignment")
    return _decimal(broker_id, "broker_id", key), namespace, topic


def unassigned_prefix() -> str:
    """What the load manager watches."""
    return _prefix("cluster", "unassigned")


def unassigned(namespace: str, topic: str) -> str:
    """`/cluster/unassigned/{namespace}/{topic}`: null (new topic) or {reason, from_broker} (unloaded)."""
    return _key("cluster", "unassigned", _name(namespace, "namespace"), _name(topic, "topic"))


def parse_unassigned(key: str) -> tuple[str, str]:
    namespace, topic = _match(key, _UNASSIGNED, "unassigned topic")
    return namespace, topic


def load_prefix() -> str:
    return _prefix("cluster", "load")


def load_report(broker_id: int) -> str:
    """`/cluster/load/{broker_id}`: the broker's load report."""
    return _key("cluster", "load", str(_uint(broker_id, "broker_id")))


def parse_load_report(key: str) -> int:
    (broker_id,) = _match(key, _LOAD, "load report")
    return _decimal(broker_id, "broker_id", key)


def load_balance() -> str:
    """`/cluster/load_balance` (docs/METADATA.md#cluster-keys): the load manager's last decision."""
    return _key("cluster", "load_balance")


def replicas_prefix() -> str:
    return _prefix("cluster", "replicas")


def replicas(namespace: str, topic: str) -> str:
    """`/cluster/replicas/{namespace}/{topic}`: {owner, followers, isr} of a replicated topic, written by its
    owner (docs/REPLICATION.md)."""
    return _key("cluster", "replicas", _name(namespace, "namespace"), _name(topic, "topic"))


def parse_replicas(key: str) -> tuple[str, str]:
    namespace, topic = _match(key, _REPLICAS, "topic replicas")
    return namespace, topic


def leader() -> str:
    """`/cluster/leader`: the leader's broker id; its create revision is the controller epoch."""
    return _key("cluster", "leader")


def cluster_prefix() -> str:
    return _prefix("cluster")


# ------------------------------------------------------------------------------------------- /namespaces

_NAMESPACE_POLICY: _Shape = ("namespaces", _ANY, "policy")
_NAMESPACE_TOPIC: _Shape = ("namespaces", _ANY, "topics", _ANY, _ANY)


def namespaces_prefix() -> str:
    return _prefix("namespaces")


def namespace_prefix(namespace: str) -> str:
    return _prefix("namespaces", _name(namespace, "namespace"))


def namespace_policy(namespace: str) -> str:
    """`/namespaces/{namespace}/policy`: the namespace's default policy."""
    return _key("namespaces", _name(namespace, "namespace"), "policy")


def parse_namespace_policy(key: str) -> str:
    (namespace,) = _match(key, _NAMESPACE_POLICY, "namespace policy")
    return namespace


def namespace_topics_prefix(namespace: str) -> str:
    return _prefix("namespaces", _name(namespace, "namespace"), "topics")


def namespace_topic(namespace: str, topic: str) -> str:
    """`/namespaces/{namespace}/topics/{namespace}/{topic}`, value null (the namespace appears twice)."""
    ns = _name(namespace, "namespace")
    return _key("namespaces", ns, "topics", ns, _name(topic, "topic"))


def parse_namespace_topic(key: str) -> tuple[str, str]:
    namespace, again, topic = _match(key, _NAMESPACE_TOPIC, "namespace topic")
    if namespace != again:
        raise InvalidKey(f"{key!r} names two namespaces ({namespace!r}, {again!r})")
    return namespace, topic


# ----------------------------------------------------------------------------------------------- /topics

_TOPIC_ROOT: _Shape = ("topics", _ANY, _ANY)
_TOPIC_PRODUCER: _Shape = ("topics", _ANY, _ANY, "producers", _ANY)
_TOPIC_SUBSCRIPTION: _Shape = ("topics", _ANY, _ANY, "subscriptions", _ANY)
_SUBSCRIPTION_CURSOR: _Shape = ("topics", _ANY, _ANY, "subscriptions", _ANY, "cursor")
_SUBSCRIPTION_DELAYED: _Shape = ("topics", _ANY, _ANY, "subscriptions", _ANY, "delayed")


def _topic(namespace: str, topic: str) -> tuple[str, str, str]:
    return "topics", _name(namespace, "namespace"), _name(topic, "topic")


def topics_prefix() -> str:
    return _prefix("topics")


def topic_root(namespace: str, topic: str) -> str:
    """`/topics/{namespace}/{topic}`: the number of partitions (0 = not partitioned); the topic exists."""
    return _key(*_topic(namespace, topic))


def parse_topic_root(key: str) -> tuple[str, str]:
    namespace, topic = _match(key, _TOPIC_ROOT, "topic root")
    return namespace, topic


def topic_prefix(namespace: str, topic: str) -> str:
    """Every key under the topic root (not the root itself)."""
    return _prefix(*_topic(namespace, topic))


def topic_delivery(namespace: str, topic: str) -> str:
    """`/topics/{namespace}/{topic}/delivery`: "Reliable" or "NonReliable"."""
    return _key(*_topic(namespace, topic), "delivery")


def topic_policy(namespace: str, topic: str) -> str:
    """`/topics/{namespace}/{topic}/policy` (docs/METADATA.md#topic-keys): the topic's own policy."""
    return _key(*_topic(namespace, topic), "policy")


def topic_schema(namespace: str, topic: str) -> str:
    """`/topics/{namespace}/{topic}/schema` (docs/METADATA.md#topic-keys): the topic's schema subject and
    validation settings."""
    return _key(*_topic(namespace, topic), "schema")


def topic_producers_prefix(namespace: str, topic: str) -> str:
    return _prefix(*_topic(namespace, topic), "producers")


def topic_producer(namespace: str, topic: str, producer_id: int) -> str:
    """`/topics/{namespace}/{topic}/producers/{producer_id}`."""
    return _key(*_topic(namespace, topic), "producers", str(_uint(producer_id, "producer_id")))


def parse_topic_producer(key: str) -> tuple[str, str, int]:
    namespace, topic, producer_id = _match(key, _TOPIC_PRODUCER, "producer")
    return namespace, topic, _decimal(producer_id, "producer_id", key)


def topic_subscriptions_prefix(namespace: str, topic: str) -> str:
    """Subscriptions and their cursors (a cursor key sits under its subscription key)."""
    return _prefix(*_topic(namespace, topic), "subscriptions")


def topic_subscription(namespace: str, topic: str, subscription: str) -> str:
    """`/topics/{namespace}/{topic}/subscriptions/{subscription_name}`."""
    return _key(*_topic(namespace, topic), "subscriptions", _name(subscription, "subscription name"))


def parse_topic_subscription(key: str) -> tuple[str, str, str]:
    namespace, topic, subscription = _match(key, _TOPIC_SUBSCRIPTION, "subscription")
    return namespace, topic, subscription


def subscription_cursor(namespace: str, topic: str, subscription: str) -> str:
    """`/topics/{namespace}/{topic}/subscriptions/{subscription_name}/cursor`: the last acked offset."""
    return topic_subscription(namespace, topic, subscription) + "/cursor"


def parse_subscription_cursor(key: str) -> tuple[str, str, str]:
    namespace, topic, subscription = _match(key, _SUBSCRIPTION_CURSOR, "subscription cursor")
    return namespace, topic, subscription


def subscription_delayed(namespace: str, topic: str, subscription: str) -> str:
    """`.../subscriptions/{subscription_name}/delayed`: where its delayed records may be (this broker's)."""
    return topic_subscription(namespace, topic, subscription) + "/delayed"


def parse_subscription_delayed(key: str) -> tuple[str, str, str]:
    namespace, topic, subscription = _match(key, _SUBSCRIPTION_DELAYED, "subscription delayed records")
    return namespace, topic, subscription


# ---------------------------------------------------------------------------------------------- /schemas

_SCHEMA_METADATA: _Shape = ("schemas", _ANY, "metadata")
_SCHEMA_VERSION: _Shape = ("schemas", _ANY, "versions", _ANY)
_SCHEMA_BY_ID: _Shape = ("schemas", "_index", "by_id", _ANY)


def _subject(subject: str) -> str:
    name = _name(subject, "schema subject")
    if name in _SCHEMA_WORDS:
        raise InvalidKey(f"schema subject {name!r} is reserved (it is a word of the /schemas/ layout)")
    return name


def schemas_prefix() -> str:
    """What the schema registry watches."""
    return _prefix("schemas")


def schema_next_id() -> str:
    """`/schemas/_global/next_schema_id`: the next schema id to hand out."""
    return _key("schemas", "_global", "next_schema_id")


def schema_subject_prefix(subject: str) -> str:
    return _prefix("schemas", _subject(subject))


def schema_metadata(subject: str) -> str:
    """`/schemas/{subject}/metadata`."""
    return _key("schemas", _subject(subject), "metadata")


def parse_schema_metadata(key: str) -> str:
    (subject,) = _match(key, _SCHEMA_METADATA, "schema metadata")
    return _subject(subject)


def schema_versions_prefix(subject: str) -> str:
    return _prefix("schemas", _subject(subject), "versions")


def schema_version(subject: str, version: int) -> str:
    """`/schemas/{subject}/versions/{version}`."""
    return _key("schemas", _subject(subject), "versions", str(_uint(version, "schema version", U32_MAX)))


def parse_schema_version(key: str) -> tuple[str, int]:
    subject, version = _match(key, _SCHEMA_VERSION, "schema version")
    return _subject(subject), _decimal(version, "schema version", key, U32_MAX)


def schema_by_id(schema_id: int) -> str:
    """`/schemas/_index/by_id/{schema_id}`: {schema_id, subject}."""
    return _key("schemas", "_index", "by_id", str(_uint(schema_id, "schema_id")))


def parse_schema_by_id(key: str) -> int:
    (schema_id,) = _match(key, _SCHEMA_BY_ID, "schema id index")
    return _decimal(schema_id, "schema_id", key)


# ------------------------------------------------------------------------------- /danube-data/storage

_OBJECT: _Shape = ("danube-data", "storage", "topics", _ANY, _ANY, "objects", _ANY)
_SEALED: _Shape = ("danube-data", "storage", "topics", _ANY, _ANY, "state")
_REPLACED: _Shape = ("danube-data", "storage", "topics", _ANY, _ANY, "replaced", _ANY)
_SUCCESSORS: _Shape = ("danube-data", "storage", "topics", _ANY, _ANY, "successors", _ANY)
_RETENTION: _Shape = ("danube-data", "storage", "topics", _ANY, _ANY, "retention")
_CUR = "cur"


def _storage(namespace: str, topic: str) -> tuple[str, ...]:
    return "danube-data", "storage", "topics", _name(namespace, "namespace"), _name(topic, "topic")


_TABLE: _Shape = ("danube-data", "tables", "by-topic", _ANY, _ANY)


def tables_catalog() -> str:
    """`/danube-data/tables/catalog`: where the Iceberg catalog of topic tables is (docs/TABLES.md)."""
    return _key("danube-data", "tables", "catalog")


def table_pointer(namespace: str, table: str) -> str:
    """`/danube-data/tables/by-topic/{namespace}/{table}`: a topic table's current Iceberg metadata file, in
    the catalog on the metadata store (danube_fast/tables/meta_catalog.py)."""
    return _key("danube-data", "tables", "by-topic", _name(namespace, "namespace"), _name(table, "table"))


def table_pointers_prefix(namespace: str | None = None) -> str:
    base = ("danube-data", "tables", "by-topic")
    return _prefix(*base) if namespace is None else _prefix(*base, _name(namespace, "namespace"))


def parse_table_pointer(key: str) -> tuple[str, str]:
    namespace, table = _match(key, _TABLE, "table pointer")
    return namespace, table


def storage_prefix() -> str:
    return _prefix("danube-data", "storage", "topics")


def storage_topic_prefix(namespace: str, topic: str) -> str:
    return _prefix(*_storage(namespace, topic))


def objects_prefix(namespace: str, topic: str) -> str:
    """Object descriptors in offset order, then `objects/cur` (letters sort after digits)."""
    return _prefix(*_storage(namespace, topic), "objects")


def object_descriptor(namespace: str, topic: str, start_offset: int) -> str:
    """`/danube-data/storage/topics/{namespace}/{topic}/objects/{start_offset:020d}`."""
    return _key(*_storage(namespace, topic), "objects", pad_offset(start_offset))


def parse_object_descriptor(key: str) -> tuple[str, str, int]:
    namespace, topic, start = _match(key, _OBJECT, "object descriptor")
    if start == _CUR:
        raise InvalidKey(f"{key!r} is the current-object pointer, not an object descriptor")
    return namespace, topic, parse_padded_offset(start)


def objects_cur(namespace: str, topic: str) -> str:
    """`/danube-data/storage/topics/{namespace}/{topic}/objects/cur`: {start: padded offset}."""
    return _key(*_storage(namespace, topic), "objects", _CUR)


def parse_objects_cur(key: str) -> tuple[str, str]:
    namespace, topic, last = _match(key, _OBJECT, "current-object pointer")
    if last != _CUR:
        raise InvalidKey(f"{key!r} is not a current-object pointer key")
    return namespace, topic


def sealed_state(namespace: str, topic: str) -> str:
    """`/danube-data/storage/topics/{namespace}/{topic}/state`: written at unload, read by the next owner."""
    return _key(*_storage(namespace, topic), "state")


def parse_sealed_state(key: str) -> tuple[str, str]:
    namespace, topic = _match(key, _SEALED, "sealed state")
    return namespace, topic


def replaced_log(namespace: str, topic: str, broker_id: int) -> str:
    """`/danube-data/storage/topics/{namespace}/{topic}/replaced/{broker_id}`: {through}: a follower took the
    topic over from that dead broker (docs/REPLICATION.md); its log holds nothing the cluster still needs."""
    return _key(*_storage(namespace, topic), "replaced", str(_uint(broker_id, "broker_id")))


def parse_replaced_log(key: str) -> tuple[str, str, int]:
    namespace, topic, broker_id = _match(key, _REPLACED, "replaced log")
    return namespace, topic, _decimal(broker_id, "broker_id", key)


def term_successors(namespace: str, topic: str, broker_id: int) -> str:
    """`/danube-data/storage/topics/{namespace}/{topic}/successors/{broker_id}`: {epoch, brokers}: that dead
    broker's replicated term went to a broker without a copy; these followers hold every record it
    acknowledged (docs/REPLICATION.md)."""
    return _key(*_storage(namespace, topic), "successors", str(_uint(broker_id, "broker_id")))


def parse_term_successors(key: str) -> tuple[str, str, int]:
    namespace, topic, broker_id = _match(key, _SUCCESSORS, "term successors")
    return namespace, topic, _decimal(broker_id, "broker_id", key)


def retention_state(namespace: str, topic: str) -> str:
    """`/danube-data/storage/topics/{namespace}/{topic}/retention`: the offset below which retention deleted
    everything, and the objects it is deleting (storage/objects/expiry.py)."""
    return _key(*_storage(namespace, topic), "retention")


def parse_retention_state(key: str) -> tuple[str, str]:
    namespace, topic = _match(key, _RETENTION, "retention state")
    return namespace, topic


# ------------------------------------------------------------------------------ /subscriptions (legacy)

_LEGACY_CONSUMER: _Shape = ("subscriptions", _ANY, _ANY)


def legacy_subscriptions_prefix() -> str:
    return _prefix("subscriptions")


def legacy_subscription_prefix(subscription: str) -> str:
    return _prefix("subscriptions", _name(subscription, "subscription name"))


def legacy_consumer(subscription: str, consumer_id: int) -> str:
    """`/subscriptions/{subscription_name}/{consumer_id}` (legacy; current state is under /topics/)."""
    return _key("subscriptions", _name(subscription, "subscription name"),
                str(_uint(consumer_id, "consumer_id")))


def parse_legacy_consumer(key: str) -> tuple[str, int]:
    subscription, consumer_id = _match(key, _LEGACY_CONSUMER, "legacy consumer")
    return subscription, _decimal(consumer_id, "consumer_id", key)


# ------------------------------------------------------------------------------------------- /security
# Ours (docs/METADATA.md#security-keys): roles and the principals bound to them, per scope.

_ROLE: _Shape = ("security", "roles", _ANY)
_BINDING_CLUSTER: _Shape = ("security", "bindings", _ANY, _ANY, "cluster")
_BINDING_NAMESPACE: _Shape = ("security", "bindings", _ANY, _ANY, "namespace", _ANY)
_BINDING_TOPIC: _Shape = ("security", "bindings", _ANY, _ANY, "topic", _ANY, _ANY)


def security_prefix() -> str:
    return _prefix("security")


def security_roles_prefix() -> str:
    return _prefix("security", "roles")


def security_role(role: str) -> str:
    """`/security/roles/{role}`: the role's permissions."""
    return _key("security", "roles", _name(role, "role"))


def parse_security_role(key: str) -> str:
    (role,) = _match(key, _ROLE, "security role")
    return role


def security_bindings_prefix() -> str:
    return _prefix("security", "bindings")


def security_binding(principal: str, role: str, scope: str) -> str:
    """`/security/bindings/{principal}/{role}/cluster`, `.../namespace/{ns}` or `.../topic/{ns}/{topic}`, for
    the scope `cluster`, `/{ns}` or `/{ns}/{topic}`."""
    head = ("security", "bindings", _name(principal, "principal"), _name(role, "role"))
    if scope == "cluster":
        return _key(*head, "cluster")
    parts = scope[1:].split("/") if isinstance(scope, str) and scope.startswith("/") else []
    if len(parts) == 1:
        return _key(*head, "namespace", _name(parts[0], "namespace"))
    if len(parts) == 2:
        return _key(*head, "topic", _name(parts[0], "namespace"), _name(parts[1], "topic"))
    raise InvalidKey(f"scope {scope!r} must be 'cluster', '/namespace' or '/namespace/topic'")


def parse_security_binding(key: str) -> tuple[str, str, str]:
    """(principal, role, scope) of a binding key; scope as security_binding takes it."""
    for shape in (_BINDING_CLUSTER, _BINDING_NAMESPACE, _BINDING_TOPIC):
        try:
            parts = _match(key, shape, "security binding")
        except InvalidKey:
            continue
        principal, role, *names = parts
        return principal, role, ("/" + "/".join(names)) if names else "cluster"
    raise InvalidKey(f"{key!r} is not a security binding key")


# The deny list of tokens (docs/SECURITY.md#revoking-tokens): one key per revoked token id (`jti`) and one per
# principal whose tokens issued before a time are refused. A jti is an opaque string of the token's issuer:
# one that contains '/' or NUL, or is longer than MAX_JTI, cannot be a key and is revoked by its subject only.

MAX_JTI = 256
_REVOKED_TOKEN: _Shape = ("security", "revoked", "jti", _ANY)
_REVOKED_SUBJECT: _Shape = ("security", "revoked", "sub", _ANY)


def security_revoked_prefix() -> str:
    return _prefix("security", "revoked")


def security_revoked_tokens_prefix() -> str:
    return _prefix("security", "revoked", "jti")


def security_revoked_token(jti: str) -> str:
    """`/security/revoked/jti/{jti}`: the token with this `jti` is refused (a RevokedToken)."""
    if isinstance(jti, str) and len(jti) > MAX_JTI:
        raise InvalidKey(f"jti must be at most {MAX_JTI} characters, not {len(jti)}")
    return _key("security", "revoked", "jti", _name(jti, "jti"))


def parse_security_revoked_token(key: str) -> str:
    (jti,) = _match(key, _REVOKED_TOKEN, "revoked token")
    return jti


def security_revoked_subjects_prefix() -> str:
    return _prefix("security", "revoked", "sub")


def security_revoked_subject(principal: str) -> str:
    """`/security/revoked/sub/{principal}`: the principal's tokens issued before a time are refused (a
    RevokedSubject)."""
    return _key("security", "revoked", "sub", _name(principal, "principal"))


def parse_security_revoked_subject(key: str) -> str:
    (principal,) = _match(key, _REVOKED_SUBJECT, "revoked subject")
    return principal

"""The data source's options: parsed and checked on the driver, before any task runs.

Names and meanings follow Spark's Kafka source where it has them (startingOffsets, endingOffsets,
startingTimestamp, endingTimestamp, failOnDataLoss, minPartitions, maxOffsetsPerTrigger); option names are
case-insensitive, as Spark's are. An unknown option or a bad value raises `OptionError` naming the option and
what was expected. The result is a frozen, picklable `Options` that travels to the executors inside every
input partition.

Offsets JSON, per topic and partition (Kafka's shape): `{"/default/orders": {"0": 42, "1": -2}}`, where -2
means earliest and -1 latest; a topic without partitions uses partition "-1". Ending offsets are exclusive.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from danube_fast.access.brokers import ApiError, Credentials
from danube_fast.access.metadata import ETCD_PASSWORD_ENV, EtcdAccess, EtcdAccessError, parse_topic

EARLIEST = -2
LATEST = -1

Bound = Literal["earliest", "latest", "uploaded"] | dict[tuple[str, int], int]


class OptionError(ValueError):
    """An option is missing, unknown or has a value the data source cannot use."""


@dataclass(frozen=True)
class S3Options:
    endpoint: str | None = None
    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = None

    def kwargs(self) -> dict[str, str]:
        """Keyword arguments of danube_fast.storage.objects.open_object_store for an s3:// URL."""
        given = {"endpoint_url": self.endpoint, "region": self.region, "access_key": self.access_key,
                 "secret_key": self.secret_key}
        return {k: v for k, v in given.items() if v is not None}


@dataclass(frozen=True)
class Options:
    metadata_store: str
    object_store: str
    s3: S3Options = field(default_factory=S3Options)
    topics: tuple[str, ...] = ()  # the topic and topics options: base names, partitions expanded later
    topic_pattern: str | None = None
    starting: Bound = "earliest"
    ending: Bound = "latest"
    starting_timestamp: int | None = None  # ms since the epoch: rows published at or after it
    ending_timestamp: int | None = None  # ms: rows published before it
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    max_offsets_per_trigger: int | None = None
    value_format: Literal["binary", "avro", "json"] = "binary"
    value_schema: str | None = None  # avro/json: the subject as DataSource.schema() resolved it (values.py)
    broker_timeout: float = 10.0  # seconds for the broker calls of the planning (offsets, tail)
    credentials: Credentials | None = None  # TLS and token for the broker calls (docs/SECURITY.md)
    etcd: EtcdAccess = field(default_factory=EtcdAccess)  # TLS and user for an etcd metadataStore
    filter_pushdown: Literal["auto", "true", "false"] = "auto"  # see source.py: pushdown_safe


SECURITY_OPTIONS = ("tlsCaFile", "tlsCertFile", "tlsKeyFile", "token")  # read and write (credentials())
# read only (etcd_access()): EtcdAccess's fields by the names of these options
ETCD_OPTIONS = {"ca_file": "etcdCaFile", "cert_file": "etcdCertFile", "key_file": "etcdKeyFile",
                "user": "etcdUser", "password_file": "etcdPasswordFile", "password_env": "etcdPasswordEnv"}
# canonical name -> parser; the keys of a user's options are matched case-insensitively.
_NAMES = ("metadataStore", "objectStore", "s3Endpoint", "s3Region", "s3AccessKeyId", "s3SecretAccessKey",
          "topic", "topics", "topicPattern", "startingOffsets", "endingOffsets", "startingTimestamp",
          "endingTimestamp", "failOnDataLoss", "minPartitions", "maxRecordsPerPartition",
          "maxOffsetsPerTrigger", "valueFormat", "brokerTimeoutMs", "filterPushdown", *SECURITY_OPTIONS,
          *ETCD_OPTIONS.values())
_CANONICAL = {n.lower(): n for n in _NAMES}
# Not the user's: DataSource.schema() stores the value schema it resolved (values.Resolved) under this name,
# and the readers Spark makes from that DataSource instance parse it with the rest.
RESOLVED_VALUE_SCHEMA = "_danube_resolved_value_schema"


def parse(raw: Mapping[str, str], *, streaming: bool = False) -> Options:
    """Options from what the user passed to `.option(...)`; OptionError naming the first problem."""
    given: dict[str, str] = {}
    resolved = None
    for key, value in raw.items():
        if key.lower() == RESOLVED_VALUE_SCHEMA:
            resolved = value
            continue
        name = _CANONICAL.get(key.lower())
        if name is None:
            if key.lower() == "path":  # load("...") passes the path: the topic, in this source
                name = "topic"
            else:
                raise OptionError(f"unknown option {key!r} for format('danube'); known: {', '.join(_NAMES)}")
        given[name] = value
    meta = _required(given, "metadataStore", "etcd://host:port or embedded:/path/to/meta.db")
    objects = _required(given, "objectStore", "s3://bucket/prefix or a folder path")
    subjects = [n for n in ("topic", "topics", "topicPattern") if n in given]
    if len(subjects) != 1:
        raise OptionError("give exactly one of the options topic, topics or topicPattern (got "
                          f"{', '.join(subjects) or 'none'})")
    topics: tuple[str, ...] = ()
    pattern = None
    if "topic" in given:
        topics = (topic_name(given["topic"], "topic"),)
    elif "topics" in given:
        topics = tuple(topic_name(t.strip(), "topics") for t in given["topics"].split(",") if t.strip())
        if not topics:
            raise OptionError("option topics is empty: write topics=/ns/a,/ns/b")
    else:
        pattern = given["topicPattern"]
        if not pattern.startswith("/") or pattern.count("/") != 2:
            raise OptionError(f"option topicPattern {pattern!r} is not a /namespace/topic glob, such as "
                              "/default/*")
    ending = _bound(given.get("endingOffsets", "latest"), "endingOffsets", ("latest", "uploaded"))
    if streaming and "endingOffsets" in given:
        raise OptionError("option endingOffsets is for batch queries; a stream reads on "
                          "(maxOffsetsPerTrigger bounds a micro-batch)")
    value_format = given.get("valueFormat", "binary").lower()
    if value_format not in ("binary", "avro", "json"):
        raise OptionError(f"option valueFormat is {given['valueFormat']!r}: expected binary, avro or json")
    return Options(
        metadata_store=meta, object_store=objects,
        s3=S3Options(given.get("s3Endpoint"), given.get("s3Region"), given.get("s3AccessKeyId"),
                     given.get("s3SecretAccessKey")),
        topics=topics, topic_pattern=pattern,
        starting=_bound(given.get("startingOffsets", "earliest"), "startingOffsets", ("earliest", "latest")),
        ending=ending,
        starting_timestamp=_int(given, "startingTimestamp", 0),
        ending_timestamp=_int(given, "endingTimestamp", 0),
        fail_on_data_loss=_bool(given, "failOnDataLoss", True),
        min_partitions=_int(given, "minPartitions", 1),
        max_records_per_partition=_int(given, "maxRecordsPerPartition", 1),
        max_offsets_per_trigger=_int(given, "maxOffsetsPerTrigger", 1),
        value_format=value_format,  # type: ignore[arg-type]
        value_schema=None if value_format == "binary" else resolved,
        broker_timeout=(_int(given, "brokerTimeoutMs", 1) or 10_000) / 1000,
        credentials=credentials(given),
        etcd=etcd_access(given, meta),
        filter_pushdown=_word(given, "filterPushdown", ("auto", "true", "false")),  # type: ignore[arg-type]
    )


def credentials(given: Mapping[str, str]) -> Credentials | None:
    """TLS and a token for a secured broker (docs/SECURITY.md), from the options of SECURITY_OPTIONS (read and
    write): the files must be readable where the tasks run. None: plaintext."""
    ca, cert, key, token = (given.get(n, "").strip() or None for n in SECURITY_OPTIONS)
    if bool(cert) != bool(key):
        raise OptionError("options tlsCertFile and tlsKeyFile go together (a client certificate and its key)")
    for name, path in (("tlsCaFile", ca), ("tlsCertFile", cert), ("tlsKeyFile", key)):
        if path is not None and not os.path.isfile(path):
            raise OptionError(f"option {name}: no file {path!r}")
    if not (ca or cert or token):
        return None
    return Credentials(ca_file=ca, cert_file=cert, key_file=key, token=token)


def etcd_access(given: Mapping[str, str], metadata_store: str) -> EtcdAccess:
    """TLS and a user for an etcd metadataStore (docs/SECURITY.md), from the options of ETCD_OPTIONS: the
    files must be readable, and the environment variable etcdPasswordEnv names (DANUBE_ETCD_PASSWORD by
    default) set, where the store is opened: on the driver and on every executor. The password is read
    there, so it does not travel in the plan."""
    chosen = {f: given.get(option, "").strip() for f, option in ETCD_OPTIONS.items()}
    access = EtcdAccess(ca_file=chosen["ca_file"], cert_file=chosen["cert_file"], key_file=chosen["key_file"],
                        user=chosen["user"], password_file=chosen["password_file"],
                        password_env=chosen["password_env"] or ETCD_PASSWORD_ENV)
    if access.given and not metadata_store.startswith("etcd://"):
        raise OptionError(f"the etcd options ({', '.join(o for f, o in ETCD_OPTIONS.items() if chosen[f])}) "
                          f"are for an etcd:// metadataStore, not {metadata_store!r}")
    for name in ("ca_file", "cert_file", "key_file", "password_file"):
        path = chosen[name]
        if path and not os.path.isfile(path):
            raise OptionError(f"option {ETCD_OPTIONS[name]}: no file {path!r}")
    try:
        access.check(ETCD_OPTIONS)
        access.resolve_password(names=ETCD_OPTIONS)  # here too: the driver plans with the same store
    except EtcdAccessError as e:
        raise OptionError(str(e)) from None
    return access


def _required(given: Mapping[str, str], name: str, expected: str) -> str:
    value = given.get(name, "").strip()
    if not value:
        raise OptionError(f"option {name} is required: {expected}")
    return value


def topic_name(text: str, option: str) -> str:
    """`text` if it is a valid topic name by the broker's own rules (names.py), else OptionError."""
    try:
        return parse_topic(text).full
    except ApiError as e:
        raise OptionError(f"option {option}: {text[:100]!r} is not a topic name /namespace/topic: "
                          f"{e}") from None


def _int(given: Mapping[str, str], name: str, minimum: int) -> int | None:
    if name not in given:
        return None
    try:
        value = int(given[name])
    except ValueError:
        raise OptionError(f"option {name} is {given[name]!r}: expected an integer") from None
    if value < minimum:
        raise OptionError(f"option {name} is {value}: expected at least {minimum}")
    return value


def _word(given: Mapping[str, str], name: str, words: tuple[str, ...]) -> str:
    word = given.get(name, words[0]).strip().lower()
    if word not in words:
        raise OptionError(f"option {name} is {given[name]!r}: expected {', '.join(words)}")
    return word


def _bool(given: Mapping[str, str], name: str, default: bool) -> bool:
    text = given.get(name)
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        raise OptionError(f"option {name} is {text!r}: expected true or false")
    return text.lower() == "true"


def _bound(text: str, name: str, words: tuple[str, ...]) -> Bound:
    word = text.strip().lower()
    if word in words:
        return word  # type: ignore[return-value]
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"option {name} is {text!r}: expected {' or '.join(words)}, or JSON per topic "
                          'and partition such as {"/default/orders": {"0": 42, "1": -2}} (-2 earliest, '
                          "-1 latest)")
    offsets: dict[tuple[str, int], int] = {}
    for topic, partitions in parsed.items():
        topic_name(topic, name)
        if not isinstance(partitions, dict) or not partitions:
            raise OptionError(f"option {name}: topic {topic!r} maps to {partitions!r}, expected "
                              '{"partition": offset}')
        for partition, offset in partitions.items():
            try:
                index = int(partition)
            except ValueError:
                raise OptionError(f"option {name}: partition {partition!r} of {topic} is not a number "
                                  "(-1 for a topic without partitions)") from None
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST or \
                    (offset == EARLIEST and name == "endingOffsets"):
                words_allowed = "-1 (latest)" if name == "endingOffsets" else "-2/-1"
                raise OptionError(f"option {name}: offset {offset!r} of {topic} partition {partition} is not "
                                  f"an offset (>= 0) or {words_allowed}")
            offsets[(topic, index)] = offset
    return offsets

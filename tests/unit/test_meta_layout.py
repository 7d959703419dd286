"""The metadata layout: keys and values are exactly those of Danube's etcd layout
(docs/METADATA.md#key-layout).

Every example of upstream's layout document is copied below as data, with the section it comes from: its key
must be what the key function builds (and parse back to the parts), its value must parse into its resource and
serialize back to the same JSON. Upstream's resource mapping supplies the three keys its layout does not
place.
"""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import danube_fast.meta
from danube_fast.meta import keys, resources
from danube_fast.meta.resources import (
    NULL,
    BadValue,
    BrokerRegistration,
    BrokerState,
    ClusterLeader,
    CompatibilityMode,
    CurrentObject,
    DeliveryMode,
    LoadBalanceDecision,
    LoadReport,
    Marker,
    NextSchemaId,
    ObjectDescriptor,
    Policy,
    Producer,
    ProducerAccessMode,
    ReplacedLog,
    Resource,
    ResourceKind,
    RevokedSubject,
    RevokedToken,
    SchemaDefinition,
    SchemaIndexEntry,
    SchemaKind,
    SchemaMetadata,
    SchemaVersion,
    SealedState,
    SubscriptionCursor,
    SubscriptionRecord,
    SubscriptionType,
    SystemLoad,
    TermSuccessors,
    TopicDelivery,
    TopicReplicas,
    TopicRoot,
    TopicSchemaConfig,
    Unassigned,
    ValidationPolicy,
)
from danube_fast.meta.store import InvalidKey, MetadataError

REPO = Path(__file__).resolve().parents[2]
U64_MAX = 2**64 - 1

# ------------------------------------------------------------------ upstream's layout, as printed

# 4.2 elides the Avro bodies as `{...}` (not JSON); they are filled in with the body printed in 4.3.
AVRO_BODY = """{
      "fingerprint": "sha256:270e3390...",
      "raw_schema": "{\\n  \\"type\\": \\"record\\",\\n  \\"name\\": \\"Product\\",\\n  ..."
    }"""

SCHEMA_METADATA_TEXT = """{
  "compatibility_mode": "Backward",
  "created_at": 1768728611,
  "created_by": "danube-client",
  "id": 1,
  "latest_version": 2,
  "subject": "product-catalog",
  "topics_using": [],
  "updated_at": 1768728613,
  "versions": [
    {
      "created_at": 1768728611,
      "created_by": "danube-client",
      "version": 1,
      "fingerprint": "sha256:270e3390...",
      "schema_def": {"Avro": {...}},
      "is_deprecated": false,
      "tags": []
    },
    {
      "created_at": 1768728613,
      "version": 2,
      "fingerprint": "sha256:d6c3da89...",
      "schema_def": {"Avro": {...}}
    }
  ]
}""".replace("{...}", AVRO_BODY)


@dataclass(frozen=True)
class Example:
    section: str
    key: str
    value: str
    resource: type[Resource]
    build: Callable[[], str]
    parse: Callable[[str], Any]
    parts: Any


SEED_000 = [
    # 1.1 Cluster Name
    Example("1.1", "/cluster/MY_CLUSTER", "null", Marker,
            lambda: keys.cluster_name("MY_CLUSTER"), keys.parse_cluster_name, "MY_CLUSTER"),
    # 1.2 Broker Registration
    Example("1.2", "/cluster/register/625722408599041316", """{
  "admin_addr": "http://0.0.0.0:50051",
  "advertised_addr": "0.0.0.0:6650",
  "broker_addr": "http://0.0.0.0:6650",
  "prom_exporter": "0.0.0.0:9040"
}""", BrokerRegistration,
            lambda: keys.broker_register(625722408599041316), keys.parse_broker_register, 625722408599041316),
    # 1.3 Broker State
    Example("1.3", "/cluster/brokers/625722408599041316/state", """{
  "mode": "active",
  "reason": "boot"
}""", BrokerState, lambda: keys.broker_state(625722408599041316), keys.parse_broker_state,
            625722408599041316),
    # 1.4 Topic Assignments
    Example("1.4", "/cluster/brokers/13308604176970018988/default/reliable_topic", "null", Marker,
            lambda: keys.broker_topic(13308604176970018988, "default", "reliable_topic"),
            keys.parse_broker_topic, (13308604176970018988, "default", "reliable_topic")),
    # 1.5 Unassigned Topics, new topic
    Example("1.5", "/cluster/unassigned/default/reliable_topic", "null", Unassigned,
            lambda: keys.unassigned("default", "reliable_topic"), keys.parse_unassigned,
            ("default", "reliable_topic")),
    # 1.5 Unassigned Topics, topic unload
    Example("1.5", "/cluster/unassigned/default/reliable_topic", """{
  "reason": "unload",
  "from_broker": 12549595323552083708
}""", Unassigned, lambda: keys.unassigned("default", "reliable_topic"), keys.parse_unassigned,
            ("default", "reliable_topic")),
    # 1.6 Load Reports
    Example("1.6", "/cluster/load/13308604176970018988", """{
  "resources_usage": [
    {"resource": "CPU", "usage": 30},
    {"resource": "Memory", "usage": 30}
  ],
  "topic_list": ["/default/reliable_topic"],
  "topics_len": 1
}""", LoadReport, lambda: keys.load_report(13308604176970018988), keys.parse_load_report,
            13308604176970018988),
    # 1.7 Leader Election
    Example("1.7", "/cluster/leader", "625722408599041316", ClusterLeader, keys.leader, lambda k: None, None),
    # 2.1 Namespace Policy
    Example("2.1", "/namespaces/default/policy", """{
  "max_consumers_per_subscription": 0,
  "max_consumers_per_topic": 0,
  "max_message_size": 10485760,
  "max_producers_per_topic": 0,
  "max_publish_rate": 0,
  "max_subscription_dispatch_rate": 0,
  "max_subscriptions_per_topic": 0
}""", Policy, lambda: keys.namespace_policy("default"), keys.parse_namespace_policy, "default"),
    # 2.2 Topic Registry
    Example("2.2", "/namespaces/default/topics/default/reliable_topic", "null", Marker,
            lambda: keys.namespace_topic("default", "reliable_topic"), keys.parse_namespace_topic,
            ("default", "reliable_topic")),
    # 3.1 Topic Root
    Example("3.1", "/topics/default/reliable_topic", "0", TopicRoot,
            lambda: keys.topic_root("default", "reliable_topic"), keys.parse_topic_root,
            ("default", "reliable_topic")),
    # 3.2 Delivery Mode
    Example("3.2", "/topics/default/reliable_topic/delivery", '"Reliable"', TopicDelivery,
            lambda: keys.topic_delivery("default", "reliable_topic"), lambda k: None, None),
    # 3.3 Producer Registration
    Example("3.3", "/topics/default/reliable_topic/producers/13940288943180594845", """{
  "access_mode": 0,
  "producer_id": 13940288943180594845,
  "producer_name": "prod_json_reliable",
  "status": true,
  "topic_name": "/default/reliable_topic"
}""", Producer, lambda: keys.topic_producer("default", "reliable_topic", 13940288943180594845),
            keys.parse_topic_producer, ("default", "reliable_topic", 13940288943180594845)),
    # 3.4 Subscription Metadata
    Example("3.4", "/topics/default/reliable_topic/subscriptions/subs_reliable", """{
  "consumer_id": null,
  "consumer_name": "cons_reliable",
  "subscription_name": "subs_reliable",
  "subscription_type": 0
}""", SubscriptionRecord, lambda: keys.topic_subscription("default", "reliable_topic", "subs_reliable"),
            keys.parse_topic_subscription, ("default", "reliable_topic", "subs_reliable")),
    # 3.5 Subscription Cursor
    Example("3.5", "/topics/default/reliable_topic/subscriptions/subs_reliable/cursor", "13",
            SubscriptionCursor,
            lambda: keys.subscription_cursor("default", "reliable_topic", "subs_reliable"),
            keys.parse_subscription_cursor, ("default", "reliable_topic", "subs_reliable")),
    # 4.1 Global Schema ID Counter
    Example("4.1", "/schemas/_global/next_schema_id", "2", NextSchemaId, keys.schema_next_id,
            lambda k: None, None),
    # 4.2 Schema Metadata
    Example("4.2", "/schemas/product-catalog/metadata", SCHEMA_METADATA_TEXT, SchemaMetadata,
            lambda: keys.schema_metadata("product-catalog"), keys.parse_schema_metadata, "product-catalog"),
    # 4.3 Schema Version
    Example("4.3", "/schemas/product-catalog/versions/1", """{
  "created_at": 1768728611,
  "created_by": "danube-client",
  "version": 1,
  "fingerprint": "sha256:270e3390980bc143...",
  "is_deprecated": false,
  "schema_def": {
    "Avro": {
      "fingerprint": "sha256:270e3390...",
      "raw_schema": "{\\n  \\"type\\": \\"record\\",\\n  \\"name\\": \\"Product\\",\\n  ..."
    }
  },
  "tags": []
}""", SchemaVersion, lambda: keys.schema_version("product-catalog", 1), keys.parse_schema_version,
            ("product-catalog", 1)),
    # 4.4 Schema ID Index
    Example("4.4", "/schemas/_index/by_id/1", """{
  "schema_id": 1,
  "subject": "product-catalog"
}""", SchemaIndexEntry, lambda: keys.schema_by_id(1), keys.parse_schema_by_id, 1),
    # 5.1 Object Descriptors
    Example("5.1", "/danube-data/storage/topics/default/reliable_topic/objects/00000000000000000000", """{
  "completed": true,
  "created_at": 1768728599,
  "end_offset": 29,
  "etag": null,
  "object_id": "data-0-29.dnb1",
  "offset_index": [[0, 0]],
  "size": 7164,
  "start_offset": 0
}""", ObjectDescriptor, lambda: keys.object_descriptor("default", "reliable_topic", 0),
            keys.parse_object_descriptor, ("default", "reliable_topic", 0)),
    # 5.2 Current Object Cursor
    Example("5.2", "/danube-data/storage/topics/default/reliable_topic/objects/cur", """{
  "start": "00000000000000000030"
}""", CurrentObject, lambda: keys.objects_cur("default", "reliable_topic"), keys.parse_objects_cur,
            ("default", "reliable_topic")),
    # 5.3 Sealed State (Topic Move)
    Example("5.3", "/danube-data/storage/topics/default/reliable_topic/state", """{
  "sealed": true,
  "last_committed_offset": 21,
  "broker_id": 10285063371164059634,
  "timestamp": 1768625254
}""", SealedState, lambda: keys.sealed_state("default", "reliable_topic"), keys.parse_sealed_state,
            ("default", "reliable_topic")),
]


def example_id(example: Example) -> str:
    return f"{example.section}:{example.resource.__name__}"


@pytest.mark.parametrize("example", SEED_000, ids=example_id)
def test_seed_000_key_is_built_and_parsed(example: Example) -> None:
    assert example.build() == example.key
    assert example.parse(example.key) == example.parts


@pytest.mark.parametrize("example", SEED_000, ids=example_id)
def test_seed_000_value_round_trips(example: Example) -> None:
    value = example.resource.from_json(example.value.encode(), key=example.key)
    written = value.to_json()
    assert json.loads(written) == json.loads(example.value)
    compact = json.dumps(json.loads(written), separators=(",", ":"), ensure_ascii=False).encode()
    assert written == compact  # as serde_json writes it
    assert example.resource.from_json(written) == value


def test_seed_000_values_are_typed() -> None:
    by_section = {(e.section, e.value[:12]): e for e in SEED_000}
    unload = Unassigned.from_json(by_section["1.5", '{\n  "reason"'].value.encode())
    assert unload == Unassigned.unload(12549595323552083708) and not unload.is_new_topic
    assert Unassigned.from_json(NULL).is_new_topic and Unassigned().to_json() == NULL
    report = LoadReport.from_json(by_section["1.6", '{\n  "resourc'].value.encode())
    assert report.resources_usage == (SystemLoad(ResourceKind.CPU, 30), SystemLoad(ResourceKind.MEMORY, 30))
    assert report.topic_list == ("/default/reliable_topic",) and report.topics_len == 1
    assert ClusterLeader.from_json(b"625722408599041316").broker_id == 625722408599041316
    assert Policy.from_json(by_section["2.1", '{\n  "max_con'].value.encode()) == Policy()  # Danube defaults
    assert TopicDelivery.from_json(b'"NonReliable"').mode is DeliveryMode.NON_RELIABLE
    producer = Producer.from_json(by_section["3.3", '{\n  "access_'].value.encode())
    assert producer.access_mode is ProducerAccessMode.SHARED and producer.status is True
    subscription = SubscriptionRecord.from_json(by_section["3.4", '{\n  "consume'].value.encode())
    assert subscription.consumer_id is None and subscription.subscription_type is SubscriptionType.EXCLUSIVE
    metadata = SchemaMetadata.from_json(SCHEMA_METADATA_TEXT.encode())
    assert metadata.compatibility_mode is CompatibilityMode.BACKWARD and len(metadata.versions) == 2
    second = metadata.versions[1]
    assert (second.created_by, second.tags, second.is_deprecated) == (None, None, None)  # absent stays absent
    assert second.schema_def.kind is SchemaKind.AVRO and second.schema_def.raw_schema is not None
    descriptor = ObjectDescriptor.from_json(by_section["5.1", '{\n  "complet'].value.encode())
    assert descriptor.offset_index == ((0, 0),) and descriptor.etag is None
    assert CurrentObject.from_json(b'{"start": "00000000000000000030"}').start == 30
    sealed = SealedState.from_json(by_section["5.3", '{\n  "sealed"'].value.encode())
    assert sealed.last_committed_offset == 21 and sealed.broker_id == 10285063371164059634


# ------------------------------------------------- upstream's prefixes, and its resource mapping

def test_seed_000_watch_and_debug_prefixes() -> None:
    # Common Patterns: Watching for Changes; Debugging Tips
    assert keys.broker_topics_prefix(625722408599041316) == "/cluster/brokers/625722408599041316/"
    assert keys.unassigned_prefix() == "/cluster/unassigned/"
    assert keys.schemas_prefix() == "/schemas/"
    assert keys.brokers_prefix() == "/cluster/brokers/"
    assert keys.objects_prefix("default", "my_topic") == \
        "/danube-data/storage/topics/default/my_topic/objects/"
    assert keys.schema_versions_prefix("product-catalog") == "/schemas/product-catalog/versions/"
    assert keys.topic_root("default", "my_topic") == "/topics/default/my_topic"


def test_seed_001_keys() -> None:
    # The keys the layout does not place, and the resource mapping's examples of the shared shapes.
    assert keys.topic_policy("markets", "trade-events-part-1") == "/topics/markets/trade-events-part-1/policy"
    assert keys.topic_schema("default", "reliable_topic") == "/topics/default/reliable_topic/schema"
    assert keys.load_balance() == "/cluster/load_balance"
    assert keys.broker_topic(1122334455, "markets", "trade-events") == \
        "/cluster/brokers/1122334455/markets/trade-events"
    assert keys.namespace_topic("markets", "trade-events") == \
        "/namespaces/markets/topics/markets/trade-events"
    assert keys.topic_producer("markets", "trade-events", 1122334455) == \
        "/topics/markets/trade-events/producers/1122334455"
    assert keys.topic_subscription("markets", "trade-events", "my_subscription") == \
        "/topics/markets/trade-events/subscriptions/my_subscription"
    assert keys.legacy_consumer("my_subscription", 23232323) == "/subscriptions/my_subscription/23232323"
    assert keys.parse_legacy_consumer("/subscriptions/my_subscription/23232323") == \
        ("my_subscription", 23232323)


def test_seed_001_values_round_trip() -> None:
    decision = LoadBalanceDecision({625722408599041316: ("/default/a", "/default/b"), 7: ()})
    assert json.loads(decision.to_json()) == {"625722408599041316": ["/default/a", "/default/b"], "7": []}
    assert LoadBalanceDecision.from_json(decision.to_json()) == decision
    config = TopicSchemaConfig("product-catalog", ValidationPolicy.ENFORCE, True)
    assert json.loads(config.to_json()) == {
        "schema_subject": "product-catalog", "validation_policy": "enforce",
        "enable_payload_validation": True}
    assert TopicSchemaConfig.from_json(config.to_json()) == config
    no_subject = TopicSchemaConfig(None)
    assert TopicSchemaConfig.from_json(no_subject.to_json()).validation_policy is ValidationPolicy.WARN
    assert Policy.from_json(Policy(max_producers_per_topic=3).to_json()).max_producers_per_topic == 3


# --------------------------------------------------------- ours: the deny list of tokens (security keys)

JTI = "6f1c2a9e-3b7d-4c51-9a0e-2f8d7c6b5a41"
OURS = [
    Example("security", f"/security/revoked/jti/{JTI}", '{"exp": 1768728611, "revoked_at": 1768725011, '
            '"sub": "bob"}', RevokedToken, lambda: keys.security_revoked_token(JTI),
            keys.parse_security_revoked_token, JTI),
    Example("security", "/security/revoked/jti/issuer-7", '{"exp": null, "revoked_at": 1768725011}',
            RevokedToken, lambda: keys.security_revoked_token("issuer-7"), keys.parse_security_revoked_token,
            "issuer-7"),
    Example("security", "/security/revoked/sub/bob", '{"before": 1768725012, "revoked_at": 1768725011}',
            RevokedSubject, lambda: keys.security_revoked_subject("bob"), keys.parse_security_revoked_subject,
            "bob"),
]


@pytest.mark.parametrize("example", OURS, ids=example_id)
def test_our_security_keys_are_built_and_parsed_and_their_values_round_trip(example: Example) -> None:
    test_seed_000_key_is_built_and_parsed(example)
    test_seed_000_value_round_trips(example)


def test_deny_list_keys_and_values() -> None:
    assert RevokedToken.from_json(OURS[1].value.encode()) == RevokedToken(None, 1768725011)
    assert RevokedToken(None, 1).to_json() == b'{"exp":null,"revoked_at":1}'  # exp unknown: written as null
    assert RevokedToken(5, 1, "bob").sub == RevokedToken.from_json(OURS[0].value.encode()).sub == "bob"
    assert RevokedSubject.from_json(OURS[2].value.encode()).before == 1768725012
    with pytest.raises(BadValue, match="'exp' is missing"):
        RevokedToken.from_json(b'{"revoked_at": 1}')
    with pytest.raises(BadValue, match="'before' must be an unsigned 64-bit integer"):
        RevokedSubject.from_json(b'{"before": "now", "revoked_at": 1}')
    for key in (keys.security_revoked_token("t"), keys.security_revoked_subject("bob")):
        assert key.startswith(keys.security_revoked_prefix()) and key.startswith(keys.security_prefix())
    assert keys.security_revoked_token("t").startswith(keys.security_revoked_tokens_prefix())
    assert keys.security_revoked_subject("t").startswith(keys.security_revoked_subjects_prefix())
    assert not keys.security_role("revoked").startswith(keys.security_revoked_prefix())
    assert keys.parse_security_revoked_token(keys.security_revoked_token("x" * keys.MAX_JTI)) == "x" * 256
    with pytest.raises(InvalidKey, match="at most 256"):
        keys.security_revoked_token("x" * (keys.MAX_JTI + 1))


def test_every_resource_is_registered() -> None:
    """A resource class in a resources_* module is exported by meta/resources.py and named in its table."""
    found = []
    for info in pkgutil.iter_modules(danube_fast.meta.__path__):
        if info.name.startswith("resources_") and info.name != "resources_base":
            module = importlib.import_module(f"danube_fast.meta.{info.name}")
            found += [name for name, value in vars(module).items()
                      if isinstance(value, type) and issubclass(value, Resource)
                      and value.__module__ == module.__name__]
    assert "RevokedToken" in found and "RevokedSubject" in found
    assert [n for n in found if n not in resources.__all__] == []
    table = resources.__doc__ or ""
    assert [n for n in found if not re.search(rf"\| [^|]*\b{n}\b", table)] == []


# ------------------------------------------------------------------------------------------- offsets

def test_offsets_are_padded_to_20_digits() -> None:
    # 5.1 Offset Padding: 0 -> 00000000000000000000, 30 -> 00000000000000000030
    assert keys.pad_offset(0) == "00000000000000000000"
    assert keys.pad_offset(30) == "00000000000000000030"
    assert keys.pad_offset(U64_MAX) == "18446744073709551615"
    assert keys.object_descriptor("default", "reliable_topic", 22).endswith("/objects/00000000000000000022")
    assert keys.parse_object_descriptor(keys.object_descriptor("ns", "t", U64_MAX)) == ("ns", "t", U64_MAX)
    assert CurrentObject(30).to_json() == b'{"start":"00000000000000000030"}'


def test_descriptor_keys_sort_in_offset_order_and_cur_last() -> None:
    offsets = [0, 9, 10, 22, 99, 100, 10**12, U64_MAX]
    built = [keys.object_descriptor("ns", "t", o) for o in offsets] + [keys.objects_cur("ns", "t")]
    assert sorted(built) == built
    assert all(k.startswith(keys.objects_prefix("ns", "t")) for k in built)


@pytest.mark.parametrize("offset", [-1, U64_MAX + 1, True, 1.0, "0"])
def test_bad_offsets_raise(offset: Any) -> None:
    with pytest.raises(InvalidKey, match="offset"):
        keys.object_descriptor("ns", "t", offset)


@pytest.mark.parametrize("text", [
    "30", "0000000000000000003", "000000000000000000030", "0000000000000000003x", "99999999999999999999",
    "cur", "+0000000000000000030"])
def test_bad_padded_offsets_raise(text: str) -> None:
    with pytest.raises(InvalidKey):
        keys.parse_object_descriptor(f"/danube-data/storage/topics/ns/t/objects/{text}")


# ----------------------------------------------------------------------------------------- bad keys

NAME_TAKERS: list[Callable[[str], str]] = [
    lambda n: keys.cluster_name(n),
    lambda n: keys.broker_topic(1, n, "t"),
    lambda n: keys.broker_topic(1, "ns", n),
    lambda n: keys.unassigned(n, "t"),
    lambda n: keys.namespace_policy(n),
    lambda n: keys.namespace_topic("ns", n),
    lambda n: keys.topic_root(n, "t"),
    lambda n: keys.topic_delivery("ns", n),
    lambda n: keys.topic_subscription("ns", "t", n),
    lambda n: keys.subscription_cursor("ns", "t", n),
    lambda n: keys.schema_metadata(n),
    lambda n: keys.schema_version(n, 1),
    lambda n: keys.sealed_state(n, "t"),
    lambda n: keys.object_descriptor("ns", n, 0),
    lambda n: keys.legacy_consumer(n, 1),
    lambda n: keys.topic_name(n, "t"),
    lambda n: keys.security_revoked_token(n),
    lambda n: keys.security_revoked_subject(n),
]


@pytest.mark.parametrize("bad", ["", "a/b", "/", "a\x00b", 5, None])
@pytest.mark.parametrize("build", NAME_TAKERS)
def test_bad_names_raise(build: Callable[[Any], str], bad: Any) -> None:
    with pytest.raises(InvalidKey, match="must"):
        build(bad)


@pytest.mark.parametrize("bad", [-1, U64_MAX + 1, True, "1", 1.5])
@pytest.mark.parametrize("build", [keys.broker_register, keys.broker_state, keys.broker_topics_prefix,
                                   keys.load_report, keys.schema_by_id,
                                   lambda i: keys.topic_producer("ns", "t", i),
                                   lambda i: keys.legacy_consumer("s", i)])
def test_bad_ids_raise(build: Callable[[Any], str], bad: Any) -> None:
    with pytest.raises(InvalidKey):
        build(bad)


def test_reserved_words_raise() -> None:
    for word in ["register", "brokers", "unassigned", "load", "load_balance", "leader"]:
        with pytest.raises(InvalidKey, match="reserved"):
            keys.cluster_name(word)
    for word in ["_global", "_index"]:
        with pytest.raises(InvalidKey, match="reserved"):
            keys.schema_metadata(word)
    with pytest.raises(InvalidKey):
        keys.schema_version("product-catalog", 2**32)


@pytest.mark.parametrize(("parse", "key"), [
    (keys.parse_broker_topic, "/cluster/brokers/1/state"),  # the state key sits under the same prefix
    (keys.parse_broker_state, "/cluster/brokers/1/ns/t"),
    (keys.parse_broker_register, "/cluster/register/007"),  # not canonical: would not build back
    (keys.parse_broker_register, "/cluster/register/+7"),
    (keys.parse_broker_register, "/cluster/register/1_000"),
    (keys.parse_broker_register, "/cluster/register/\u0663"),  # an Arabic-Indic three
    (keys.parse_broker_register, "/cluster/register/18446744073709551616"),
    (keys.parse_broker_register, "/cluster/register/"),
    (keys.parse_broker_register, "cluster/register/1"),
    (keys.parse_load_report, "/cluster/load_balance"),
    (keys.parse_cluster_name, "/cluster/leader"),
    (keys.parse_unassigned, "/cluster/unassigned/ns"),
    (keys.parse_unassigned, "/cluster/unassigned/ns/t/extra"),
    (keys.parse_unassigned, "/cluster/unassigned//t"),
    (keys.parse_namespace_topic, "/namespaces/a/topics/b/t"),
    (keys.parse_topic_subscription, "/topics/ns/t/subscriptions/s/cursor"),
    (keys.parse_object_descriptor, "/danube-data/storage/topics/ns/t/objects/cur"),
    (keys.parse_objects_cur, "/danube-data/storage/topics/ns/t/objects/00000000000000000000"),
    (keys.parse_object_descriptor, "/storage/topics/ns/t/objects/00000000000000000000"),  # older path
    (keys.parse_schema_metadata, "/schemas/_global/metadata"),
    (keys.parse_schema_version, "/schemas/s/versions/4294967296"),
    (keys.split_topic_name, "default/reliable_topic"),
    (keys.split_topic_name, "/default/reliable_topic/x"),
    (keys.parse_security_revoked_token, "/security/revoked/sub/bob"),
    (keys.parse_security_revoked_token, "/security/revoked/jti/a/b"),
    (keys.parse_security_revoked_subject, "/security/revoked/sub/"),
    (keys.parse_security_role, "/security/revoked/jti/t"),
])
def test_keys_of_another_shape_raise(parse: Callable[[str], Any], key: str) -> None:
    with pytest.raises(InvalidKey):
        parse(key)


def test_topic_names() -> None:
    assert keys.topic_name("default", "reliable_topic") == "/default/reliable_topic"
    assert keys.split_topic_name("/default/reliable_topic") == ("default", "reliable_topic")
    assert keys.unassigned(*keys.split_topic_name("/markets/trade-events")) == \
        "/cluster/unassigned/markets/trade-events"


def test_prefixes_end_with_a_slash_and_hold_only_their_keys() -> None:
    assert not keys.load_balance().startswith(keys.load_prefix())
    assert keys.load_report(5).startswith(keys.load_prefix())
    assert not keys.topic_root("ns", "t2").startswith(keys.topic_prefix("ns", "t"))
    assert not keys.topic_root("ns", "t").startswith(keys.topic_prefix("ns", "t"))
    assert keys.broker_state(5).startswith(keys.broker_topics_prefix(5))
    assert not keys.broker_topic(51, "ns", "t").startswith(keys.broker_topics_prefix(5))
    assert keys.subscription_cursor("ns", "t", "s").startswith(keys.topic_subscriptions_prefix("ns", "t"))
    assert keys.sealed_state("ns", "t").startswith(keys.storage_topic_prefix("ns", "t"))
    assert keys.schema_version("s", 3).startswith(keys.schema_subject_prefix("s"))
    assert keys.namespace_topic("ns", "t").startswith(keys.namespace_topics_prefix("ns"))
    assert keys.legacy_consumer("s", 1).startswith(keys.legacy_subscription_prefix("s"))
    for prefix in [keys.register_prefix(), keys.cluster_prefix(), keys.namespaces_prefix(),
                   keys.topics_prefix(), keys.namespace_prefix("ns"), keys.topic_producers_prefix("ns", "t"),
                   keys.storage_prefix(), keys.legacy_subscriptions_prefix()]:
        assert prefix.startswith("/") and prefix.endswith("/")


def test_names_with_odd_but_legal_characters_round_trip() -> None:
    for name in ["state", "cursor", "objects", "a b", "é-ü_1", ".", "..", "_global"]:
        assert keys.parse_topic_subscription(keys.topic_subscription(name, name, name)) == (name, name, name)
        assert keys.parse_broker_topic(keys.broker_topic(U64_MAX, name, name)) == (U64_MAX, name, name)


# -------------------------------------------------------------------------------------- bad values

@pytest.mark.parametrize("data", [
    b"", b"{", b"not json", b"\xff\xfe", b"NaN", b'{"a": Infinity}',
    b'{"mode": "active", "mode": "draining", "reason": "boot"}', b"[" * 100_000])
def test_malformed_json_raises_bad_value(data: bytes) -> None:
    with pytest.raises(BadValue, match=r"broker state at /cluster/brokers/1/state: value is not valid JSON"):
        BrokerState.from_json(data, key="/cluster/brokers/1/state")


def test_bad_value_is_a_metadata_error_and_a_value_error() -> None:
    assert issubclass(BadValue, MetadataError) and issubclass(BadValue, ValueError)
    assert BadValue.grpc_code == "INVALID_ARGUMENT" and not BadValue.retriable


PRODUCER = {"access_mode": 0, "producer_id": 7, "producer_name": "p", "status": True, "topic_name": "/ns/t"}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("producer_id", "7", "'producer_id' must be an unsigned 64-bit integer, got a string"),
    ("producer_id", 7.0, "'producer_id' must be an unsigned 64-bit integer, got a number"),
    ("producer_id", True, "'producer_id' must be an unsigned 64-bit integer, got a boolean"),
    ("producer_id", -1, "'producer_id' must be an unsigned 64-bit integer"),
    ("producer_id", U64_MAX + 1, "'producer_id' must be an unsigned 64-bit integer"),
    ("producer_id", None, "'producer_id' must be an unsigned 64-bit integer, got null"),
    ("status", 1, "'status' must be a boolean, got an integer"),
    ("producer_name", ["p"], "'producer_name' must be a string, got an array"),
    ("access_mode", 2, "'access_mode' must be one of 0, 1"),
    ("access_mode", True, "'access_mode' must be an unsigned 64-bit integer"),
])
def test_wrong_field_types_name_the_key_and_field(field: str, value: Any, message: str) -> None:
    key = keys.topic_producer("ns", "t", 7)
    with pytest.raises(BadValue, match=re.escape(f"producer at {key}: field {message}")):
        Producer.from_json(json.dumps({**PRODUCER, field: value}).encode(), key=key)


def test_missing_fields_and_wrong_shapes_raise() -> None:
    without = {k: v for k, v in PRODUCER.items() if k != "status"}
    with pytest.raises(BadValue, match="field 'status' is missing"):
        Producer.from_json(json.dumps(without).encode())
    with pytest.raises(BadValue, match="producer: the value must be an object, got an array"):
        Producer.from_json(b"[]")
    with pytest.raises(BadValue, match="must be null"):
        Marker.from_json(b"0")
    with pytest.raises(BadValue, match="one of 'Reliable', 'NonReliable'"):
        TopicDelivery.from_json(b'"reliable"')
    with pytest.raises(BadValue, match="'reason' is missing"):
        Unassigned.from_json(b'{"from_broker": 1}')
    with pytest.raises(BadValue, match=r"resources_usage\[1\]\.resource must be one of 'CPU', 'Memory'"):
        LoadReport.from_json(b'{"resources_usage": [{"resource": "CPU", "usage": 1}, {"resource": "Disk", '
                             b'"usage": 1}], "topic_list": [], "topics_len": 0}')
    with pytest.raises(BadValue, match=r"offset_index\[0\] must be an \[offset, position\] pair"):
        ObjectDescriptor.from_json(b'{"completed": true, "created_at": 1, "end_offset": 2, "etag": null, '
                                   b'"object_id": "o", "offset_index": [[0]], "size": 1, "start_offset": 0}')
    with pytest.raises(BadValue, match="end_offset' must be at least start_offset"):
        ObjectDescriptor.from_json(b'{"completed": true, "created_at": 1, "end_offset": 2, "etag": null, '
                                   b'"object_id": "o", "offset_index": [], "size": 1, "start_offset": 3}')
    with pytest.raises(BadValue, match="20-digit zero-padded offset"):
        CurrentObject.from_json(b'{"start": "30"}')
    with pytest.raises(BadValue, match=r"versions\[0\]\.schema_def\.Avro\.raw_schema is missing"):
        SchemaMetadata.from_json(SCHEMA_METADATA_TEXT.replace('"raw_schema"', '"raw"', 1).encode())
    with pytest.raises(BadValue, match="canonical decimal"):
        LoadBalanceDecision.from_json(b'{"01": []}')
    with pytest.raises(BadValue, match="must be one of 'none', 'warn', 'enforce'"):
        TopicSchemaConfig.from_json(b'{"schema_subject": null, "validation_policy": "Warn", '
                                    b'"enable_payload_validation": false}')


def test_schema_definitions_of_every_kind_round_trip() -> None:
    for value in ['"Bytes"', '"String"', '"Number"',
                  '{"JsonSchema": {"raw_schema": "{}", "fingerprint": "sha256:1"}}',
                  '{"Protobuf": {"raw_proto": "syntax", "message_name": "M", "fingerprint": "sha256:2"}}']:
        parsed = SchemaDefinition.from_obj(json.loads(value), "test", "schema_def")
        assert parsed.to_obj() == json.loads(value)
    for bad in ['"Avro"', '{"String": {}}', '{"Avro": {}, "JsonSchema": {}}', '{"Thrift": {}}', "1"]:
        with pytest.raises(BadValue, match="schema_def"):
            SchemaDefinition.from_obj(json.loads(bad), "test", "schema_def")


def test_unknown_fields_are_kept() -> None:
    registration = {"admin_addr": "a", "advertised_addr": "b", "broker_addr": "c", "prom_exporter": "d",
                    "zone": "eu-1", "nested": {"x": [1, None]}}
    parsed = BrokerRegistration.from_json(json.dumps(registration).encode())
    assert json.loads(parsed.to_json()) == registration and parsed.extra["zone"] == "eu-1"
    report = {"resources_usage": [{"resource": "CPU", "usage": 1, "cores": 2}], "topic_list": [],
              "topics_len": 0, "message_rate": 10}
    assert json.loads(LoadReport.from_json(json.dumps(report).encode()).to_json()) == report
    subscription = {"consumer_id": 5, "consumer_name": "c", "subscription_name": "s", "subscription_type": 3,
                    "key_filters": ["a*"]}
    record = SubscriptionRecord.from_json(json.dumps(subscription).encode())
    assert json.loads(record.to_json()) == subscription
    version = json.loads(SCHEMA_METADATA_TEXT)["versions"][0] | {"deprecation_message": None,
                                                                 "description": "v1"}
    version["schema_def"]["Avro"]["extra"] = 1
    assert json.loads(SchemaVersion.from_json(json.dumps(version).encode()).to_json()) == version


def test_a_registration_names_its_native_listener_only_when_it_has_one() -> None:
    """`fast_addr` (docs/METADATA.md): written when the broker serves the native transport, absent (as in
    Danube's layout) when it does not; a value that is not a string is refused."""
    base = {"admin_addr": "a", "advertised_addr": "b", "broker_addr": "c", "prom_exporter": "d"}
    assert "fast_addr" not in json.loads(BrokerRegistration.from_json(json.dumps(base).encode()).to_json())
    native = BrokerRegistration.from_json(json.dumps(base | {"fast_addr": "10.0.0.5:6651"}).encode())
    assert native.fast_addr == "10.0.0.5:6651"
    assert json.loads(native.to_json())["fast_addr"] == "10.0.0.5:6651"
    with pytest.raises(BadValue, match="fast_addr"):
        BrokerRegistration.from_json(json.dumps(base | {"fast_addr": 6651}).encode())


def test_writing_an_invalid_value_raises() -> None:
    with pytest.raises(BadValue, match="producer being written"):
        Producer(ProducerAccessMode.SHARED, -1, "p", True, "/ns/t").to_json()
    with pytest.raises(BadValue):
        SubscriptionCursor(U64_MAX + 1).to_json()
    with pytest.raises(BadValue):
        SchemaVersion(1, "f", SchemaDefinition(SchemaKind.AVRO), 0).to_json()  # no raw_schema
    with pytest.raises(ValueError, match="needs a reason"):
        Unassigned(from_broker=1).to_json()


def test_resources_are_hashable_values() -> None:
    a = SealedState(True, 21, 10285063371164059634, 1768625254)
    assert a == SealedState.from_json(a.to_json()) and hash(a) == hash(SealedState.from_json(a.to_json()))
    assert len({TopicRoot(0), TopicRoot(0), TopicRoot(1)}) == 2


# ------------------------------------------------------------------------- one owner for path strings

PATH_LITERAL = re.compile(r"(?:^|[^\w.-])/(?:cluster|topics|namespaces|schemas|danube-data|subscriptions|"
                          r"storage/topics|security)(?:/|$)")


PYX_PATH_LITERAL = re.compile(r"[\"']/(?:cluster|topics|namespaces|schemas|danube-data|subscriptions|"
                              r"security)\b")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def path_literals(source: str, filename: str) -> list[str]:
    """String literals (not docstrings; f-string pieces included) that look like a metadata path."""
    tree = ast.parse(source, filename)
    docstrings = _docstrings(tree)
    return [f"{filename}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and PATH_LITERAL.search(node.value)]


def test_the_scan_finds_path_literals() -> None:
    assert path_literals('x = "/cluster/leader"', "a.py")
    assert path_literals('x = f"/topics/{ns}/{t}"', "a.py")
    assert path_literals('x = base + "/cluster"', "a.py")
    assert path_literals('x = "/storage/topics/a"', "a.py")
    assert path_literals('x = f"/security/revoked/jti/{jti}"', "a.py")
    assert not path_literals('"""Keys like /cluster/leader."""\nx = "./danube-data/wal"', "a.py")
    assert not path_literals('x = "/var/lib/cluster/x"', "a.py")


def test_no_metadata_path_is_built_outside_keys() -> None:
    owner = REPO / "danube_fast" / "meta" / "keys.py"
    found: list[str] = []
    for path in sorted((REPO / "danube_fast").rglob("*")):
        if path == owner or "proto" in path.relative_to(REPO).parts or not path.is_file():
            continue
        if path.suffix in (".py", ".pyi"):
            found += path_literals(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
        elif path.suffix in (".pyx", ".pxd"):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if PYX_PATH_LITERAL.search(line):
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "metadata paths must come from danube_fast/meta/keys.py:\n" + "\n".join(found)


# ---------------------------------------------------------- ours: replicated topics (docs/REPLICATION.md)

REPLICATION = [
    Example("replication", "/cluster/replicas/default/orders", '{"owner": 11, "epoch": 4711, '
            '"followers": [22, 33], "isr": [11, 33]}', TopicReplicas,
            lambda: keys.replicas("default", "orders"), keys.parse_replicas, ("default", "orders")),
    Example("replication", "/danube-data/storage/topics/default/orders/replaced/11", '{"through": 1041}',
            ReplacedLog, lambda: keys.replaced_log("default", "orders", 11), keys.parse_replaced_log,
            ("default", "orders", 11)),
    Example("replication", "/danube-data/storage/topics/default/orders/successors/11",
            '{"epoch": 4711, "brokers": [33]}', TermSuccessors,
            lambda: keys.term_successors("default", "orders", 11), keys.parse_term_successors,
            ("default", "orders", 11)),
]


@pytest.mark.parametrize("example", REPLICATION, ids=example_id)
def test_replication_keys_are_built_and_parsed_and_their_values_round_trip(example: Example) -> None:
    test_seed_000_key_is_built_and_parsed(example)
    test_seed_000_value_round_trips(example)


def test_replication_values_refuse_what_cannot_be() -> None:
    assert keys.replicas("a", "b").startswith(keys.replicas_prefix())
    assert ReplacedLog.from_json(b'{"through": -1}').through == -1  # nothing was acknowledged
    with pytest.raises(BadValue, match="brokers other than the owner"):
        TopicReplicas.from_json(b'{"owner": 1, "epoch": 2, "followers": [1, 2], "isr": [1]}')
    with pytest.raises(BadValue, match="the owner and followers"):
        TopicReplicas.from_json(b'{"owner": 1, "epoch": 2, "followers": [2], "isr": [1, 3]}')
    with pytest.raises(InvalidKey):
        keys.cluster_name("replicas")  # a word of the /cluster/ layout
    policy = Policy().merged({"replicationFactor": 3, "minInSyncReplicas": 2}, "x")
    assert (policy.copies, policy.insync_needed) == (3, 2)
    assert (Policy().copies, Policy().insync_needed) == (1, 1)
    with pytest.raises(BadValue, match="at most replicationFactor"):
        Policy().merged({"minInSyncReplicas": 2}, "x")
    with pytest.raises(BadValue, match="at most 5"):
        Policy().merged({"replicationFactor": 6}, "x")


def test_a_policys_table_partitioning_round_trips_is_absent_at_its_default_and_refuses_others() -> None:
    plain = json.loads(Policy().to_json())
    assert "tablePartitioning" not in plain  # hour: absent, the layout every reader knows
    day = Policy.from_json(json.dumps({**plain, "tablePartitioning": "day"}).encode())
    assert day.table_partitioning == "day" and Policy.from_json(day.to_json()) == day
    with pytest.raises(BadValue, match="'tablePartitioning' must be hour or day or month or none, got a st"):
        Policy.from_json(json.dumps({**plain, "tablePartitioning": "week"}).encode())

"""Topic names (docs/WIRE.md C.2): stricter than v0.7.3; exact `-part-N` partitions; dead-letter names."""

from __future__ import annotations

import pytest

from danube_fast.errors import ApiError
from danube_fast.names import (
    TopicName,
    dead_letter_topic,
    is_partition_of,
    parse_topic,
    partition_base,
    partition_index,
)


@pytest.mark.parametrize(("name", "namespace", "topic"), [
    ("/default/my_topic-1", "default", "my_topic-1"),
    ("/default/t-part-0", "default", "t-part-0"),
    ("/ns_1/UPPER-lower_09", "ns_1", "UPPER-lower_09"),
    ("/données/tópico", "données", "tópico"),  # Unicode letters, as v0.7.3's is_alphanumeric
    ("/命名空间/主题", "命名空间", "主题"),
    ("/a/b", "a", "b"),
])
def test_valid_names_split_into_namespace_and_topic(name: str, namespace: str, topic: str) -> None:
    parsed = parse_topic(name)
    assert parsed == TopicName(namespace, topic)
    assert parsed.full == name
    assert str(parsed) == name


@pytest.mark.parametrize("name", [
    "//t",  # v0.7.3 quirk: empty namespace passes there
    "/ns/",  # ... and an empty topic
    "a/b/c",  # ... and a missing leading slash
    "/default/my.topic",
    "/default/my topic",
    "/default/my:topic",
    "/default/t/extra",
    "/default",
    "default/t",
    "",
    "/",
    "//",
    "/default/t\n",
    "/default/t\t",
    "/default/ t",
    "/def ault/t",
    "/default/t*",
    "/default/€",  # a symbol, not a letter
])
def test_invalid_names_are_refused_with_the_contract_message(name: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_topic(name)
    assert info.value.grpc_code == "INVALID_ARGUMENT"
    assert not info.value.retriable
    assert str(info.value) == (f"The topic: {name} has an invalid format, should be: "
                               "/namespace_name/topic_name")


@pytest.mark.parametrize(("short", "base", "index"), [
    ("orders-part-0", "orders", 0),
    ("orders-part-7", "orders", 7),
    ("orders-part-12", "orders", 12),
    ("a-part-1-part-2", "a-part-1", 2),  # the base is what precedes the last -part-
    ("x--part-3", "x-", 3),
])
def test_partition_names(short: str, base: str, index: int) -> None:
    assert partition_base(short) == base
    assert partition_index(short) == index
    assert is_partition_of(short, base)


@pytest.mark.parametrize("short", [
    "orders",
    "orders_v2",
    "orders-part-",
    "orders-part-x",
    "orders-part-01",  # not a partition index: partitions are numbered without leading zeros
    "x-part-01",
    "orders-part--1",
    "orders-part-1a",
    "orders-part-1-dlq",
    "-part-1",  # no base
    "orders_part_1",
    "orders-PART-1",
])
def test_not_partitions(short: str) -> None:
    assert partition_base(short) is None
    assert partition_index(short) == -1


def test_partition_membership_is_exact_not_a_prefix() -> None:
    assert not is_partition_of("orders_v2", "orders")  # v0.7.3's prefix defect (docs/WIRE.md C.3, D.16)
    assert not is_partition_of("orders_v2-part-0", "orders")
    assert not is_partition_of("orders", "orders")
    assert not is_partition_of("orders-part-01", "orders")
    assert not is_partition_of("orders-part-1", "order")
    assert not is_partition_of("orders-part-1", "orders-part")
    assert is_partition_of("orders_v2-part-0", "orders_v2")
    assert is_partition_of("orders-part-1", "orders")


def test_dead_letter_topic_keeps_the_namespace() -> None:
    dlq = dead_letter_topic(TopicName("billing", "orders-part-3"))
    assert dlq == TopicName("billing", "orders-part-3-dlq")
    assert dlq.full == "/billing/orders-part-3-dlq"
    assert parse_topic(dlq.full) == dlq  # a valid topic name itself
    assert partition_base(dlq.topic) is None  # and not mistaken for a partition

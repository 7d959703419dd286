"""The policy's tablePartitionBy (danube_fast/meta/table_partitions.py): Spark's DDL forms are read and
written back one way, and anything else is refused saying what is wrong; a policy stores the canonical
text and refuses a bad one as a BadValue naming the key."""

from __future__ import annotations

import json

import pytest

from danube_fast.meta.resources import BadValue, Policy
from danube_fast.meta.table_partitions import PartitionField, canonical, parse


@pytest.mark.parametrize("text, fields, written", [
    ("", (), ""),
    ("region", (PartitionField("identity", "region"),), "region"),
    (" region ,bucket( 16,user_id ) ",
     (PartitionField("identity", "region"), PartitionField("bucket", "user_id", 16)),
     "region, bucket(16, user_id)"),
    ("days(event_time), truncate(4, sku)",
     (PartitionField("day", "event_time"), PartitionField("truncate", "sku", 4)),
     "day(event_time), truncate(4, sku)"),
    ("identity(ship_to.city), HOURS(seen)", (PartitionField("identity", "ship_to.city"),
                                             PartitionField("hour", "seen")), "ship_to.city, hour(seen)"),
])
def test_spark_ddl_forms_are_read_and_written_back_one_way(text: str, fields: tuple[PartitionField, ...],
                                                           written: str) -> None:
    assert parse(text) == fields and canonical(text) == written and parse(written) == fields


def test_partition_field_names_are_sparks() -> None:
    assert [f.name for f in parse("region, bucket(16, user_id), truncate(4, a.b), month(t)")] == [
        "region", "user_id_bucket_16", "a_b_truncate_4", "t_month"]


@pytest.mark.parametrize("text, message", [
    ("bucket(user_id)", "bucket needs a number from 1 to 2147483647 before its column: bucket(N, user_id)"),
    ("bucket(0, user_id)", "bucket needs a number"),
    ("day(3, seen)", "day takes a column only: day(seen)"),
    ("squash(x)", "'squash' is not a partition transform: give comma-separated columns"),
    ("timestamp", "timestamp is partitioned by tablePartitioning, not here"),
    ("hour(timestamp)", "timestamp is partitioned by tablePartitioning"),
    ("partition", "partition is partitioned by the topic's partitions"),
    ("a, bucket(2, a)", "column a is named twice"),
    ("a b", "cannot read 'a b'"),
    ("a,,b", "cannot read ',b'"),
    ("(x)", "cannot read '(x)'"),
])
def test_anything_else_is_refused_saying_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(text)


def test_a_policy_stores_the_canonical_text_and_refuses_a_bad_one_naming_the_key() -> None:
    plain = json.loads(Policy().to_json())
    assert "tablePartitionBy" not in plain
    got = Policy.from_json(json.dumps({**plain, "tablePartitionBy": "region,bucket(2,id)"}).encode())
    assert got.table_partition_by == "region, bucket(2, id)"
    assert json.loads(got.to_json())["tablePartitionBy"] == "region, bucket(2, id)"
    with pytest.raises(BadValue, match="'tablePartitionBy': bucket needs a number"):
        Policy.from_json(json.dumps({**plain, "tablePartitionBy": "bucket(id)"}).encode())

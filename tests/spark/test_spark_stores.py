"""The data source over S3 (a real S3 endpoint on loopback, moto) and over damaged objects: a missing object
or a corrupt batch stops the query with an error naming the object when failOnDataLoss is true (the
default), and is skipped, the rest read exactly, when it is false."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from spark_support import payload, produce_fast, reader_options, wait_uploaded

from danube_fast.storage.objects.format import HEADER_SIZE
from danube_fast.testing.broker import Broker, BrokerFactory
from danube_fast.testing.moto import ACCESS_KEY, REGION, SECRET_KEY, MotoServer

pytestmark = [pytest.mark.spark, pytest.mark.s3]

ROUNDS, PER_ROUND = 3, 2000
FAST_UPLOADS = "[cluster]\nupload_interval_ms = 200\n"


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    server = MotoServer()
    yield server
    server.stop()


def produce_in_rounds(broker: Broker, topic: str) -> None:
    """ROUNDS uploads of PER_ROUND records each: ROUNDS objects or more."""
    for k in range(ROUNDS):
        asyncio.run(produce_fast(broker, topic, PER_ROUND, start=k * PER_ROUND))
        wait_uploaded(broker, topic, (k + 1) * PER_ROUND)


def test_reads_objects_from_s3(spark: SparkSession, broker_factory: BrokerFactory, moto: MotoServer) -> None:
    bucket = moto.create_bucket()
    broker = broker_factory.start(f"""
[cluster]
upload_interval_ms = 200
object_store = "s3://{bucket}/danube"
s3_endpoint = "{moto.endpoint}"
s3_region = "{REGION}"
s3_access_key = "{ACCESS_KEY}"
s3_secret_key = "{SECRET_KEY}"
""")
    topic = "/default/on_s3"
    produce_in_rounds(broker, topic)
    options = {**reader_options(broker, topic=topic, endingOffsets="uploaded"),
               "objectStore": f"s3://{bucket}/danube", "s3Endpoint": moto.endpoint, "s3Region": REGION,
               "s3AccessKeyId": ACCESS_KEY, "s3SecretAccessKey": SECRET_KEY}
    df = spark.read.format("danube").options(**options).load()
    assert df.rdd.getNumPartitions() >= ROUNDS
    rows = df.select("offset", "value").orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(ROUNDS * PER_ROUND))
    assert [bytes(r.value) for r in rows] == [payload(topic, i) for i in range(ROUNDS * PER_ROUND)]
    wrong = {**options, "s3SecretAccessKey": "wrong", "s3Endpoint": "http://127.0.0.1:9"}
    with pytest.raises((PySparkException, Py4JJavaError)):
        spark.read.format("danube").options(**wrong).load().count()


def objects_of(broker: Broker, topic: str) -> list[Path]:
    ns, short = topic.split("/")[1:]
    return sorted((broker.data_dir / "objects" / ns / short).glob("*.dnb1"),
                  key=lambda p: int(p.name.split("-")[1]))


def read_all(spark: SparkSession, broker: Broker, topic: str, fail: bool) -> list[int]:
    df = spark.read.format("danube").options(**reader_options(
        broker, topic=topic, endingOffsets="uploaded", failOnDataLoss=str(fail).lower())).load()
    return [r.offset for r in df.select("offset").collect()]


def test_a_missing_object(spark: SparkSession, broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(FAST_UPLOADS)
    topic = "/default/missing_object"
    produce_in_rounds(broker, topic)
    victim = objects_of(broker, topic)[1]
    first, last = (int(x) for x in victim.stem.split("-")[1:3])
    victim.unlink()
    with pytest.raises((PySparkException, Py4JJavaError)) as raised:
        read_all(spark, broker, topic, fail=True)
    assert victim.name in str(raised.value) and "failOnDataLoss" in str(raised.value)
    got = read_all(spark, broker, topic, fail=False)
    assert sorted(got) == [o for o in range(ROUNDS * PER_ROUND) if not first <= o <= last]


def test_a_corrupt_batch(spark: SparkSession, broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(FAST_UPLOADS)
    topic = "/default/corrupt_batch"
    produce_in_rounds(broker, topic)
    victim = objects_of(broker, topic)[0]
    data = bytearray(victim.read_bytes())
    data[HEADER_SIZE + 200] ^= 0xFF  # inside the first batch's records: its CRC fails
    victim.write_bytes(bytes(data))
    with pytest.raises((PySparkException, Py4JJavaError)) as raised:
        read_all(spark, broker, topic, fail=True)
    assert victim.name in str(raised.value)
    got = read_all(spark, broker, topic, fail=False)
    assert len(got) == len(set(got)) and set(got) <= set(range(ROUNDS * PER_ROUND))
    lost = ROUNDS * PER_ROUND - len(got)
    assert 0 < lost <= 1000, f"one batch (at most 1,000 records) lost, not {lost}"
    assert min(got) > 0 and max(got) == ROUNDS * PER_ROUND - 1  # the first batch went, the rest is there

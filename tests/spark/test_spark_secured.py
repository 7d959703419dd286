"""The Spark source and sink against a broker with `mode = tls_jwt` (docs/SECURITY.md): the options tlsCaFile,
tlsCertFile, tlsKeyFile and token reach every broker call of the driver and the tasks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession
from pyspark_danube.options import OptionError, parse
from spark_support import reader_options

from danube_fast.testing.broker import Broker
from tests.security.conftest import Pki, pki, security_toml, started

__all__ = ["pki"]  # the fixture, from the security tests


@pytest.fixture(scope="module")
def secured(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    yield from started(tmp_path_factory.mktemp("spark-secured"), security_toml(pki, super_admins=("spark",)))


def test_a_secured_broker_is_written_and_read_with_a_token(spark: SparkSession, secured: Broker,
                                                          pki: Pki) -> None:
    security = {"tlsCaFile": str(pki.ca), "token": pki.token("spark")}
    topic = "/default/secured_rows"
    (spark.range(200, numPartitions=2).selectExpr("CAST(id AS STRING) AS value").write.format("danube")
     .mode("append").option("broker", secured.target).option("topic", topic).options(**security).save())
    rows = (spark.read.format("danube").options(**reader_options(secured, topic=topic, **security)).load()
            .orderBy("offset").collect())
    assert sorted(int(bytes(r.value)) for r in rows) == list(range(200))  # the tail, through FastReader

    refused = {"tlsCaFile": str(pki.ca), "token": pki.token("stranger")}
    with pytest.raises(Exception, match="PERMISSION_DENIED"):
        (spark.range(5).selectExpr("CAST(id AS STRING) AS value").write.format("danube").mode("append")
         .option("broker", secured.target).option("topic", topic).options(**refused).save())


def test_security_options_are_checked(pki: Pki) -> None:
    base = {"metadataStore": "embedded:/x", "objectStore": "/x", "topic": "/default/t"}
    assert parse(base).credentials is None
    assert parse({**base, "tlsCaFile": str(pki.ca), "token": "t"}).credentials is not None
    with pytest.raises(OptionError, match="go together"):
        parse({**base, "tlsCertFile": str(pki.alice.cert)})
    with pytest.raises(OptionError, match="no file"):
        parse({**base, "tlsCaFile": "/nonexistent/ca.crt"})

"""The console of one broker of a 2-broker cluster (real etcd, broker processes) shows the whole cluster: both
brokers and the leader, a partitioned topic whose partitions the two brokers own, and the records of each
partition, read from whichever broker owns it (docs/CONSOLE.md, "Cluster")."""

from __future__ import annotations

import time

import grpc
import pytest
from selenium.webdriver.common.alert import Alert
from selenium.webdriver.common.by import By

from danube_fast.proto import DanubeAdmin_pb2 as admin_pb
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.testing.cluster import Cluster
from tests.compat.compat_support import run_async
from tests.console.conftest import Console
from tests.console.conftest import producing as _producer

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.timeout(180)]

TOPIC = "/default/spread"
PARTITIONS = 4


def test_one_console_shows_both_brokers_and_every_partitions_records(driver, cluster: Cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.console = True
    brokers = cluster.start(2)
    first = brokers[0]

    async def load() -> dict[str, str]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{first.admin_port}") as channel:
            await admin_grpc.TopicAdminStub(channel).CreatePartitionedTopic(admin_pb.PartitionedTopicRequest(
                base_name=TOPIC, partitions=PARTITIONS, dispatch_strategy=admin_pb.Reliable))
            for p in range(PARTITIONS):
                async with _producer(first.target, f"{TOPIC}-part-{p}", f"writer{p}") as producer:
                    await (await producer.send_batch([f"p{p}-{n}".encode() for n in range(5)]))
            listed = await admin_grpc.TopicAdminStub(channel).ListNamespaceTopics(
                admin_pb.NamespaceRequest(name="default"))
            return {t.name: t.broker_id for t in listed.topics}

    owners = run_async(load(), timeout=90)
    assert len(set(owners.values())) == 2, f"the partitions were all placed on one broker: {owners}"

    console = Console(driver, first.console_url(), "cluster")
    console.open("overview")
    rows = console.rows("brokers")
    assert sorted(r[0] for r in rows) == sorted(str(b.broker_id) for b in brokers)
    assert [r[4] for r in rows].count("leader") == 1
    # Totals and charts are every broker's, whichever console is asked (BrokerStats).
    console.wait_for("#main", f"Messages in\n{PARTITIONS * 5}")
    assert not console.all("missing-broker")
    console.shot("overview")

    console.open("topics")
    row = console.wait_for('[data-test="topics"] tbody tr', TOPIC)
    cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
    assert cells[2] == str(PARTITIONS) and sorted(cells[3].split(", ")) == sorted(set(owners.values()))

    for p in range(PARTITIONS):
        console.open(f"browse?topic={TOPIC}-part-{p}&from=earliest&count=10", "browse")
        values = console.texts("value")
        assert values == [f"p{p}-{n}" for n in range(5)], (p, owners[f"{TOPIC}-part-{p}"], values)
    console.open(f"topic?name={TOPIC}", "topic")
    owned = console.rows("partitions")
    assert {r[0]: r[1] for r in owned} == owners
    console.shot("topic")

    # Move a partition off its owner: the load manager places it on the other broker, and the page says so.
    moved = f"{TOPIC}-part-0"
    row = next(tr for tr in console.test("partitions").find_elements(By.CSS_SELECTOR, "tbody tr")
               if tr.find_elements(By.TAG_NAME, "td")[0].text == moved)
    row.find_element(By.CSS_SELECTOR, '[data-test="unload"]').click()
    Alert(console.driver).accept()
    console.wait_for('[data-test="notice"]', f"Unloaded {moved}")
    other = next(str(b.broker_id) for b in brokers if str(b.broker_id) != owners[moved])

    def owner_now() -> str:
        console.open(f"topic?name={TOPIC}", "topic")
        return {r[0]: r[1] for r in console.rows("partitions")}[moved]
    deadline = time.monotonic() + 30
    while owner_now() != other:
        assert time.monotonic() < deadline, f"{moved} still on {owners[moved]}, not moved to {other}"
        time.sleep(0.5)
    console.open(f"browse?topic={moved}&from=earliest&count=10", "browse")
    assert console.texts("value") == [f"p0-{n}" for n in range(5)]  # nothing lost
    assert console.errors() == []

"""`danube-fast admin brokers|topics|cluster ...` run as a subprocess against in-process admin nodes (X the
leader, Y, over one embedded store), in both output formats; and its error lines and exit codes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from admin_nodes import FakeRebalancer, Node, closed_port, two_brokers
from cluster_support import register, synced

from danube_fast.broker.cluster.moves import Move
from danube_fast.codec import frames
from danube_fast.meta import keys
from danube_fast.meta.resources import BrokerState, Unassigned
from danube_fast.meta.store import MetadataStore
from danube_fast.proto import DanubeApi_pb2 as api

pytestmark = [pytest.mark.timeout(120), pytest.mark.cluster]
on_asyncio = pytest.mark.parametrize("run", ["asyncio"], indirect=True)  # a subprocess per command: one loop

X, Y, W = 101, 202, 404
CLI = [sys.executable, "-m", "danube_fast.cli.main", "admin"]


async def cli(node: Node | str, *args: str, output: str = "table", code: int = 0) -> str:
    """Run the command against `node`'s admin port; its stdout (or stderr when `code` is not 0)."""
    addr = node if isinstance(node, str) else node.addr
    proc = await asyncio.create_subprocess_exec(*CLI, *args, "--admin-addr", addr, "--output", output,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == code, f"{args}: exit {proc.returncode}\n{out.decode()}\n{err.decode()}"
    return (out if code == 0 else err).decode()


async def cli_json(node: Node, *args: str) -> Any:
    return json.loads(await cli(node, *args, output="json"))


def table(text: str) -> list[list[str]]:
    """The rows of a table (header first), split on runs of spaces."""
    return [line.split() for line in text.strip().splitlines()]


async def _synced(store: MetadataStore, *nodes: Node) -> None:
    for node in nodes:
        await synced(node.view, store)


@on_asyncio
def test_admin_cli_brokers_and_cluster(run: Any, tmp_path: Path) -> None:
    async def scenario() -> None:
        moves = [Move("/ns1/a", X, Y, 2.0, "topic count imbalance")]
        async with two_brokers(tmp_path, X, Y, FakeRebalancer(moves)) as (store, x, y):
            await register(store, W, admin_port=closed_port(), mode="draining", reason="admin_unload")
            await _synced(store, x, y)

            rows = table(await cli(y, "brokers", "list"))
            assert rows[0] == ["BROKER", "ID", "ROLE", "STATUS", "BROKER", "ADDR", "ADMIN", "ADDR", "METRICS",
                               "ADDR"]
            assert [r[:3] for r in rows[1:]] == [[str(X), "Cluster_Leader", "active"],
                                                 [str(Y), "Cluster_Follower", "active"],
                                                 [str(W), "Cluster_Follower", "drained"]]
            assert rows[1][4] == f"http://{x.addr}"
            listed = await cli_json(y, "brokers", "list")
            assert listed["brokers"][0] == {
                "broker_id": str(X), "role": "Cluster_Leader", "status": "active",
                "broker_addr": f"http://127.0.0.1:{x.port + 1}", "admin_addr": f"http://{x.addr}",
                "metrics_addr": f"127.0.0.1:{x.port + 2}"}
            assert [b["status"] for b in listed["brokers"]] == ["active", "active", "drained"]

            assert table(await cli(y, "brokers", "leader")) == [["leader", str(X)]]
            assert await cli_json(y, "brokers", "leader") == {"leader": str(X)}
            assert await cli_json(x, "brokers", "namespaces") == {"namespaces": [
                {"namespace": "default"}, {"namespace": "ns1"}, {"namespace": "system"}]}

            await cli(x, "topics", "create", "/ns1/a")
            await _synced(store, x, y)
            balance = await cli_json(y, "cluster", "balance")
            assert balance == {
                "broker_count": 3, "mean_load": 1 / 3, "min_load": 0.0, "max_load": 1.0,
                "std_deviation": pytest.approx(2 ** 0.5 / 3),
                "coefficient_of_variation": pytest.approx(2 ** 0.5),
                "assignment_strategy": "least_loaded", "brokers": [
                    {"broker_id": X, "load": 1.0, "topic_count": 1, "is_overloaded": False,
                     "is_underloaded": False},
                    {"broker_id": Y, "load": 0.0, "topic_count": 0, "is_overloaded": False,
                     "is_underloaded": False},
                    {"broker_id": W, "load": 0.0, "topic_count": 0, "is_overloaded": False,
                     "is_underloaded": False}]}
            text = await cli(y, "cluster", "balance")
            assert "coefficient_of_variation  1.4142" in text
            assert table(text.split("\n\n")[1]) == [
                ["BROKER", "ID", "LOAD", "TOPICS", "OVERLOADED", "UNDERLOADED"],
                [str(X), "1.000", "1", "no", "no"], [str(Y), "0.000", "0", "no", "no"],
                [str(W), "0.000", "0", "no", "no"]]

            dry = await cli_json(y, "cluster", "rebalance", "--dry-run", "--max-moves", "1")
            assert dry == {"dry_run": True, "success": True, "moves_executed": 0, "moves": [
                {"topic": "/ns1/a", "from_broker": X, "to_broker": Y, "estimated_load": 2.0,
                 "reason": "topic count imbalance"}]}
            done = table(await cli(y, "cluster", "rebalance"))
            assert done[:3] == [["dry_run", "False"], ["success", "True"], ["moves_executed", "1"]]
            assert done[3:] == [[], ["TOPIC", "FROM", "TO", "LOAD", "REASON"],
                                ["/ns1/a", str(X), str(Y), "2.000", "topic", "count", "imbalance"]]

            planned = await cli_json(y, "brokers", "unload", str(X), "--dry-run", "--include", "ns1")
            assert planned == {"broker_id": str(X), "dry_run": True, "started": False, "total": 1,
                               "succeeded": 0, "failed": 0, "pending": 1, "failed_topics": []}
            assert await cli_json(y, "brokers", "activate", str(W), "--reason", "back") == {
                "broker_id": str(W), "activated": True}
            assert y.view.state(W) == BrokerState("active", "back")
            assert table(await cli(y, "brokers", "unload", str(W), "--drain-timeout", "1")) == [
                ["broker_id", str(W)], ["dry_run", "False"], ["started", "True"], ["total", "0"],
                ["succeeded", "0"], ["failed", "0"], ["pending", "0"], ["failed_topics", "0"]]
            assert y.view.state(W) == BrokerState("draining", "admin_unload")

    run(scenario(), timeout=100)


@on_asyncio
def test_admin_cli_topics(run: Any, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with two_brokers(tmp_path, X, Y) as (store, x, y):
            assert await cli_json(x, "topics", "create", "/ns1/cli-t", "--reliable") == {
                "created": "/ns1/cli-t", "partitions": 0, "delivery": "Reliable"}
            await cli(y, "topics", "create", "/ns1/parts", "--partitions", "2")
            await _synced(store, x, y)

            assert table(await cli(x, "topics", "list", "ns1")) == [
                ["TOPIC", "BROKER", "DELIVERY"], ["/ns1/cli-t", str(X), "Reliable"],
                ["/ns1/parts-part-0", str(Y), "NonReliable"], ["/ns1/parts-part-1", str(Y), "NonReliable"]]
            assert await cli_json(x, "topics", "list", "--broker", str(Y)) == {"topics": [
                {"name": "/ns1/parts-part-0", "broker_id": str(Y), "delivery": "NonReliable"},
                {"name": "/ns1/parts-part-1", "broker_id": str(Y), "delivery": "NonReliable"}]}
            assert table(await cli(x, "topics", "list", "nothing-here")) == [["(no", "topics)"]]
            described = await cli_json(y, "topics", "describe", "/ns1/cli-t")
            assert json.loads(described.pop("policy"))["max_message_size"] > 0
            assert described.pop("policy_source") == "namespace"
            assert described.pop("live").startswith("unavailable: ")  # these nodes serve no metrics
            assert described == {"name": "/ns1/cli-t", "broker_id": str(X), "delivery": "Reliable",
                                 "subscriptions": []}
            rows = table(await cli(y, "topics", "describe", "/ns1/cli-t"))
            assert rows[:3] == [["name", "/ns1/cli-t"], ["broker_id", str(X)], ["delivery", "Reliable"]]
            assert rows[-1] == ["(no", "subscriptions)"]

            assert await cli_json(y, "topics", "unload", "/ns1/cli-t") == {"unloaded": "/ns1/cli-t"}
            marker = await store.get(keys.unassigned("ns1", "cli-t"))
            assert marker is not None and Unassigned.from_json(marker.value) == Unassigned.unload(X)
            error = await cli(y, "topics", "unload", "/ns1/cli-t", code=1)
            assert error == (f"danube-fast: topics unload failed: the broker at {y.addr} answered NOT_FOUND: "
                             "Unable to unload the topic /ns1/cli-t: it is unassigned\n")

            assert await cli_json(x, "topics", "delete", "/ns1/parts") == {"deleted": "/ns1/parts"}
            assert y.topics.find("/ns1/parts-part-0") is None  # deleted by Y, its owner
            await _synced(store, x, y)
            assert table(await cli(x, "topics", "list", "--broker", str(Y))) == [["(no", "topics)"]]

    run(scenario(), timeout=100)


@on_asyncio
def test_admin_cli_namespaces_and_subscriptions(run: Any, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with two_brokers(tmp_path, X, Y) as (store, x, y):
            assert await cli_json(x, "namespaces", "create", "ns2") == {"namespace": "ns2", "created": True}
            error = await cli(y, "namespaces", "create", "ns2", code=1)
            assert "answered NOT_FOUND" in error and "already exists" in error, error
            await cli(y, "topics", "create", "/ns2/held", "--reliable")
            await _synced(store, x, y)
            assert await cli_json(y, "namespaces", "list") == {"namespaces": [
                {"namespace": n} for n in ("default", "ns1", "ns2", "system")]}
            described = await cli_json(x, "namespaces", "describe", "ns2")
            assert described.pop("policy")["max_message_size"] > 0
            assert described == {"namespace": "ns2", "topics": [{"topic": "/ns2/held"}]}
            refused = await cli(x, "namespaces", "delete", "ns2", code=1)
            assert "answered NOT_FOUND" in refused and "still has 1 topics" in refused, refused

            held = y.topics.find("/ns2/held")
            assert held is not None
            await y.ctx.subscriptions.subscribe(held, api.ConsumerRequest(
                topic_name=held.full, consumer_name="c", subscription="audit", subscription_type=1))
            assert table(await cli(x, "subscriptions", "list", "/ns2/held")) == [
                ["topic", "/ns2/held"], [],
                ["TOPIC", "SUBSCRIPTION", "TYPE", "POSITION", "BACKLOG", "UNACKED", "CONSUMERS"],
                ["/ns2/held", "audit", "Shared", "0", "0", "0", "1"]]
            busy = await cli(x, "subscriptions", "delete", "/ns2/held", "audit", code=1)
            assert "active consumers" in busy, busy
            for consumer in held.subscriptions["audit"].consumers:
                consumer.active = False
            assert await cli_json(x, "subscriptions", "delete", "/ns2/held", "audit") == {
                "topic": "/ns2/held", "subscription": "audit", "deleted": True}
            assert await cli_json(y, "subscriptions", "list", "/ns2/held") == {
                "topic": "/ns2/held", "subscriptions": []}

            # SubscriptionAdmin asked of X is answered by Y, the owner.
            await held.ready_for_batches()
            await held.publish_batch(frames.encode_payloads([b"h-%d" % i for i in range(5)]), 5)
            made = await cli_json(x, "subscriptions", "create", "/ns2/held", "early", "--position",
                                  "earliest")
            assert [(p["stored_topic"], p["to_offset"]) for p in made["positions"]] == [("/ns2/held", 0)]
            peeked = await cli_json(x, "subscriptions", "peek", "/ns2/held", "early", "--count", "2")
            assert [(r["offset"], r["payload"]) for r in peeked["records"]] == [(0, "h-0"), (1, "h-1")]
            browsed = await cli_json(x, "subscriptions", "browse", "/ns2/held", "--latest", "--backward",
                                     "--count", "2")
            assert [(r["offset"], r["payload"]) for r in browsed["records"]] == [(3, "h-3"), (4, "h-4")]
            assert browsed["ranges"] == [{"stored_topic": "/ns2/held", "start_offset": 0, "end_offset": 5}]
            moved = await cli_json(x, "subscriptions", "seek", "/ns2/held", "early", "--offset", "3")
            assert [(p["from_offset"], p["to_offset"], p["moved"]) for p in moved["positions"]] == [
                (0, 3, True)]
            described = await cli_json(x, "subscriptions", "describe", "/ns2/held", "early")
            assert [(d["position"], d["backlog"]) for d in described["partitions"]] == [(3, 2)]
            assert held.subscriptions["early"].cursor.low == 3  # type: ignore[union-attr]
            await cli(x, "subscriptions", "delete", "/ns2/held", "early")

            await cli(x, "topics", "delete", "/ns2/held")
            await _synced(store, x, y)
            assert await cli_json(x, "namespaces", "delete", "ns2") == {"namespace": "ns2", "deleted": True}
            await _synced(store, x, y)
            listed = await cli_json(y, "namespaces", "list")
            assert "ns2" not in [n["namespace"] for n in listed["namespaces"]]

    run(scenario(), timeout=100)


def test_admin_cli_errors() -> None:
    port = closed_port()
    r = subprocess.run([*CLI, "brokers", "list", "--admin-addr", f"127.0.0.1:{port}", "--timeout", "5"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == "", r
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("danube-fast: brokers list failed: cannot reach the broker at "
                               f"127.0.0.1:{port} (--admin-addr): "), r.stderr
    usage = subprocess.run([*CLI, "topics", "list"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "one of the arguments NS --broker is required" in usage.stderr
    count = subprocess.run([*CLI, "cluster", "rebalance", "--max-moves", "-1"], capture_output=True,
                           text=True, timeout=60)
    assert count.returncode == 2 and "must be 0 or more" in count.stderr


def test_the_cli_names_its_version() -> None:
    from importlib.metadata import version

    done = subprocess.run([sys.executable, "-m", "danube_fast.cli.main", "--version"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == f"danube-fast {version('danube-fast')}\n", done

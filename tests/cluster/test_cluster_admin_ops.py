"""ClusterView and the admin operations over real metadata stores (embedded and etcd), on asyncio and uvloop:
registrations, states, assignments and markers are written straight into the store, as brokers and the load
manager write them; the operations' writes are read back from the store, not from the view."""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any

import pytest
from cluster_support import (
    WAIT,
    assign,
    cluster_view,
    lead,
    namespace,
    register,
    registration,
    report,
    synced,
    topic,
)

from danube_fast.broker.cluster.admin import ops as admin_ops
from danube_fast.broker.cluster.view import BrokerEntry, ClusterView, UnassignedTopic
from danube_fast.errors import ApiError
from danube_fast.meta import keys
from danube_fast.meta.resources import (
    BrokerState,
    DeliveryMode,
    SubscriptionCursor,
    SubscriptionRecord,
    SubscriptionType,
    TopicSchemaConfig,
    Unassigned,
)
from danube_fast.meta.resources_base import load_json
from danube_fast.meta.store import MetadataStore

pytestmark = [pytest.mark.timeout(90), pytest.mark.cluster]

A, B, C = 11, 22, 33


async def _state(store: MetadataStore, broker_id: int) -> BrokerState:
    kv = await store.get(keys.broker_state(broker_id))
    assert kv is not None, f"broker {broker_id} has no state"
    return BrokerState.from_json(kv.value)


async def _assignments(store: MetadataStore) -> set[tuple[int, str, str]]:
    found = set()
    for kv in await store.get_prefix(keys.brokers_prefix()):
        with contextlib.suppress(ValueError):  # state keys
            found.add(keys.parse_broker_topic(kv.key))
    return found


async def _three_brokers(store: MetadataStore, assigned: dict[int, list[str]]) -> None:
    """Brokers A, B (the leader) and C, namespaces ns1 and ns2, and the topics ("ns/topic") of `assigned`."""
    for port, b in ((100, A), (200, B), (300, C)):
        await register(store, b, admin_port=port)
    await lead(store, B)
    await namespace(store, "ns1")
    await namespace(store, "ns2")
    for owner, names in assigned.items():
        for name in names:
            ns, t = name.split("/")
            await topic(store, ns, t, owner)


def test_cluster_admin_view_reads_the_cluster(run: Any, store: Any) -> None:
    async def scenario() -> None:
        async with store() as s:
            await register(s, A, admin_port=100)
            await register(s, B, admin_port=200, mode="draining", reason="admin_unload")
            await register(s, C, admin_port=300, mode=None)
            await s.put(keys.broker_register(44), b'{"admin_addr": 1}')  # not a registration: left out
            await lead(s, B)
            await namespace(s, "ns1")
            await namespace(s, "ns2")
            await topic(s, "ns1", "a", A)
            await topic(s, "ns1", "b", C)
            await topic(s, "ns2", "c", A, DeliveryMode.RELIABLE)
            await topic(s, "ns2", "new", None)
            await s.put(keys.unassigned("ns1", "moved"), Unassigned.unload(A).to_json())
            await report(s, A, ["/ns1/a", "/ns2/c"])
            await report(s, C, ["/ns1/b"])
            async with cluster_view(s) as view:
                assert view.brokers() == [
                    BrokerEntry(A, registration(100), BrokerState("active", "boot"), False),
                    BrokerEntry(B, registration(200), BrokerState("draining", "admin_unload"), True),
                    BrokerEntry(C, registration(300), None, False)]
                assert (view.leader_id(), view.registration(B), view.registration(99)) == (
                    B, registration(200), None)
                assert (view.state(B), view.state(C)) == (BrokerState("draining", "admin_unload"), None)
                owners = (view.owner("ns1", "a"), view.owner("ns1", "b"), view.owner("ns2", "new"))
                assert owners == (A, C, None)
                assert view.broker_topics(A) == [("ns1", "a"), ("ns2", "c")]  # its state key is not a topic
                assert view.broker_topics(B) == []
                assert view.unassigned() == [UnassignedTopic("ns1", "moved", Unassigned("unload", A)),
                                             UnassignedTopic("ns2", "new", Unassigned())]
                reports = view.load_reports()
                assert sorted(reports) == [A, C] and reports[A].topic_list == ("/ns1/a", "/ns2/c")
                assert view.namespaces() == ["ns1", "ns2"]  # each once, though both have several keys
                assert view.namespace_topics("ns2") == ["c", "new"]
                assert view.namespace_exists("ns1") and not view.namespace_exists("ns3")

                # The owner index follows the cache: a move shows at once.
                await s.delete(keys.broker_topic(A, "ns1", "a"))
                await s.put(keys.broker_topic(B, "ns1", "a"), b"null")
                await s.delete(keys.leader())
                await synced(view, s)
                assert (view.owner("ns1", "a"), view.leader_id()) == (B, None)
                assert [e.is_leader for e in view.brokers()] == [False, False, False]

    run(scenario(), timeout=60)


def test_cluster_admin_view_owner_index_follows_its_prefix(run: Any, store: Any) -> None:
    """The cache's revision is the highest of its prefixes: a quiet /namespaces/ prefix can reach a revision
    before /cluster/ applies a change made at it. The owner index must still see that change."""

    async def scenario() -> None:
        async with store() as s:
            await namespace(s, "ns1")
            async with cluster_view(s) as view:
                assert view.owner("ns1", "a") is None
                await view.cache._pause_watches()
                revision = await s.put(keys.broker_topic(A, "ns1", "a"), b"null")
                # The quiet prefix is found current at `revision` by a read; /cluster/ has not applied it.
                await view.cache.wait_for_revision(revision, WAIT, key=keys.namespace_policy("ns1"))
                assert view.cache.revision == revision and view.owner("ns1", "a") is None
                view.cache._resume_watches()
                await view.cache.wait_for_revision(revision, WAIT, key=keys.broker_topic(A, "ns1", "a"))
                assert view.cache.get(keys.broker_topic(A, "ns1", "a")) is not None
                assert view.owner("ns1", "a") == A

    run(scenario(), timeout=60)


def test_cluster_admin_unload_topic(run: Any, store: Any) -> None:
    async def scenario() -> None:
        async with store() as s:
            await register(s, A)
            await namespace(s, "ns1")
            await topic(s, "ns1", "a", A)
            async with cluster_view(s) as view:
                with pytest.raises(ApiError) as alone:
                    await admin_ops.unload_topic(s, view, "ns1", "a")
                assert alone.value.grpc_code == "FAILED_PRECONDITION", alone.value
                assert await s.get(keys.broker_topic(A, "ns1", "a")) is not None

                await register(s, B)
                await topic(s, "ns1", "waiting", None)
                await synced(view, s)
                for t in ("waiting", "missing"):
                    with pytest.raises(ApiError) as unassigned:
                        await admin_ops.unload_topic(s, view, "ns1", t)
                    assert unassigned.value.grpc_code == "NOT_FOUND" and "unassigned" in str(unassigned.value)
                with pytest.raises(ApiError) as elsewhere:
                    await admin_ops.unload_topic(s, view, "ns1", "a", from_broker=B)
                assert elsewhere.value.grpc_code == "NOT_FOUND"

                assert await admin_ops.unload_topic(s, view, "ns1", "a") == A
                marker = await s.get(keys.unassigned("ns1", "a"))
                assert marker is not None
                assert load_json(marker.value, "marker") == {"reason": "unload", "from_broker": A}
                assert await s.get(keys.broker_topic(A, "ns1", "a")) is None
                assert view.owner("ns1", "a") is None  # the caller reads its own write
                with pytest.raises(ApiError) as again:
                    await admin_ops.unload_topic(s, view, "ns1", "a")
                assert again.value.grpc_code == "NOT_FOUND"

    run(scenario(), timeout=60)


def test_cluster_admin_unload_compares_the_assignment_it_read(run: Any, store: Any) -> None:
    """The view is stale (its watches paused) while the topic moves from A to B: the first transaction fails
    its compare and changes nothing; once the cache catches up the unload goes to B, the real owner."""

    async def scenario() -> None:
        async with store() as s:
            await register(s, A)
            await register(s, B)
            await namespace(s, "ns1")
            await topic(s, "ns1", "a", A)
            async with cluster_view(s) as view:
                await view.cache._pause_watches()
                await s.delete(keys.broker_topic(A, "ns1", "a"))
                await s.put(keys.broker_topic(B, "ns1", "a"), b"null")
                assert view.owner("ns1", "a") == A

                async def resume() -> None:
                    await asyncio.sleep(0.2)
                    view.cache._resume_watches()

                resumer = asyncio.create_task(resume())
                assert await admin_ops.unload_topic(s, view, "ns1", "a") == B
                await resumer
                marker = await s.get(keys.unassigned("ns1", "a"))
                assert marker is not None and Unassigned.from_json(marker.value) == Unassigned.unload(B)
                assert await _assignments(s) == set(), "the assignment to B is deleted, none to A re-created"

    run(scenario(), timeout=60)


async def _fake_load_manager(s: MetadataStore, view: ClusterView, to: int, *, refuse: set[str],
                             delay: float, seen: list[int]) -> None:
    """Assigns each unloaded topic to broker `to` after `delay` (except those in `refuse`), recording how
    many unload markers were waiting by then."""
    events = view.cache.subscribe(keys.unassigned_prefix())
    try:
        async for event in events:
            if event.type != "put":
                continue
            ns, t = keys.parse_unassigned(event.key)
            await asyncio.sleep(delay)
            seen.append(len(view.unassigned()))
            if t not in refuse:
                assert await assign(s, ns, t, to)
    finally:
        events.close()


def test_cluster_admin_drain_broker(run: Any, store: Any) -> None:
    async def scenario() -> None:
        async with store() as s:
            await _three_brokers(s, {A: [*(f"ns1/t{i}" for i in range(5)), "ns2/other", "ns2/stuck"],
                                     C: ["ns1/elsewhere"]})
            async with cluster_view(s) as view:
                dry = await admin_ops.drain_broker(s, view, A, dry_run=True)
                assert dry == admin_ops.DrainReport(False, 7, 0, 0, 7, ())
                assert await _state(s, A) == BrokerState("active", "boot")
                only = await admin_ops.drain_broker(s, view, A, dry_run=True, namespaces_include=["ns2"])
                assert (only.total, only.pending) == (2, 2)
                but = await admin_ops.drain_broker(s, view, A, dry_run=True, namespaces_exclude=["ns2"])
                assert but.total == 5

                seen: list[int] = []
                manager = asyncio.create_task(_fake_load_manager(s, view, B, refuse={"stuck"}, delay=0.05,
                                                                 seen=seen))
                try:
                    drained = await admin_ops.drain_broker(s, view, A, max_parallel=2, timeout=1.5)
                finally:
                    manager.cancel()
                    await asyncio.gather(manager, return_exceptions=True)
                assert drained == admin_ops.DrainReport(True, 7, 6, 0, 1, ())
                assert await _state(s, A) == BrokerState("draining", "admin_unload")
                assert max(seen) == 2, f"unload markers waiting at once: {seen} (max_parallel 2)"
                assert await _assignments(s) == {(B, "ns1", f"t{i}") for i in range(5)} | {
                    (B, "ns2", "other"), (C, "ns1", "elsewhere")}
                stuck = await s.get(keys.unassigned("ns2", "stuck"))
                assert stuck is not None and Unassigned.from_json(stuck.value) == Unassigned.unload(A)

                # Nothing left: started, nothing to do; the state stays draining.
                empty = await admin_ops.drain_broker(s, view, A, timeout=1)
                assert empty == admin_ops.DrainReport(True, 0, 0, 0, 0, ())

    run(scenario(), timeout=60)


def test_cluster_admin_drain_refusals(run: Any, store: Any) -> None:
    async def scenario() -> None:
        async with store() as s:
            await register(s, A)
            async with cluster_view(s) as view:
                for broker_id, code in ((A, "FAILED_PRECONDITION"), (B, "NOT_FOUND")):
                    with pytest.raises(ApiError) as refused:
                        await admin_ops.drain_broker(s, view, broker_id)
                    assert refused.value.grpc_code == code, refused.value
                await register(s, B, mode="draining")
                await synced(view, s)
                with pytest.raises(ApiError) as no_target:
                    await admin_ops.drain_broker(s, view, A)
                assert no_target.value.grpc_code == "FAILED_PRECONDITION"
                assert "no other active broker" in str(no_target.value)
                assert await _state(s, A) == BrokerState("active", "boot")

    run(scenario(), timeout=60)


def test_cluster_admin_activate_broker(run: Any, store: Any) -> None:
    async def scenario() -> None:
        async with store() as s:
            await register(s, A, mode="draining", reason="admin_unload")
            async with cluster_view(s) as view:
                await admin_ops.activate_broker(s, view, A, "maintenance done")
                assert await _state(s, A) == BrokerState("active", "maintenance done")
                assert view.state(A) == BrokerState("active", "maintenance done")
                await admin_ops.activate_broker(s, view, A)
                assert await _state(s, A) == BrokerState("active", "admin_activate")
                with pytest.raises(ApiError) as unknown:
                    await admin_ops.activate_broker(s, view, B)
                assert unknown.value.grpc_code == "NOT_FOUND"
                assert await s.get(keys.broker_state(B)) is None

                # A stopped broker (no registration) keeps its state and can be activated.
                await s.delete(keys.broker_register(A))
                await s.put(keys.broker_state(A), BrokerState("draining", "x").to_json())
                await synced(view, s)
                await admin_ops.activate_broker(s, view, A, "before restart")
                assert await _state(s, A) == BrokerState("active", "before restart")

    run(scenario(), timeout=60)


def test_cluster_admin_balance_figures() -> None:
    balance = admin_ops.balance_of({A: 4, B: 1, C: 1})
    assert (balance.mean_load, balance.max_load, balance.min_load) == (2.0, 4.0, 1.0)
    assert math.isclose(balance.std_deviation, math.sqrt(2))
    assert math.isclose(balance.coefficient_of_variation, math.sqrt(2) / 2)
    assert [(b.broker_id, b.topic_count, b.is_overloaded, b.is_underloaded) for b in balance.brokers] == [
        (A, 4, True, False), (B, 1, False, True), (C, 1, False, True)]
    # One topic apart is as even as it gets: no flags.
    uneven = admin_ops.balance_of({A: 1, B: 0})
    assert [(b.is_overloaded, b.is_underloaded) for b in uneven.brokers] == [(False, False), (False, False)]
    assert uneven.coefficient_of_variation == 1.0
    assert admin_ops.balance_of({}) == admin_ops.Balance(0.0, 0.0, 0.0, 0.0, 0.0, ())
    assert admin_ops.balance_of({A: 0, B: 0}).coefficient_of_variation == 0.0


def test_cluster_admin_balance_counts_assignments_of_registered_brokers(run: Any, store: Any) -> None:
    async def scenario() -> None:
        async with store() as s:
            # Broker 99's lease expired: it is not part of the balance.
            await _three_brokers(s, {A: ["ns1/a0", "ns1/a1", "ns1/a2"], C: ["ns1/c0"], 99: ["ns1/gone"]})
            await report(s, A, ["/ns1/a0"])  # a lagging report does not count
            async with cluster_view(s) as view:
                balance = admin_ops.cluster_balance(view)
                assert [(b.broker_id, b.load, b.topic_count) for b in balance.brokers] == [
                    (A, 3.0, 3), (B, 0.0, 0), (C, 1.0, 1)]
                assert (balance.mean_load, balance.max_load, balance.min_load) == (4 / 3, 3.0, 0.0)

    run(scenario(), timeout=60)


def test_cluster_admin_topic_records(run: Any, store: Any) -> None:
    async def scenario() -> None:
        async with store() as s:
            await namespace(s, "ns1")
            await topic(s, "ns1", "r", A, DeliveryMode.RELIABLE)
            await topic(s, "ns1", "n", A)
            for sub in ("s2", "s1"):
                record = SubscriptionRecord(None, "c", sub, SubscriptionType.SHARED)
                await s.put(keys.topic_subscription("ns1", "r", sub), record.to_json())
            await s.put(keys.subscription_cursor("ns1", "r", "s1"), SubscriptionCursor(7).to_json())
            await s.put(keys.topic_schema("ns1", "r"), TopicSchemaConfig("orders").to_json())
            names = [("ns1", "r"), ("ns1", "n"), ("ns1", "missing")]
            full = await admin_ops.topic_records(s, names)
            assert full[("ns1", "r")] == admin_ops.TopicRecord(True, DeliveryMode.RELIABLE, ("s1", "s2"),
                                                               TopicSchemaConfig("orders"))
            assert full[("ns1", "n")] == admin_ops.TopicRecord(True, DeliveryMode.NON_RELIABLE, (), None)
            assert full[("ns1", "missing")] == admin_ops.TopicRecord(False, DeliveryMode.NON_RELIABLE, (),
                                                                     None)
            brief = await admin_ops.topic_records(s, names, details=False)
            assert brief[("ns1", "r")] == admin_ops.TopicRecord(True, DeliveryMode.RELIABLE, (), None)
            many = [("ns1", f"t{i}") for i in range(150)]  # more than one transaction's worth
            for ns, t in many[::50]:
                await topic(s, ns, t, A, DeliveryMode.RELIABLE)
            records = await admin_ops.topic_records(s, many, details=False)
            assert len(records) == 150
            assert [t for (_, t), r in records.items() if r.exists] == ["t0", "t50", "t100"]
            assert all(r.delivery is DeliveryMode.RELIABLE for r in records.values() if r.exists)

    run(scenario(), timeout=60)

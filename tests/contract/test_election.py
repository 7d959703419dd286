"""Leader election, the controller epoch and ownership fencing, on both stores; crashes and pauses on etcd.

The in-process tests run over the embedded store and a real etcd (the `store` fixture), on asyncio and uvloop
(the `run` fixture). A killed or paused leader needs a process of its own whose lease lives in a real server,
so those tests (tests/contract/election_leader.py in a subprocess) run against etcd only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from danube_fast.meta import keys
from danube_fast.meta.election import LeaderElection, LeadershipChange, NotLeader, write_with_epoch
from danube_fast.meta.etcd import EtcdStore
from danube_fast.meta.fencing import Ownership, OwnershipLost, fenced_write
from danube_fast.meta.resources_cluster import ClusterLeader, LoadBalanceDecision, Marker
from danube_fast.meta.store import Compare, LeaseNotFound, MetadataStore, Put
from danube_fast.testing.etcd import EtcdServer
from danube_fast.testing.plugin import StoreFactory

TEST_SECONDS = 20
TTL = 2  # etcd's minimum lease TTL with its default election timeout
TAKEOVER_BOUND = 2.5  # seconds past the TTL: etcd's expiry scan (500 ms), a watch event, a campaign
PROMPT = 1.5  # a handover that does not wait for a lease to expire
LEADER = Path(__file__).parent / "election_leader.py"
ROOT = Path(__file__).resolve().parents[2]
OPS = [Put(keys.load_balance(), LoadBalanceDecision({1: ("/ns/t",)}).to_json())]

Check = Callable[[MetadataStore, Callable[..., LeaderElection]], Awaitable[None]]


def contract(run: Callable[..., Any], store: StoreFactory, check: Check) -> None:
    """Run `check(store, elect)`: `elect(broker_id, ttl=TTL)` makes an election that is closed at the end."""
    async def body() -> None:
        async with store() as s, contextlib.AsyncExitStack() as stack:
            def elect(broker_id: int, ttl: int = TTL, **kw: Any) -> LeaderElection:
                election = LeaderElection(s, broker_id, ttl, **kw)
                stack.push_async_callback(election.close)
                return election
            await check(s, elect)

    run(body(), timeout=TEST_SECONDS)


async def eventually(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not true within {timeout} s"
        await asyncio.sleep(0.02)


async def next_change(changes: AsyncIterator[LeadershipChange], timeout: float) -> LeadershipChange:
    return await asyncio.wait_for(anext(changes), timeout)


# one process, both stores --------------------------------------------------------------------------------


def test_one_of_two_contenders_leads(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore, elect: Callable[..., LeaderElection]) -> None:
        a, b = elect(1), elect(2)
        with pytest.raises(TimeoutError):
            await a.wait_leader(0.05)
        await asyncio.gather(a.start(), b.start())
        assert a.is_leader != b.is_leader
        leader, follower = (a, b) if a.is_leader else (b, a)
        kv = await s.get(keys.leader())
        assert kv is not None and ClusterLeader.from_json(kv.value) == ClusterLeader(leader.broker_id)
        assert leader.epoch == kv.create_revision and kv.lease == leader.lease
        assert follower.epoch is None and follower.leader_id() == leader.broker_id == leader.leader_id()
        assert await follower.wait_leader(1) == leader.broker_id

        assert (await leader.write_as_leader(OPS)).succeeded
        with pytest.raises(NotLeader) as caught:
            await follower.write_as_leader(OPS)
        assert not caught.value.retriable and caught.value.grpc_code == "FAILED_PRECONDITION"
        # a failed compare of the caller's own is an outcome, not a lost leadership
        absent = Compare(keys.unassigned("ns", "t"), "version", ">", 0)
        result = await leader.write_as_leader(OPS, extra_compares=[absent])
        assert not result.succeeded and leader.is_leader

    contract(run, store, check)


def test_resign_hands_over_promptly(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore, elect: Callable[..., LeaderElection]) -> None:
        a, b = elect(1, ttl=30), elect(2, ttl=30)  # a TTL far longer than the wait: no lease expires here
        a_changes, b_changes = a.changes(), b.changes()
        await a.start()
        await b.start()
        old = a.epoch
        assert old is not None and await next_change(a_changes, 1) == LeadershipChange(True, old)
        started = time.monotonic()
        await a.resign()
        assert not a.is_leader and await next_change(a_changes, 1) == LeadershipChange(False, old)
        change = await next_change(b_changes, PROMPT)
        assert change.is_leader and change.epoch > old and b.epoch == change.epoch
        assert time.monotonic() - started < PROMPT
        await eventually(lambda: a.leader_id() == 2, PROMPT)
        with pytest.raises(NotLeader):
            await a.write_as_leader(OPS)
        # a resigned broker follows, but does not campaign again
        await b.close()
        await eventually(lambda: a.leader_id() is None, PROMPT)
        await asyncio.sleep(0.2)
        assert not a.is_leader and await s.get(keys.leader()) is None

    contract(run, store, check)


def test_close_revokes_the_lease(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore, elect: Callable[..., LeaderElection]) -> None:
        a, b = elect(1, ttl=30), elect(2, ttl=30)
        a_changes, b_changes = a.changes(), b.changes()
        await a.start()
        await b.start()
        lease, epoch = a.lease, a.epoch
        assert lease is not None and epoch is not None
        started = time.monotonic()
        await a.close()
        with pytest.raises(LeaseNotFound):
            await s.keep_alive(lease)
        assert [c async for c in a_changes] == [LeadershipChange(True, epoch), LeadershipChange(False, epoch)]
        assert a.lease is None and not a.is_leader
        change = await next_change(b_changes, PROMPT)
        assert change.is_leader and change.epoch > epoch and time.monotonic() - started < PROMPT

    contract(run, store, check)


def test_a_lost_lease_steps_down_then_campaigns_anew(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore, elect: Callable[..., LeaderElection]) -> None:
        a = elect(1)
        changes = a.changes()
        await a.start()
        lease, epoch = a.lease, a.epoch
        assert lease is not None and epoch is not None
        await next_change(changes, 1)
        await s.revoke_lease(lease)  # as when the lease expired in the store
        assert await next_change(changes, TTL) == LeadershipChange(False, epoch)
        again = await next_change(changes, TTL)
        assert again.is_leader and again.epoch > epoch and a.lease not in (None, lease)
        kv = await s.get(keys.leader())
        assert kv is not None and kv.create_revision == again.epoch and kv.lease == a.lease

    contract(run, store, check)


def test_the_epoch_fences_a_deposed_leader(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore, elect: Callable[..., LeaderElection]) -> None:
        a = elect(1, ttl=30)
        await a.start()
        old = a.epoch
        assert old is not None
        assert (await write_with_epoch(s, 1, old, OPS)).succeeded
        # the key re-created with the same value: a new epoch, so the old one no longer writes
        await s.delete(keys.leader())
        await s.put(keys.leader(), ClusterLeader(1).to_json())
        new = (await s.get(keys.leader()))
        assert new is not None and new.create_revision > old
        with pytest.raises(NotLeader):
            await write_with_epoch(s, 1, old, OPS)
        assert (await write_with_epoch(s, 1, new.create_revision, OPS)).succeeded
        # the right epoch with the wrong broker
        await s.put(keys.leader(), ClusterLeader(9).to_json())
        with pytest.raises(NotLeader):
            await write_with_epoch(s, 1, new.create_revision, OPS)
        await eventually(lambda: a.leader_id() == 9, PROMPT)
        assert not a.is_leader
        with pytest.raises(NotLeader):
            await a.write_as_leader(OPS)

    contract(run, store, check)


def test_is_leader_is_false_once_the_local_lease_deadline_passes(run: Callable[..., Any],
                                                                 store: StoreFactory) -> None:
    async def check(s: MetadataStore, elect: Callable[..., LeaderElection]) -> None:
        skew = [0.0]
        a = elect(1, ttl=3, clock=lambda: time.monotonic() + skew[0])  # a keep-alive every second
        changes = a.changes()
        await a.start()
        epoch = a.epoch
        assert epoch is not None and await next_change(changes, 1) == LeadershipChange(True, epoch)
        skew[0] = 4.0  # as after a 4 s pause, which the store has not seen (no keep-alive was due)
        assert not a.is_leader and a.epoch is None
        kv = await s.get(keys.leader())
        assert kv is not None and kv.create_revision == epoch  # the store would still take the write...
        with pytest.raises(NotLeader, match="lease may have expired"):
            await a.write_as_leader(OPS)  # ...so this refusal is local
        assert await next_change(changes, 2) == LeadershipChange(False, epoch)  # when the keeper wakes
        again = await next_change(changes, 2)  # it gave up its lease and won with a new one
        assert again.is_leader and again.epoch > epoch and a.is_leader

    contract(run, store, check)


# fencing -------------------------------------------------------------------------------------------------


def test_fenced_write_follows_the_assignment(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore, _elect: Callable[..., LeaderElection]) -> None:
        assignment = keys.broker_topic(1, "ns", "t")
        cursor = [Put(keys.subscription_cursor("ns", "t", "sub"), b"5")]
        await s.put(assignment, Marker().to_json())
        kv = await s.get(assignment)
        assert kv is not None
        revision = kv.create_revision
        assert (await fenced_write(s, assignment, revision, cursor)).succeeded
        await s.put(assignment, Marker().to_json())  # rewritten, not re-created: still the same ownership
        assert (await fenced_write(s, assignment, revision, cursor)).succeeded
        absent = Compare(keys.sealed_state("ns", "t"), "version", ">", 0)
        assert not (await fenced_write(s, assignment, revision, cursor, [absent])).succeeded

        await s.delete(assignment)
        with pytest.raises(OwnershipLost, match="is gone") as caught:
            await fenced_write(s, assignment, revision, cursor)
        assert not caught.value.retriable and caught.value.grpc_code == "FAILED_PRECONDITION"
        await s.put(assignment, Marker().to_json())  # moved away and back: a new ownership
        with pytest.raises(OwnershipLost, match="re-created"):
            await fenced_write(s, assignment, revision, cursor)
        kv = await s.get(assignment)
        assert kv is not None and (await fenced_write(s, assignment, kv.create_revision, cursor)).succeeded

    contract(run, store, check)


def test_ownership_checks_the_lease_deadline(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore, _elect: Callable[..., LeaderElection]) -> None:
        with pytest.raises(OwnershipLost):
            await Ownership.acquire(s, 1, "ns", "t", lambda: time.monotonic() + 10)
        await s.put(keys.broker_topic(1, "ns", "t"), Marker().to_json())
        deadline = [time.monotonic() + 10]
        owner = await Ownership.acquire(s, 1, "ns", "t", lambda: deadline[0])
        cursor = [Put(keys.subscription_cursor("ns", "t", "sub"), b"7")]
        owner.check()
        await owner.revalidate()
        assert (await owner.write(cursor)).succeeded and not owner.lost

        deadline[0] = time.monotonic() - 0.001  # the broker's lease may have expired
        assert owner.lost
        with pytest.raises(OwnershipLost, match="lease may have expired"):
            owner.check()
        with pytest.raises(OwnershipLost):
            await owner.write(cursor)  # refused before the store, which would still take it
        assert (await s.get(owner.key)) is not None

        deadline[0] = time.monotonic() + 10  # renewed; but the assignment goes away
        owner.check()
        await s.delete(owner.key)
        with pytest.raises(OwnershipLost):
            await owner.write(cursor)
        await s.put(owner.key, Marker().to_json())
        with pytest.raises(OwnershipLost, match="is gone"):  # lost for good, even once re-created
            owner.check()

    contract(run, store, check)


# a leader in another process, on etcd --------------------------------------------------------------------


class LeaderProcess:
    """election_leader.py on the test's etcd; its output is read line by line off the event loop."""

    def __init__(self, endpoint: str, broker_id: int, log: Path) -> None:
        self.log = log
        with log.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, str(LEADER), endpoint, str(broker_id), str(TTL)], stdout=subprocess.PIPE,
                stderr=stderr, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.lines: list[str] = []

    async def read_until(self, prefix: str, timeout: float = 10) -> list[str]:
        """The lines up to and including the first that starts with `prefix`."""
        assert self.proc.stdout is not None
        read: list[str] = []
        async with asyncio.timeout(timeout):
            while True:
                line = await asyncio.to_thread(self.proc.stdout.readline)
                assert line, f"the leader process ended: {self.log.read_text()}"
                read.append(line.strip())
                if line.startswith(prefix):
                    self.lines += read
                    return read

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # also ends a stopped process
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


Scene = tuple[EtcdStore, LeaderProcess, int, LeaderElection]


@contextlib.asynccontextmanager
async def leader_elsewhere(etcd: EtcdServer, tmp_path: Path) -> AsyncIterator[Scene]:
    """A store on an emptied etcd, a leader process (broker 1), its epoch, and broker 2's election."""
    s = await EtcdStore.connect([etcd.endpoint])
    proc: LeaderProcess | None = None
    contender = LeaderElection(s, 2, TTL)
    try:
        await s.delete_prefix("/")
        proc = LeaderProcess(etcd.endpoint, 1, tmp_path / "leader.log")
        epoch = int((await proc.read_until("leader "))[-1].split()[1])
        await contender.start()
        assert not contender.is_leader and contender.leader_id() == 1
        yield s, proc, epoch, contender
    finally:
        if proc is not None:
            await asyncio.to_thread(proc.kill)
        await contender.close()
        await s.close()


def test_a_killed_leader_is_replaced_with_a_new_epoch(run: Callable[..., Any], etcd: EtcdServer,
                                                      tmp_path: Path) -> None:
    async def check() -> None:
        async with leader_elsewhere(etcd, tmp_path) as (s, proc, old, contender):
            changes = contender.changes()
            await proc.read_until("tick True ok ok")  # it writes as leader
            proc.proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            change = await next_change(changes, TTL + TAKEOVER_BOUND)
            assert change.is_leader and change.epoch > old and contender.epoch == change.epoch
            assert time.monotonic() - killed < TTL + TAKEOVER_BOUND
            kv = await s.get(keys.leader())
            assert kv is not None and kv.create_revision == change.epoch
            with pytest.raises(NotLeader):
                await write_with_epoch(s, 1, old, OPS)  # what the dead leader's last write would be
            with pytest.raises(NotLeader):
                await write_with_epoch(s, 2, old, OPS)
            assert (await contender.write_as_leader(OPS)).succeeded

    run(check(), timeout=TEST_SECONDS)


def test_a_paused_leader_is_fenced_when_it_resumes(run: Callable[..., Any], etcd: EtcdServer,
                                                   tmp_path: Path) -> None:
    async def check() -> None:
        async with leader_elsewhere(etcd, tmp_path) as (s, proc, old, contender):
            changes = contender.changes()
            await proc.read_until("tick True ok ok")
            proc.proc.send_signal(signal.SIGSTOP)
            change = await next_change(changes, TTL + TAKEOVER_BOUND)
            assert change.is_leader and change.epoch > old

            proc.proc.send_signal(signal.SIGCONT)
            resumed = (await proc.read_until("resumed "))[-1].split()
            # Before any exchange with etcd: it still believes the key names it, yet is_leader is False,
            # because its own clock says the lease may have expired.
            assert resumed[1:3] == ["False", "1"] and float(resumed[3]) < 0, resumed
            tick = (await proc.read_until("tick "))[-1]
            assert tick == "tick False NotLeader NotLeader", tick  # refused locally, and by etcd's compare
            assert (await proc.read_until("tick "))[-1] == "tick False NotLeader NotLeader"
            assert contender.is_leader and contender.epoch == change.epoch
            kv = await s.get(keys.leader())
            assert kv is not None and kv.create_revision == change.epoch
            assert ClusterLeader.from_json(kv.value) == ClusterLeader(2)

    run(check(), timeout=TEST_SECONDS)

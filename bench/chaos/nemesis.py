"""The nemesis: faults at random, each healed after a random while, recorded in the history.

Every `gap` seconds (drawn from GAP) it starts one fault on a target that no fault holds, while fewer than
MAX_ACTIVE are under way. The schedule (which fault, on what, for how long, when) comes from the seed alone
(except that a wipe drawn too soon after the last one, by the clock, is skipped); what the cluster does in
between does not (timing), so a seed replays the same faults, not the same interleaving. heal_all() ends
every fault at once: the campaign calls it before its final read.

Faults: kill -9 and restart of a broker; a wipe (kill -9, its data directory deleted, started again empty:
a machine replaced, which comes back as a new broker; one at a time, and not within WIPE_SPACING_S of the
last one's heal: factor 2 promises to survive one lost machine, not two before the copies are whole again);
SIGSTOP past the lease and SIGCONT; etcd stopped and
restarted;
S3 cut off; a topic unloaded; a broker drained (UnloadBroker, ActivateBroker when healed); and through the
proxy in front of a broker, etcd or S3: a partition (bytes held, not lost: docs/CHAOS.md), a one-way
partition (requests or answers held), a slow link (delay with jitter), connection resets.

Nemesis owns the faults it started; the processes and proxies belong to the ChaosCluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from bench.chaos.history import Fault, History
from bench.chaos.servers import LEASE_TTL_S, READY_TIMEOUT, ChaosCluster, Node
from danube_fast.proto import DanubeAdmin_pb2 as admin_pb
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.testing.process import ServerFailed

GAP = (0.5, 3.0)  # seconds between the starts of two faults
DURATION = (1.5, 6.0)  # seconds a fault lasts
MAX_ACTIVE = 2
WIPE_SPACING_S = 15.0  # after a wipe's heal: the new broker is made a follower and catches up meanwhile
ADMIN_TIMEOUT = 30.0
RESTART_TRIES = 5
ACTIVATE_TRIES = 20  # a second apart: longer than any etcd fault lasts

Heal = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Kind:
    name: str
    weight: int
    targets: str  # "broker", "etcd", "s3", "proxy" (any proxy), "topic"


KINDS = (
    Kind("kill", 3, "broker"), Kind("pause", 2, "broker"), Kind("etcd-restart", 1, "etcd"),
    Kind("s3-cut", 1, "s3"), Kind("unload-topic", 2, "topic"), Kind("drain-broker", 1, "broker"),
    Kind("partition", 2, "proxy"), Kind("one-way", 2, "proxy"), Kind("slow-link", 2, "proxy"),
    Kind("reset", 2, "proxy"),
)
WIPE = Kind("wipe", 2, "broker")  # with replicated topics: without copies it loses the un-uploaded tail


class Nemesis:
    def __init__(self, cluster: ChaosCluster, history: History, topics: list[str], seed: int,
                 wipes: bool = False) -> None:
        self.cluster = cluster
        self.kinds = (*KINDS, WIPE) if wipes else KINDS
        self.history = history
        self.topics = topics  # topics (partitions) that unload-topic picks from
        self.random = random.Random(seed)
        self.errors: list[str] = []  # what went wrong healing a fault (a broker that did not restart)
        self.restart_retries = 0  # broker starts that failed and were tried again
        self.heal_retries = 0  # ActivateBroker calls refused (etcd away) and tried again
        self._active: dict[str, asyncio.Task[None]] = {}  # target -> the task that heals it
        self._wipes_after = 0.0  # loop time before which no wipe starts (one under way, or just healed)
        self._healing = asyncio.Event()

    async def run(self, seconds: float) -> None:
        """Start faults for `seconds`, then return (faults under way keep going until heal_all())."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while not self._healing.is_set():
            await asyncio.sleep(self.random.uniform(*GAP))
            if loop.time() >= end:
                return
            if len(self._active) < MAX_ACTIVE:
                await self._start_one()

    async def heal_all(self) -> None:
        """End every fault now: each one's wait ends and its heal runs (not a cancel: a task cancelled before
        it ran once would skip its heal, and a killed broker would stay down)."""
        self._healing.set()
        await asyncio.gather(*self._active.values(), return_exceptions=True)

    @property
    def started(self) -> int:
        return len(self.history.faults)

    # -- choosing -------------------------------------------------------------------------------------

    async def _start_one(self) -> None:
        kind = self.random.choices(self.kinds, [k.weight for k in self.kinds])[0]
        target = self._pick_target(kind)
        duration = self.random.uniform(*DURATION)
        if target is None or (kind is WIPE and asyncio.get_running_loop().time() < self._wipes_after):
            return
        if kind is WIPE:
            self._wipes_after = float("inf")  # until this one is healed, then WIPE_SPACING_S more
        try:
            heal, detail = await self._inject(kind.name, target, duration)
        except Exception as e:  # a fault that could not be started (an admin call refused): recorded
            self.history.faults.append(Fault(kind.name, target, self.history.now(), self.history.now(),
                                             f"not started: {e}"))
            return
        index = len(self.history.faults)
        self.history.faults.append(Fault(kind.name, target, self.history.now(), None, detail))
        self._active[target] = asyncio.create_task(self._hold(target, index, duration, heal))

    def _pick_target(self, kind: Kind) -> str | None:
        if kind.targets == "topic":
            return "topic " + self.random.choice(self.topics)
        if kind.targets == "broker":
            names = [n.name for n in self.cluster.nodes]
        elif kind.targets == "proxy":
            names = list(self.cluster.proxies())
        else:
            names = [kind.targets]
        free = [n for n in names if n not in self._active]  # a broker's process and proxy are one target
        return self.random.choice(free) if free else None

    async def _hold(self, target: str, index: int, duration: float, heal: Heal | None) -> None:
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._healing.wait(), duration)
            if heal is not None:
                await heal()
        except Exception as e:
            self.errors.append(f"healing {self.history.faults[index].kind} on {target}: {e}")
        finally:
            f = self.history.faults[index]
            self.history.faults[index] = Fault(f.kind, f.target, f.started, self.history.now(), f.detail)
            self._active.pop(target, None)
            if f.kind == WIPE.name:
                self._wipes_after = asyncio.get_running_loop().time() + WIPE_SPACING_S

    # -- the faults -----------------------------------------------------------------------------------

    async def _inject(self, kind: str, target: str, duration: float) -> tuple[Heal | None, str]:
        """Start fault `kind` on `target`; returns what heals it and a detail for the history."""
        if kind == "unload-topic":
            topic = target.removeprefix("topic ")
            await self._admin("TopicAdmin", "UnloadTopic", admin_pb.TopicRequest(name=topic))
            return None, ""
        if target.startswith("broker") and kind in ("kill", "wipe", "pause", "drain-broker"):
            node = self._node(target)
            if kind in ("kill", "wipe"):
                node.broker.kill()
                if kind == "wipe":
                    await asyncio.to_thread(shutil.rmtree, node.broker.data_dir, True)
                return lambda: self._restart(node), ""
            if kind == "pause":
                duration = max(duration, LEASE_TTL_S + 1.5)  # past the lease: it loses its topics
                os.kill(node.broker.pid, signal.SIGSTOP)
                return lambda: _sigcont(node), f"{duration:.1f} s"
            await self._admin("BrokerAdmin", "UnloadBroker", admin_pb.UnloadBrokerRequest(
                broker_id=str(node.broker.broker_id), timeout_seconds=30), avoid=node)
            return lambda: self._activate(node), ""
        if kind == "etcd-restart":
            await asyncio.to_thread(self.cluster.etcd.stop)
            return lambda: asyncio.to_thread(self.cluster.etcd.start), ""
        proxy = self.cluster.proxies()["s3" if kind == "s3-cut" else target]
        if kind == "s3-cut":
            await asyncio.to_thread(proxy.cut)
        elif kind == "partition":
            await asyncio.to_thread(proxy.stall)
        elif kind == "one-way":
            direction = self.random.choice(("to_server", "to_client"))
            await asyncio.to_thread(proxy.one_way, direction)  # type: ignore[arg-type]
            return lambda: asyncio.to_thread(proxy.pass_through), direction
        elif kind == "slow-link":
            delay, jitter = self.random.uniform(0.01, 0.3), self.random.uniform(0, 0.2)
            await asyncio.to_thread(proxy.delay, delay, jitter)
            detail = f"{delay * 1000:.0f} ms + up to {jitter * 1000:.0f}"
            return lambda: asyncio.to_thread(proxy.pass_through), detail
        elif kind == "reset":
            count = await asyncio.to_thread(proxy.reset)
            return None, f"{count} connections"
        return lambda: asyncio.to_thread(proxy.pass_through), ""

    def _node(self, name: str) -> Node:
        return next(n for n in self.cluster.nodes if n.name == name)

    async def _restart(self, node: Node) -> None:
        """Start the broker again, as a supervisor would: a start that fails because another fault is under
        way (a broker exits when etcd is unreachable at start) is tried again, up to RESTART_TRIES times."""
        for attempt in range(1, RESTART_TRIES + 1):
            node.broker.launch()  # from the loop's thread: the kernel kills it when this thread ends
            try:
                await asyncio.to_thread(node.broker.wait_ready, READY_TIMEOUT)
                return
            except ServerFailed as e:
                if attempt == RESTART_TRIES:
                    self.errors.append(f"{node.name} did not restart in {RESTART_TRIES} tries: "
                                       f"{str(e)[:300]} ... {str(e)[-2000:]}")
                    raise
                self.restart_retries += 1
                await asyncio.sleep(1.0)

    async def _activate(self, node: Node) -> None:
        """End a drain, as an operator would: an ActivateBroker refused because another fault is under way
        (etcd cut off: the broker cannot write the state) is tried again, up to ACTIVATE_TRIES times."""
        request = admin_pb.ActivateBrokerRequest(broker_id=str(node.broker.broker_id), reason="chaos heal")
        for attempt in range(1, ACTIVATE_TRIES + 1):
            try:
                await self._admin("BrokerAdmin", "ActivateBroker", request)
                return
            except RuntimeError:
                if attempt == ACTIVATE_TRIES:
                    raise
                self.heal_retries += 1
                await asyncio.sleep(1.0)

    async def _admin(self, service: str, method: str, request: object, avoid: Node | None = None) -> None:
        """Call the admin API of a running broker (not paused, not `avoid`), straight, not through a proxy;
        the next one on UNAVAILABLE."""
        candidates = [n for n in self.cluster.nodes
                      if n.broker.running and n is not avoid and n.name not in self._active]
        if not candidates:
            raise RuntimeError("no broker to ask")
        error: Exception | None = None
        for node in candidates:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{node.broker.admin_port}") as channel:
                stub = getattr(admin_grpc, f"{service}Stub")(channel)
                try:
                    await getattr(stub, method)(request, timeout=ADMIN_TIMEOUT)
                    return
                except grpc.aio.AioRpcError as e:
                    error = e
                    if e.code() != grpc.StatusCode.UNAVAILABLE:
                        break
        raise RuntimeError(f"{service}.{method}: {error}")


async def _sigcont(node: Node) -> None:
    os.kill(node.broker.pid, signal.SIGCONT)

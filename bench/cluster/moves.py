"""Producer-visible unavailability while a topic moves between the brokers of a cluster.

A producer sends to a Reliable topic without pause while this module moves the topic again and again, as
`danube-fast admin topics unload` does: one etcd transaction puts `/cluster/unassigned/{ns}/{t}` =
{"reason": "unload", "from_broker": owner} and deletes the owner's assignment. The old owner seals the topic
(stops admitting, drains its uploader into the object tier, writes the sealed state), the leader's load
manager assigns it to another broker, that broker loads it, and the producer finds it there.

Per move, the figure is the **longest interval without an acknowledged batch around the move**: from the
last ack received at or before the unload to the first ack received after the new assignment was seen,
the largest gap between consecutive acks. A watch on etcd stamps, on arrival here, when the old owner sealed
(`state` put with `sealed: true`), when the topic was assigned, and when the new owner wrote its offset
reservation (it has loaded the topic), so each move's time splits into seal, assign, load and reconnect.

Lost acks: every send must resolve with offsets, and the offsets acknowledged, taken in send order, must
continue each other exactly across all moves (a hole means a batch was written twice or skipped).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from danube_fast.meta import keys
from danube_fast.meta.resources import ObjectDescriptor, SealedState, Unassigned
from danube_fast.meta.store import Compare, Delete, MetadataStore, Put

MOVE_TIMEOUT = 30.0  # seconds a move may take before the run fails with the brokers' logs
FIRST_OWNER_TIMEOUT = 30.0
RECORD_BYTES = 256
BATCH_RECORDS = 100
IN_FLIGHT = 8  # batches our producer keeps unacknowledged at most
LINGER_MS = 1.0
PAUSE = 0.5  # seconds of steady traffic before and after every move

SendLoop = Callable[["Acks", asyncio.Event], Coroutine[Any, Any, None]]  # sends until the event is set


@dataclass
class Move:
    source: int
    target: int
    gap_ms: float  # the figure
    seal_ms: float | None  # unload -> sealed state seen (the old owner stopped and drained)
    assign_ms: float | None  # unload -> new assignment seen
    load_ms: float | None  # unload -> the new owner's reservation seen (topic loaded)
    first_ack_ms: float  # unload -> first ack after the assignment
    drained_bytes: int  # object bytes the old owner uploaded between the unload and its seal

    def as_json(self) -> dict[str, object]:
        return {k: round(v, 1) if isinstance(v, float) else v for k, v in self.__dict__.items()}


class Timeline:
    """The topic's assignment and storage keys as this process sees them change (stamped on arrival)."""

    def __init__(self, store: MetadataStore, topic: str) -> None:
        self.store = store
        self.ns, self.t = keys.split_topic_name(topic)
        self.owner: int | None = None
        self.events: list[tuple[float, str, int]] = []  # (perf_counter, kind, broker or bytes)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for kv in await self.store.get_prefix(keys.brokers_prefix()):
            self._assignment(kv.key, present=True)
        self._tasks = [asyncio.create_task(self._follow(keys.brokers_prefix())),
                       asyncio.create_task(self._follow(keys.storage_topic_prefix(self.ns, self.t)))]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _follow(self, prefix: str) -> None:
        async for event in self.store.watch_prefix(prefix):
            if event.key.startswith(keys.brokers_prefix()):
                self._assignment(event.key, present=event.type == "put")
            elif event.type == "put" and event.key == keys.sealed_state(self.ns, self.t):
                state = SealedState.from_json(event.value, key=event.key)
                self.events.append((time.perf_counter(), "sealed" if state.sealed else "reserved",
                                    state.broker_id))
            elif event.type == "put" and event.key.startswith(keys.objects_prefix(self.ns, self.t)) \
                    and not event.key.endswith("/cur"):
                size = ObjectDescriptor.from_json(event.value, key=event.key).size
                self.events.append((time.perf_counter(), "object", size))

    def _assignment(self, key: str, present: bool) -> None:
        with contextlib.suppress(ValueError):
            broker, ns, t = keys.parse_broker_topic(key)
            if (ns, t) == (self.ns, self.t):
                self.owner = broker if present else None
                if present:
                    self.events.append((time.perf_counter(), "assigned", broker))

    def first(self, kind: str, after: float, broker: int | None = None) -> float | None:
        return next((t for t, k, b in self.events if k == kind and t >= after and broker in (None, b)), None)

    def drained(self, start: float, end: float) -> int:
        return sum(n for t, k, n in self.events if k == "object" and start <= t <= end)


async def unload(store: MetadataStore, topic: str, owner: int) -> None:
    """What `danube-fast admin topics unload` writes (danube_fast.broker.cluster.admin.ops.unload_topic)."""
    ns, t = keys.split_topic_name(topic)
    key = keys.broker_topic(owner, ns, t)
    done = await store.transaction([Compare(key, "version", ">", 0)],
                                   [Put(keys.unassigned(ns, t), Unassigned.unload(owner).to_json()),
                                    Delete(key)], [])
    if not done.succeeded:
        raise RuntimeError(f"unloading {topic} from broker {owner}: its assignment was gone already")


@dataclass
class Acks:
    """Every send's outcome: ack arrival times (in arrival order) and offsets per send, failures."""

    times: list[float] = field(default_factory=list)
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    failures: list[tuple[int, str]] = field(default_factory=list)
    sent: int = 0
    acked: int = 0
    rejected: int = 0  # futures failed with a retriable rejection, sent again (fast_sender)
    reopens: int = 0

    def ack(self, index: int, offsets: tuple[int, int] | None) -> None:
        self.times.append(time.perf_counter())
        self.acked += 1
        if offsets is not None:
            self.offsets[index] = offsets

    def gap(self, unloaded: float, assigned: float) -> tuple[float, float] | None:
        """(longest interval between consecutive acks from the last one at or before `unloaded` to the first
        after `assigned`, that first ack's time), or None while there is no ack after `assigned`."""
        first = bisect.bisect_right(self.times, assigned)
        if first >= len(self.times):
            return None
        window = self.times[max(0, bisect.bisect_right(self.times, unloaded) - 1):first + 1]
        return max(b - a for a, b in itertools.pairwise(window)), self.times[first]

    def check(self) -> dict[str, int]:
        """Lost, unresolved and out-of-sequence acknowledgements, over the whole run."""
        holes = overlaps = 0
        previous: int | None = None
        for i in sorted(self.offsets):
            first, last = self.offsets[i]
            if previous is not None and first != previous + 1:
                holes += first > previous + 1
                overlaps += first <= previous
            previous = last
        failed = len(self.failures)
        return {"sent": self.sent, "acked": self.acked, "failed": failed,
                "unresolved": self.sent - self.acked - failed, "holes": holes, "overlaps": overlaps,
                "rejected": self.rejected, "reopens": self.reopens}


async def move_once(store: MetadataStore, timeline: Timeline, acks: Acks, topic: str,
                    sender: asyncio.Task[None]) -> Move:
    source = timeline.owner
    if source is None:
        raise RuntimeError(f"{topic} has no owner to move it from")
    unloaded = time.perf_counter()
    await unload(store, topic, source)
    deadline = unloaded + MOVE_TIMEOUT
    while True:
        assigned = timeline.first("assigned", unloaded)
        target = timeline.owner
        if assigned is not None and target is not None and target != source:
            found = acks.gap(unloaded, assigned)
            if found is not None:
                break
        if sender.done():
            await sender  # raises what stopped it
            raise RuntimeError("the producer stopped during a move")
        if time.perf_counter() > deadline:
            raise TimeoutError(f"moving {topic} from broker {source}: owner {target}, {len(acks.times)} acks "
                               f"and {len(acks.failures)} failed sends (the first: {acks.failures[:1]}), no "
                               f"ack after a new assignment within {MOVE_TIMEOUT} s")
        await asyncio.sleep(0.005)
    gap, first_ack = found
    sealed = timeline.first("sealed", unloaded, source)
    loaded = timeline.first("reserved", unloaded, target)

    def since(t: float | None) -> float | None:
        return None if t is None else (t - unloaded) * 1000

    return Move(source, target, gap * 1000, since(sealed), since(assigned), since(loaded),
                (first_ack - unloaded) * 1000, timeline.drained(unloaded, sealed or assigned))


async def moves_under_traffic(store: MetadataStore, topic: str, moves: int, pause: float,
                              send_loop: SendLoop,
                              progress: Callable[[str], None]) -> tuple[list[Move], Acks, float]:
    """Start `send_loop`, move the topic `moves` times, stop it; (moves, acks, seconds of traffic)."""
    acks = Acks()
    stop = asyncio.Event()
    timeline = Timeline(store, topic)
    await timeline.start()
    sender = asyncio.create_task(send_loop(acks, stop))
    started = time.perf_counter()
    done: list[Move] = []
    try:
        while timeline.owner is None or not acks.times:
            if sender.done():
                await sender  # raises what stopped it
                raise RuntimeError("the producer stopped before the first move")
            if time.perf_counter() - started > FIRST_OWNER_TIMEOUT:
                raise TimeoutError(f"{topic}: no owner and ack within {FIRST_OWNER_TIMEOUT} s")
            await asyncio.sleep(0.01)
        await asyncio.sleep(pause)
        for i in range(moves):
            move = await move_once(store, timeline, acks, topic, sender)
            done.append(move)
            progress(f"move {i + 1}/{moves}: broker {move.source} -> {move.target}, no ack for "
                     f"{move.gap_ms:.0f} ms (sealed +{_ms(move.seal_ms)}, assigned +{_ms(move.assign_ms)}, "
                     f"loaded +{_ms(move.load_ms)}, first ack +{move.first_ack_ms:.0f} ms; drained "
                     f"{move.drained_bytes / 1e6:.1f} MB)")
            await asyncio.sleep(pause)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(sender, MOVE_TIMEOUT)
        await timeline.close()
    return done, acks, time.perf_counter() - started


def _ms(x: float | None) -> str:
    return "?" if x is None else f"{x:.0f}"


def fast_sender(target: str, topic: str, rate: float) -> SendLoop:
    """Our FastProducer: batches of BATCH_RECORDS records, at most IN_FLIGHT unacknowledged, as fast as
    acks come (or paced at `rate` records/s when > 0); at the end waits for every outstanding send.

    A send whose future fails with a *retriable* ProduceRejected is counted (`Acks.rejected`) and sent again,
    in order, on a producer opened anew. FastProducer follows a move by itself (an UNAVAILABLE rejection
    makes it look the topic up and resend), so `rejected` and `reopens` stay 0; this path only keeps the
    figures measurable, and visible as a failed target in RESULTS.md, should that ever regress."""
    from danube_fast.client import FastProducer

    async def connect() -> FastProducer:
        return await FastProducer.connect(target, topic, "bench-mover", reliable=True,
                                          batch_records=BATCH_RECORDS, linger_ms=LINGER_MS)

    async def run(acks: Acks, stop: asyncio.Event) -> None:
        producer = await connect()
        window = asyncio.Semaphore(IN_FLIGHT)
        payloads = [b"r" * RECORD_BYTES] * BATCH_RECORDS
        pending: set[asyncio.Future[tuple[int, int]]] = set()
        again: list[int] = []  # sends rejected as retriable, to send once more after reopening

        def settled(index: int, fut: asyncio.Future[tuple[int, int]]) -> None:
            window.release()
            pending.discard(fut)
            error = asyncio.CancelledError() if fut.cancelled() else fut.exception()
            if error is None:
                acks.ack(index, fut.result())
            elif getattr(error, "retriable", False):
                acks.rejected += 1
                again.append(index)
            else:
                acks.failures.append((index, repr(error)))

        async def send(index: int) -> None:
            await window.acquire()
            fut = await producer.send_batch(payloads)
            pending.add(fut)
            fut.add_done_callback(lambda f: settled(index, f))

        try:
            began = time.perf_counter()
            while not stop.is_set() or pending or again:
                if again:
                    await asyncio.gather(*pending, return_exceptions=True)  # the old stream's last answers
                    await producer.close()
                    producer = await connect()
                    acks.reopens += 1
                    retry = sorted(again)
                    again.clear()
                    for index in retry:
                        await send(index)
                elif stop.is_set():
                    await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                else:
                    if rate > 0:
                        await asyncio.sleep(began + acks.sent * BATCH_RECORDS / rate - time.perf_counter())
                    acks.sent += 1
                    await send(acks.sent - 1)
        finally:
            await producer.close()

    return run


def official_sender(url: str, topic: str) -> SendLoop:
    """The official danube-client: one `Producer.send` at a time (its API is one unary call per message);
    it returns no offsets, so only failures and unresolved sends are checked."""
    from danube import DanubeClientBuilder, DispatchStrategy

    from bench.broker import close_client

    async def run(acks: Acks, stop: asyncio.Event) -> None:
        client: Any = await DanubeClientBuilder().service_url(url).build()
        producer = client.new_producer().with_topic(topic).with_name("bench-official") \
            .with_dispatch_strategy(DispatchStrategy.RELIABLE).build()
        await producer.create()
        payload = b"r" * RECORD_BYTES
        try:
            while not stop.is_set():
                index = acks.sent
                acks.sent += 1
                try:
                    await producer.send(payload)
                except Exception as e:
                    acks.failures.append((index, repr(e)))
                    raise
                acks.ack(index, None)
        finally:
            with contextlib.suppress(Exception):
                await producer.close()
            await close_client(client)

    return run

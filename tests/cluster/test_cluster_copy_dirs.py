"""A follower's copy directory has one user at a time (cluster/replication/follower.py): a retirement under
way (its records uploading to fill the dead owner's gap) and a take, or a new fetch task, of the same copy
used to open its WAL at once. Two recoveries of one directory cut and remap each other's files, and a
broker restarted after kill -9 died of SIGBUS that way in `bench replication`.

The overlap needs a retirement held open at a chosen moment, which real brokers cannot give on demand, so
`Copies` runs here over a stand-in for the cache and the cluster view and an Orphans whose upload waits
for the test; the store and the WALs are real."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from danube_fast.broker.cluster.replication.follower import META, Copies
from danube_fast.broker.config import BrokerConfig
from danube_fast.codec import frames
from danube_fast.meta import keys
from danube_fast.meta.resources import SealedState
from danube_fast.names import TopicName
from danube_fast.storage import WalConfig
from danube_fast.storage.wal import Wal

Run = Callable[..., Any]
ME, DEAD = 7, 5
NAME = TopicName("ns", "t")


class Cache:
    """No replicas key names this broker: every copy on disk is a stray."""

    def get_prefix(self, prefix: str) -> list[Any]:
        return []

    def subscribe(self, prefix: str) -> AsyncIterator[None]:
        async def never() -> AsyncIterator[None]:
            await asyncio.Event().wait()
            yield None
        return never()


class SlowOrphans:
    """Opens the copy's WAL as the real recovery does, then waits for the test before it finishes."""

    broker_id = ME

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.finish = asyncio.Event()

    async def recover_copy(self, name: TopicName, directory: str, of: int, complete: bool) -> None:
        wal = await Wal.open(directory, WalConfig())
        try:
            self.opened.set()
            await self.finish.wait()
        finally:
            await wal.close()


async def a_copy(root: Path) -> Path:
    """A copy of broker DEAD's term 1 with three records, as a restarted follower finds it."""
    directory = root / "replicas" / NAME.namespace / NAME.topic
    wal = await Wal.open(directory / "log", WalConfig())
    await wal.append(frames.encode_payloads([b"r0", b"r1", b"r2"]))
    await wal.close()
    (directory / META).write_text(json.dumps({"owner": DEAD, "epoch": 1}))
    return directory


def test_a_take_waits_for_the_retirement_of_the_same_copy(store: Any, run: Run, tmp_path: Path) -> None:
    """The start retires a stray copy; the load manager then gives this broker the topic and the reconciler
    takes the copy while the retirement still uploads it. The take waits for the retirement (which deletes
    the copy) instead of opening the same WAL beside it, and finds nothing to take."""
    async def body() -> None:
        async with store() as s:
            directory = await a_copy(tmp_path)
            orphans = SlowOrphans()
            view = SimpleNamespace(owner=lambda ns, t: None, replicas=lambda ns, t: None)
            copies = Copies(BrokerConfig(data_dir=str(tmp_path)), s, Cache(), view,  # type: ignore[arg-type]
                            SimpleNamespace(), orphans)  # type: ignore[arg-type]
            await copies.start()
            try:
                await asyncio.wait_for(orphans.opened.wait(), 10)
                take = asyncio.create_task(copies.take(NAME))
                await asyncio.sleep(0.3)
                assert not take.done(), "the take went ahead while the copy was being retired"
                orphans.finish.set()
                assert await asyncio.wait_for(take, 10) is None
                assert not directory.exists()
            finally:
                orphans.finish.set()
                await copies.close()

    run(body())


def test_a_take_cancels_a_retirement_waiting_for_the_next_owner(store: Any, run: Run, tmp_path: Path) -> None:
    """A stray copy's retirement waits (up to 30 s) for the next owner to record where it starts before it
    fills the dead owner's gap. When that next owner is this broker, its take cancels the wait and gets
    the copy at once (a move's load waited 0.2-0.25 s for the retirement's poll), and nothing is deleted."""
    async def body() -> None:
        async with store() as s:
            directory = await a_copy(tmp_path)
            # DEAD's reservation is still the state: the next owner has not written its own yet.
            state = SealedState(False, 2, DEAD, 1)
            await s.put(keys.sealed_state(NAME.namespace, NAME.topic), state.to_json())
            orphans = SlowOrphans()
            orphans.finish.set()
            view = SimpleNamespace(owner=lambda ns, t: None, replicas=lambda ns, t: None)
            copies = Copies(BrokerConfig(data_dir=str(tmp_path)), s, Cache(), view,  # type: ignore[arg-type]
                            SimpleNamespace(), orphans)  # type: ignore[arg-type]
            await copies.start()
            try:
                await asyncio.sleep(0.3)  # the retirement polls the state key meanwhile
                assert not orphans.opened.is_set()
                taken = await asyncio.wait_for(copies.take(NAME), 2)
                assert taken is not None and (taken.owner, taken.epoch, taken.end) == (DEAD, 1, 3)
                assert (directory / "log").is_dir() and not orphans.opened.is_set()
            finally:
                await copies.close()

    run(body())

"""The reconciler hears that a topic's assignment is gone while this broker's DeleteTopic of it still runs
(the delete's own transaction removed the assignment). It waits for the delete (TopicRegistry.settled)
instead of unloading the topic under it as a lost ownership: that closed the topic's storage a second time,
told its producers it had moved (UNAVAILABLE, not NOT_FOUND) and recovered its WAL into the objects of a
topic being deleted.

The window (between the delete's transaction and its end) cannot be hit on demand with real brokers, so the
Reconciler runs over stand-ins for the cache, the store and the registry, as in test_cluster_orphans.py;
the registry's side (`settled`, one delete at a time) is tests/broker/test_topic_delete.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from danube_fast.broker.cluster.reconciler import Reconciler
from danube_fast.names import TopicName
from danube_fast.storage import WalConfig
from danube_fast.storage.log_manager import LogManager

Run = Callable[..., Any]
ME = 7


class Registry:
    """The registry while a delete of `topic` runs: it finds the topic until the delete ends."""

    def __init__(self, topic: object) -> None:
        self.topic: object | None = topic
        self.deleted = asyncio.Event()
        self.unloaded: list[object] = []

    def find(self, full: str) -> object | None:
        return self.topic

    def forget_broken(self, name: TopicName) -> None:
        pass

    async def settled(self, name: TopicName) -> None:
        await self.deleted.wait()

    async def unload_topic(self, topic: object, seal: object) -> None:
        self.unloaded.append(topic)


async def turns(n: int = 20) -> None:
    """Let the loop run what is ready: the stand-ins do no I/O, so a few turns reach every await."""
    for _ in range(n):
        await asyncio.sleep(0)


class Store:
    async def get(self, key: str) -> None:
        return None


def test_a_reconcile_during_a_delete_waits_for_it_and_unloads_nothing(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal_root = tmp_path / "wal"
        directory = wal_root / "default" / "t"
        directory.mkdir(parents=True)
        topic = SimpleNamespace(full="/default/t", name=TopicName("default", "t"), gone="deleted")
        registry = Registry(topic)
        recovered: list[str] = []

        async def recover(name: TopicName, where: str) -> None:
            recovered.append(name.full)

        async def loaded(t: object) -> None:
            pass

        reconciler = Reconciler(
            SimpleNamespace(wal_root=str(wal_root)), Store(), SimpleNamespace(get=lambda key: None),  # type: ignore[arg-type]
            registry, LogManager(str(wal_root), WalConfig()), SimpleNamespace(broker_id=ME),  # type: ignore[arg-type]
            SimpleNamespace(changed=lambda: None), None, recover, loaded, None, None)  # type: ignore[arg-type]
        reconciling = asyncio.create_task(reconciler._reconcile("default", "t"))
        await turns()
        assert not reconciling.done() and registry.unloaded == []  # waiting for the delete
        registry.topic = None  # the delete ends: the topic and its WAL are gone
        directory.rmdir()
        registry.deleted.set()
        await asyncio.wait_for(reconciling, 5)
        await turns()  # an orphan recovery it started would have run by now
        assert registry.unloaded == [] and recovered == []
        await reconciler.close()

    run(main(), timeout=20)

"""Fixtures of the cluster tests: the contract suite's real etcd server and its `store` factory (a fresh
embedded or etcd store per test), reused so that every metadata test runs on both stores; the tier suite's
moto S3 server; and `cluster`, broker processes on that etcd."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_procs import Cluster

from danube_fast.meta.etcd import EtcdStore


def _sibling_conftest(suite: str) -> Any:
    """Another suite's conftest.py as a module (its fixtures are reused here, not copied)."""
    spec = importlib.util.spec_from_file_location(
        f"{suite}_fixtures", Path(__file__).resolve().parent.parent / suite / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_contract = _sibling_conftest("contract")
etcd_server = _contract.etcd_server
etcd = _contract.etcd
store = _contract.store

# The object tier suite's moto S3 server (a real S3 endpoint on loopback that can be taken down and back).
moto_server = _sibling_conftest("tier").moto_server


@pytest.fixture
def cluster(etcd: Any, tmp_path: Path) -> Iterator[Cluster]:
    """Brokers on the session's etcd, emptied first (the key layout is global), and a shared folder as the
    object store."""
    async def wipe() -> None:
        s = await EtcdStore.connect([etcd.endpoint])
        try:
            await s.delete_prefix("/")
        finally:
            await s.close()

    asyncio.run(wipe())
    c = Cluster(tmp_path, f"etcd://{etcd.endpoint}", str(tmp_path / "objects"))
    try:
        yield c
    finally:
        c.close()

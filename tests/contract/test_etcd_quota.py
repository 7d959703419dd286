"""etcd out of space: past its backend quota etcd raises its NOSPACE alarm and refuses every write. The store
answers MetadataStoreFull (UNAVAILABLE, retriable) while reads and deletes still work, and once the operator
has freed space (compact, defragment, disarm the alarm) the same store writes again, nothing committed lost.

Its own etcd, with a 1 MiB quota: the session's server must not be left in alarm.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aetcd
import grpc
import pytest
from aetcd import rpc

from danube_fast.meta.etcd import EtcdStore
from danube_fast.meta.store import KeyValue, MetadataError, MetadataStoreFull
from danube_fast.testing.etcd import EtcdServer, start_etcd

pytestmark = pytest.mark.etcd

QUOTA = 1 << 20
VALUE = b"q" * 200_000
MAX_PUTS = 500  # about 70 fill the quota (etcd 3.4.23): the bound only keeps a broken test from running long
TEST_SECONDS = 20


@pytest.fixture
def small_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    server = start_etcd(tmp_path / "etcd" / "data", extra_args=[f"--quota-backend-bytes={QUOTA}"])
    try:
        yield server
    finally:
        server.stop()


async def free_space(endpoint: str, revision: int) -> None:
    """An operator's answer to the NOSPACE alarm (etcd's maintenance guide): compact, defragment, disarm."""
    host, _, port = endpoint.rpartition(":")
    client = aetcd.Client(host, int(port))
    await client.connect()
    try:
        await client.compact(revision, physical=True)
        await client.defragment()
        raised = await client.maintenancestub.Alarm(rpc.AlarmRequest(action=rpc.AlarmRequest.GET))
        for alarm in raised.alarms:
            await client.maintenancestub.Alarm(rpc.AlarmRequest(
                action=rpc.AlarmRequest.DEACTIVATE, memberID=alarm.memberID, alarm=alarm.alarm))
    finally:
        await client.close()


def test_full_quota_fails_writes_retriably_and_etcd_recovers(run: Callable[..., Any],
                                                            small_etcd: EtcdServer) -> None:
    async def check() -> None:
        s = await EtcdStore.connect([small_etcd.endpoint])
        try:
            kept = await s.put("/keep", b"kept")
            with pytest.raises(MetadataError) as raised:
                for i in range(MAX_PUTS):
                    await s.put(f"/fill/{i % 4}", VALUE)
            e = raised.value
            assert isinstance(e, MetadataStoreFull)
            assert (e.retriable, e.grpc_code) == (True, "UNAVAILABLE")
            assert "quota is full" in str(e), str(e)
            assert isinstance(e.__cause__, grpc.aio.AioRpcError)
            assert e.__cause__.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

            # the alarm refuses every write, however small, until an operator disarms it
            with pytest.raises(MetadataStoreFull):
                await s.put("/small", b"x")
            with pytest.raises(MetadataStoreFull):
                await s.grant_lease(5)
            assert await s.get("/keep") == KeyValue("/keep", b"kept", kept, kept, 1)
            assert await s.delete_prefix("/fill/") == 4

            await free_space(small_etcd.endpoint, await s.current_revision())
            after = await s.put("/small", b"x")
            assert after > kept
            assert await s.get("/keep") == KeyValue("/keep", b"kept", kept, kept, 1)
        finally:
            await s.close()

    run(check(), timeout=TEST_SECONDS)

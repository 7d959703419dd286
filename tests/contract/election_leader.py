"""A leader in a process of its own, for the kill and pause tests of test_election.py.

    python election_leader.py ENDPOINT BROKER_ID TTL_SECONDS

Campaigns against the etcd at ENDPOINT and prints "leader EPOCH" once it leads. Then every 100 ms it prints
"tick IS_LEADER LOCAL SERVER": IS_LEADER is `election.is_leader`; LOCAL the outcome of a
`write_as_leader` ("ok" or the error's class name); SERVER the outcome of `write_with_epoch` with the epoch
it first led, which skips the local check, so that only etcd's compare can refuse it.

On SIGCONT the signal handler reads `is_leader`, `leader_id()` and the time left to the lease deadline; the
next line is "resumed IS_LEADER LEADER_ID SECONDS_LEFT". A Python signal handler runs as soon as the
interrupted epoll returns, before the event loop runs anything, so these are the broker's beliefs before it
has exchanged a byte with etcd after the pause.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Awaitable
from types import FrameType

from danube_fast.meta import keys
from danube_fast.meta.election import LeaderElection, write_with_epoch
from danube_fast.meta.etcd import EtcdStore
from danube_fast.meta.resources_cluster import LoadBalanceDecision
from danube_fast.meta.store import MetadataError, Put

TICK_SECONDS = 0.1


async def outcome(write: Awaitable[object]) -> str:
    try:
        await write
    except MetadataError as e:
        return type(e).__name__
    return "ok"


async def main(endpoint: str, broker_id: int, ttl: int) -> None:
    store = await EtcdStore.connect([endpoint])
    election = LeaderElection(store, broker_id, ttl)
    changes = election.changes()
    await election.start()
    while not election.is_leader:
        await anext(changes)
    epoch = election.epoch
    assert epoch is not None
    resumed: list[str] = []

    def on_sigcont(_signum: int, _frame: FrameType | None) -> None:
        left = election.lease_deadline - time.monotonic()
        resumed.append(f"resumed {election.is_leader} {election.leader_id()} {left:.3f}")

    signal.signal(signal.SIGCONT, on_sigcont)
    print("leader", epoch, flush=True)
    ops = [Put(keys.load_balance(), LoadBalanceDecision({broker_id: ()}).to_json())]
    while True:
        await asyncio.sleep(TICK_SECONDS)
        while resumed:
            print(resumed.pop(0), flush=True)
        is_leader = election.is_leader
        local = await outcome(election.write_as_leader(ops))
        server = await outcome(write_with_epoch(store, broker_id, epoch, ops))
        print("tick", is_leader, local, server, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))

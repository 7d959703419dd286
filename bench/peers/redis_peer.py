"""The workload against Redis Streams (one server, append-only file) through redis-py with hiredis, the
official client: its asyncio API, and its blocking one for producing.

- Produce: XADD (one field, the record) in pipelines of `batch` commands (no MULTI), up to `window //
  batch` pipelines in flight per producer on its connection, through redis-py's blocking client on a thread
  per producer (its asyncio client costs Redis more than half its rate here). A pipeline's replies come
  after the AOF write (`everysec`) or write and fdatasync (`always`) of the event loop iteration that ran
  it; every reply is checked. Ack latency is per pipeline, from packing and sending it to its last reply,
  and counts once per record in it.
- Consume: a consumer group read from the start; each consumer (one connection each, its own name in the
  group) sends XREADGROUP COUNT `batch` pipelined with the XACK of the previous batch, so a round trip
  reads a batch and acks the last. Redis keeps the group's position and pending entries in the stream, and
  XREADGROUP and XACK are written to the AOF like any write (with `always`, fsynced before the reply).
- Consume, no acks (`consume_noack`): one reader, XREAD COUNT `batch` from the last ID it saw: the position
  is the client's, nothing is written.
- End to end: the consumers block in XREADGROUP (BLOCK 100 ms) while the producers send paced pipelines.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Coroutine
from typing import Any

import redis
import redis.asyncio as aredis
import uvloop

from bench.peers.servers import AppendFsync
from bench.peers.workload import (
    PACE_SLEEP,
    Latencies,
    Measurement,
    Tally,
    Workload,
    e2e_filler,
    measurement,
    metered,
    run_phases,
    stamped,
)
from danube_fast.testing.process import ServerProcess

PEER = "redis"
FIELD = b"r"
GROUP = "bench"
BLOCK_MS = 100  # XREADGROUP BLOCK in the e2e phase


def durability(appendfsync: AppendFsync) -> str:
    return f"aof_{appendfsync}"


def durability_text(appendfsync: AppendFsync) -> str:
    if appendfsync == "always":
        return "appendonly yes, appendfsync always: AOF written and fdatasync'd before the replies"
    return "appendonly yes, appendfsync everysec: AOF written before the replies, fsync once a second"


def batching_text(workload: Workload) -> str:
    return (f"XADD pipelines of up to {workload.batch:,} records (at a fixed rate: the records due), up to "
            f"{max(1, workload.window // workload.batch)} in flight per producer; ack latency per pipeline, "
            "counted per record")


def _entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The entries of an XREAD / XREADGROUP reply on one stream ([] when nothing was read)."""
    if not reply:
        return []
    entries: list[tuple[bytes, dict[bytes, bytes]]] = reply[0][1]
    return entries


class Peer:
    """The clients of one run: one per producer (a pool of `window // batch` connections), one per
    consumer, one for stream management."""

    def __init__(self, server: ServerProcess, workload: Workload) -> None:
        self.server = server
        self.workload = workload
        self.in_flight = max(1, workload.window // workload.batch)  # pipelines per producer
        self.admin = self._client(1)
        self.consumers = [self._client(1) for _ in range(workload.consumers)]

    def _client(self, connections: int) -> aredis.Redis:
        return aredis.Redis(host=self.server.host, port=self.server.port, max_connections=connections + 1)

    async def close(self) -> None:
        for client in [self.admin, *self.consumers]:
            await client.aclose()

    # -- produce ----------------------------------------------------------------------------------------

    def _produce_one(self, key: str, count: int, seq0: int, ack: Latencies, rate: float | None) -> None:
        """One producer, on a thread of its own with redis-py's blocking client: each pipeline is packed
        whole by the client (`pack_commands`) and sent, up to `in_flight` of them before the oldest's replies
        are read (in order, on one connection). The asyncio client parses each reply in a coroutine of its
        own, which held Redis to about 100 k XADD/s here; this way reached 268 k (bench/README.md)."""
        batch = self.workload.batch
        payload, filler = self.workload.payload(), e2e_filler(self.workload)
        client = redis.Redis(host=self.server.host, port=self.server.port)
        conn = client.connection_pool.get_connection()
        waiting: deque[tuple[int, float]] = deque()  # (records, sent at) of each pipeline in flight

        def read_oldest() -> None:
            n, started = waiting.popleft()
            for _ in range(n):
                conn.read_response()  # raises the ResponseError of a refused XADD
            ack.add(time.perf_counter() - started, n)

        try:
            sent, t0 = 0, time.perf_counter()
            while sent < count:
                due = count if rate is None else min(count, int((time.perf_counter() - t0) * rate) + 1)
                if due <= sent:  # paced and ahead: read what came back, else sleep until the next is due
                    assert rate is not None
                    if waiting:
                        read_oldest()
                    else:
                        time.sleep(max(PACE_SLEEP, t0 + sent / rate - time.perf_counter()))
                    continue
                n = min(batch, due - sent)
                records = [payload] * n if rate is None else [stamped(filler, seq0 + sent + i)
                                                               for i in range(n)]
                conn.send_packed_command(conn.pack_commands([("XADD", key, "*", FIELD, r) for r in records]))
                waiting.append((n, time.perf_counter()))
                sent += n
                if len(waiting) >= self.in_flight:
                    read_oldest()
            while waiting:
                read_oldest()
        finally:
            client.connection_pool.release(conn)
            client.close()

    def _producers(self, key: str, ack: Latencies, rate: float | None) -> list[Awaitable[None]]:
        shares = self.workload.shares()
        seq0s = [sum(shares[:i]) for i in range(len(shares))]
        return [asyncio.to_thread(self._produce_one, key, n, seq0, ack,
                                  None if rate is None else rate / len(shares))
                for n, seq0 in zip(shares, seq0s, strict=True)]

    async def produce(self, key: str) -> Measurement:
        await self.admin.delete(key)
        ack = Latencies()
        with metered(self.server.pid) as usage:
            await asyncio.gather(*self._producers(key, ack, None))
        stored = await self.admin.xlen(key)
        if stored != self.workload.records:
            raise RuntimeError(f"{stored} records in stream {key}, {self.workload.records} acknowledged")
        return measurement("produce", self.workload, self.workload.records, usage, ack=ack)

    # -- consume ----------------------------------------------------------------------------------------

    async def _consume_one(self, client: aredis.Redis, name: str, key: str, tally: Tally, block: int | None
                           ) -> None:
        """XREADGROUP batches (each pipelined with the XACK of the one before) until the tally is full or,
        without `block` (a catch-up read), until the group has nothing new for this consumer."""
        batch = self.workload.batch
        previous: list[bytes] = []
        while not tally.done.is_set():
            pipe = client.pipeline(transaction=False)
            if previous:
                pipe.xack(key, GROUP, *previous)
            pipe.xreadgroup(GROUP, name, {key: ">"}, count=batch, block=block)
            entries = _entries((await pipe.execute())[-1])
            if not entries:
                if block is None:
                    break
                continue
            tally.received([fields[FIELD] for _, fields in entries])
            previous = [entry_id for entry_id, _ in entries]
        if previous:
            await client.xack(key, GROUP, *previous)

    async def _consumers(self, key: str, tally: Tally, block: int | None) -> list[Coroutine[Any, Any, None]]:
        await self.admin.xgroup_create(key, GROUP, id="0", mkstream=True)
        return [self._consume_one(client, f"c{i}", key, tally, block)
                for i, client in enumerate(self.consumers)]

    async def consume(self, key: str) -> Measurement:
        tally = Tally(self.workload.records, e2e=False)
        with metered(self.server.pid) as usage:
            await asyncio.gather(*await self._consumers(key, tally, None))
        if tally.count != tally.total:
            raise RuntimeError(f"{PEER} consume: {tally.count} records read, {tally.total} in the stream")
        return measurement("consume", self.workload, tally.count, usage, finished_at=tally.finished_at)

    async def consume_noack(self, key: str) -> Measurement:
        client, batch = self.consumers[0], self.workload.batch
        tally = Tally(self.workload.records, e2e=False)
        last = b"0"
        with metered(self.server.pid) as usage:
            while entries := _entries(await client.xread({key: last}, count=batch)):
                tally.received([fields[FIELD] for _, fields in entries])
                last = entries[-1][0]
        if tally.count != tally.total:
            raise RuntimeError(f"{PEER} consume_noack: {tally.count} records read, "
                               f"{tally.total} in the stream")
        return measurement("consume_noack", self.workload, tally.count, usage, finished_at=tally.finished_at)

    # -- end to end -------------------------------------------------------------------------------------

    async def e2e(self, key: str, rate: float) -> Measurement:
        await self.admin.delete(key)
        tally = Tally(self.workload.records, e2e=True)
        consumers = [asyncio.create_task(c) for c in await self._consumers(key, tally, BLOCK_MS)]
        ack = Latencies()
        try:
            with metered(self.server.pid) as usage:
                await asyncio.gather(*self._producers(key, ack, rate))
                await tally.wait(f"{PEER} e2e")
        except BaseException:
            for task in consumers:
                task.cancel()
            await asyncio.gather(*consumers, return_exceptions=True)
            raise
        await asyncio.gather(*consumers)  # each ends within BLOCK_MS of the tally filling up
        return measurement("e2e", self.workload, tally.count, usage, ack=ack, e2e=tally.e2e,
                           offered_rate=rate, finished_at=tally.finished_at)


async def _run(server: ServerProcess, workload: Workload) -> list[Measurement]:
    peer = Peer(server, workload)
    return await run_phases(peer, workload)


def run(server: ServerProcess, workload: Workload) -> list[Measurement]:
    """One run of the workload's phases against a running redis-server, on uvloop."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_run(server, workload))

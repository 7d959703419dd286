"""The gRPC ceiling of `python -m bench e2e`: what one stream of the fast API's shapes carries on this
machine with nothing behind it, at each record size of the sweep.

A bare grpc.aio server (bench/broker/bare_server.py) acknowledges every Produce batch at once and streams
prebuilt Consume responses (encoded once, sent as bytes, as the broker sends them); a raw stub writes or
reads them, at most bench.fast.IN_FLIGHT batches unacknowledged. The batches have our producer's shape at
that size (bench/peers/danube_peer.batch_records: 1,000 records, fewer so that a batch holds at most
1 MiB). Our produce and consume MB/s are set against these figures: near 1, the transport is the bound,
not the broker.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import uvloop

from bench import fast
from bench.broker import start_bare_server
from bench.peers.danube_peer import batch_records

MIN_BATCHES = 50


@dataclass(frozen=True)
class Ceiling:
    produce_mb_s: float
    consume_mb_s: float


def grpc_ceiling(sizes: Sequence[int], budget_bytes: int, parent_dir: str) -> dict[int, Ceiling]:
    """MB/s of record payload a bare stream carries each way, per record size, about `budget_bytes` of
    payload per direction and size (after a warm-up of a tenth of it)."""
    found = {}
    with tempfile.TemporaryDirectory(prefix="danube-bench-grpc-", dir=parent_dir) as scratch:
        server = start_bare_server(Path(scratch) / "bare.log")
        try:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                for size in sizes:
                    per = batch_records(size)
                    count = max(MIN_BATCHES, budget_bytes // (per * size))
                    runner.run(fast.bare(server, max(1, count // 10), size, per))
                    produce, _, _ = runner.run(fast.bare(server, count, size, per))
                    consume, _, _ = runner.run(fast.bare_consume(server, count, size, per))
                    found[size] = Ceiling(produce * size / 1e6, consume * size / 1e6)
        finally:
            server.stop()
    return found

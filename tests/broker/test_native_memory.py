"""The native transport's broker-wide bound on unacknowledged produce bytes ([broker] fast_inflight_bytes,
docs/TRANSPORT.md): connections that together pass it stop reading until acks drain, every batch is still
acknowledged and stored, and the bound is what the broker ever held (plus the frames being read when it was
reached)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker_support import Run

from danube_fast.broker.assemble import assemble
from danube_fast.broker.config import BrokerConfig
from danube_fast.client.native import NativeConnection, NativeProducer
from danube_fast.storage import SyncPolicy, WalConfig

LIMIT = 1 << 20
CONNECTIONS, BATCHES, RECORD = 3, 30, 128 * 1024


def test_connections_together_stay_within_the_broker_wide_bound(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        config = BrokerConfig(data_dir=str(tmp_path / "data"), wal=WalConfig(sync=SyncPolicy("always")),
                              broker_addr="127.0.0.1:0", admin_addr="127.0.0.1:0", prom_exporter="",
                              fast_addr="127.0.0.1:0", console_addr="",
                              fast_inflight_bytes=LIMIT)
        broker = await assemble(config)
        await broker.start()
        native = broker.listeners.native
        assert native is not None and broker.listening.fast_port is not None
        conns: list[NativeConnection] = []
        try:
            async def produce(n: int) -> list[tuple[int, int]]:
                conn = await NativeConnection.connect(f"127.0.0.1:{broker.listening.fast_port}")
                conns.append(conn)
                producer = await NativeProducer.open(conn, f"/default/bounded-{n}", f"p{n}")
                sent = [await producer.send_batch([bytes([n]) * RECORD]) for _ in range(BATCHES)]
                return [await asyncio.wait_for(f, 60) for f in sent]

            acks = await asyncio.gather(*(produce(n) for n in range(CONNECTIONS)))
            assert all(a == [(i, i) for i in range(BATCHES)] for a in acks), acks
            # Past the bound, each connection may have been reading one more frame (and its staging buffer).
            assert LIMIT < native.inflight_peak <= LIMIT + CONNECTIONS * (RECORD + 128 * 1024), \
                native.inflight_peak
            assert native.inflight == 0 and not native.held
            for n in range(CONNECTIONS):
                topic = broker.ctx.topics.find(f"/default/bounded-{n}")
                assert topic is not None and topic.start_offset == BATCHES
        finally:
            for conn in conns:
                await conn.aclose()
            await broker.stop()

    run(main(), timeout=60)

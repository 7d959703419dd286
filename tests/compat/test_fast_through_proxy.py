"""The fast producer behind a fault-injecting TCP proxy (danube_fast/testing/proxy.py) that resets every
connection while batches are in flight: the producer reconnects, resends what was not acknowledged, and every
batch is acknowledged, in the order sent, and stored exactly once (the broker answers a retry of a batch it
stored from the first copy: sequenced batches; with idempotent=False this test sees duplicates). Over gRPC:
the proxy fronts the gRPC port (test_native_through_proxy.py fronts the native one)."""

from __future__ import annotations

import asyncio

from compat_support import reset_when_connected, run_async

from danube_fast.client import FastProducer
from danube_fast.client.reader import TopicReader
from danube_fast.codec import frames
from danube_fast.testing.broker import BrokerFactory
from danube_fast.testing.proxy import Proxy

ROUNDS, BATCHES, RECORDS = 3, 4, 50


def test_the_producer_resends_across_connection_resets(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.add()
    topic = "/default/fast_through_resets"
    with Proxy(broker.target) as proxy:
        broker.flags += ["--advertised-addr", proxy.target]  # lookups name the proxy: clients stay behind it
        broker.start()

        async def scenario() -> None:
            producer = await FastProducer.connect(proxy.target, topic, "resets", reliable=True,
                                                  batch_records=RECORDS, transport="grpc")
            sent: list[bytes] = []
            acks: list[tuple[int, int]] = []
            try:
                for r in range(ROUNDS):
                    futures = []
                    for b in range(BATCHES):
                        batch = [b"r%d-b%d-%d" % (r, b, i) for i in range(RECORDS)]
                        sent += batch
                        futures.append(await producer.send_batch(batch))
                    assert await reset_when_connected(proxy) > 0, "no connection to reset"
                    acks += [await asyncio.wait_for(f, 30) for f in futures]
            finally:
                await producer.close()
            assert all(last - first == RECORDS - 1 for first, last in acks), acks
            assert [first for first, _ in acks] == sorted({first for first, _ in acks}), acks
            assert proxy.resets >= ROUNDS and proxy.accepted > ROUNDS, (proxy.resets, proxy.accepted)

            async with TopicReader(proxy.target, transport="grpc") as reader:
                stored = [r.payload for data, _, _ in [x async for x in reader.read(topic, 0, 0)]
                          for r in frames.decode_records(data)]
            # Exactly once, in order: a retry of a batch stored before the reset is answered from the first
            # copy (sequenced batches, broker/sequences.py), never stored again.
            assert stored == sent

        run_async(scenario(), timeout=90)


def test_the_producer_holds_at_most_128_unacknowledged_batches(broker_factory: BrokerFactory) -> None:
    """Whatever their bytes: a retry must stay within the sequences a topic remembers
    (broker/sequences.py). Acks are held back by the proxy; the 129th tiny batch waits until they come."""
    broker = broker_factory.add()
    topic = "/default/fast_unacked_bound"
    with Proxy(broker.target) as proxy:
        broker.flags += ["--advertised-addr", proxy.target]
        broker.start()

        async def scenario() -> None:
            from danube_fast.client.producer import MAX_UNACKED_BATCHES

            producer = await FastProducer.connect(proxy.target, topic, "bound", reliable=True,
                                                  transport="grpc")
            try:
                proxy.one_way("to_client")  # batches reach the broker, its acks are held
                futures = [await asyncio.wait_for(producer.send_batch([b"x"]), 5)
                           for _ in range(MAX_UNACKED_BATCHES)]
                blocked = asyncio.ensure_future(producer.send_batch([b"y"]))
                await asyncio.sleep(0.5)
                assert not blocked.done(), "a batch went out past the bound"
                proxy.pass_through()
                last = await asyncio.wait_for(await asyncio.wait_for(blocked, 10), 10)
                assert [await f for f in futures][-1][1] + 1 == last[0]
            finally:
                await producer.close()

        run_async(scenario(), timeout=60)

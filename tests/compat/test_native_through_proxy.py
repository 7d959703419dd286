"""The fast clients over the native transport behind the fault-injecting TCP proxy
(danube_fast/testing/proxy.py), which resets every native connection while batches are in flight: the
producer reconnects (lookup over gRPC, then the native address the broker advertises: the proxy's,
`--fast-advertised-addr`), resends what was not acknowledged, and every batch is stored once, in order; the
consumer subscribes again and gets every record."""

from __future__ import annotations

import asyncio

from compat_support import reset_when_connected, run_async

from danube_fast.client import FastConsumer, FastProducer
from danube_fast.client.reader import TopicReader
from danube_fast.codec import frames
from danube_fast.testing.broker import Broker, BrokerFactory
from danube_fast.testing.proxy import Proxy

ROUNDS, BATCHES, RECORDS = 3, 4, 50


def behind(broker: Broker, grpc_proxy: Proxy, native_proxy: Proxy) -> None:
    """Lookups and the native address name the proxies: clients stay behind them."""
    broker.flags += ["--advertised-addr", grpc_proxy.target, "--fast-advertised-addr", native_proxy.target]
    broker.start()


def test_the_producer_resends_across_native_connection_resets(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.add(native=True)
    topic = "/default/native_through_resets"
    with Proxy(broker.target) as grpc_proxy, Proxy(broker.fast_target) as native_proxy:
        behind(broker, grpc_proxy, native_proxy)

        async def scenario() -> None:
            producer = await FastProducer.connect(grpc_proxy.target, topic, "resets", reliable=True,
                                                  batch_records=RECORDS, transport="native")
            sent: list[bytes] = []
            acks: list[tuple[int, int]] = []
            try:
                for r in range(ROUNDS):
                    futures = []
                    for b in range(BATCHES):
                        batch = [b"r%d-b%d-%d" % (r, b, i) for i in range(RECORDS)]
                        sent += batch
                        futures.append(await producer.send_batch(batch))
                    assert await reset_when_connected(native_proxy) > 0, "no native connection to reset"
                    acks += [await asyncio.wait_for(f, 30) for f in futures]
                assert producer.over_native
            finally:
                await producer.close()
            assert all(last - first == RECORDS - 1 for first, last in acks), acks
            assert [first for first, _ in acks] == sorted({first for first, _ in acks}), acks
            assert native_proxy.resets >= ROUNDS and native_proxy.accepted > ROUNDS

            async with TopicReader(grpc_proxy.target, transport="grpc") as reader:
                stored = [r.payload for data, _, _ in [x async for x in reader.read(topic, 0, 0)]
                          for r in frames.decode_records(data)]
            assert stored == sent  # exactly once, in order (sequenced batches, broker/sequences.py)

        run_async(scenario(), timeout=90)


def test_the_consumer_gets_every_record_across_native_connection_resets(broker_factory: BrokerFactory
                                                                        ) -> None:
    broker = broker_factory.add(native=True)
    topic = "/default/native_consume_resets"
    with Proxy(broker.target) as grpc_proxy, Proxy(broker.fast_target) as native_proxy:
        behind(broker, grpc_proxy, native_proxy)

        async def scenario() -> None:
            producer = await FastProducer.connect(broker.target, topic, "p", reliable=True, transport="grpc")
            consumer = await FastConsumer.connect(grpc_proxy.target, topic, "s", "c", transport="native",
                                                  window_bytes=512)
            total, per_batch = 2000, 10
            try:
                for b in range(total // per_batch):
                    await producer.send_batch([b"m-%05d" % (b * per_batch + i) for i in range(per_batch)])
                await producer.flush()
                seen: set[int] = set()
                deliveries = 0
                async for d in consumer.batches():
                    seen.update(r.offset for r in frames.decode_records(d.data) if r.offset >= d.first_offset)
                    await consumer.ack_cumulative(d.last_offset)
                    deliveries += 1
                    if deliveries % 10 == 0 and native_proxy.resets < ROUNDS:
                        native_proxy.reset()  # mid-stream: RECORDS in flight, acks unsent
                    if len(seen) >= total:
                        break
                assert seen == set(range(total))
                assert consumer.reconnects >= ROUNDS and consumer.over_native
            finally:
                await consumer.close()
                await producer.close()

        run_async(scenario(), timeout=90)

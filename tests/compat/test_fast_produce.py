"""The fast API's produce stream (proto/FastApi.proto) against the broker subprocess: acks in order with WAL
offsets, the same topics as the Danube API (its consumers read what the fast API wrote), per-batch
rejections that leave nothing behind, and the client's resend after a broker restart."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from compat_support import Session, offsets, payloads, run_async
from danube import SubType

from danube_fast.client import FastConsumer, FastProducer, ProduceRejected
from danube_fast.client.reader import TopicReader
from danube_fast.codec import frames
from danube_fast.proto import FastApi_pb2 as fast
from danube_fast.proto import FastApi_pb2_grpc as fast_grpc
from danube_fast.testing.broker import Broker, BrokerFactory

BROKER_CONFIG = """
[policy]
max_message_size = 4096
"""


class RawStream:
    """One Produce stream over the generated stub, for what the client would never send."""

    def __init__(self, broker: Broker) -> None:
        self.channel = grpc.aio.insecure_channel(broker.target)
        stub: Any = fast_grpc.FastProducerStub(self.channel)  # type: ignore[no-untyped-call]
        self.call = stub.Produce()

    async def open(self, topic: str, name: str, reliable: bool = True) -> int:
        await self.call.write(fast.ProduceRequest(open=fast.Open(topic=topic, producer_name=name,
                                                                 reliable=reliable)))
        response = await asyncio.wait_for(self.call.read(), 5)
        assert response.WhichOneof("kind") == "opened", response
        return int(response.opened.producer_id)

    async def send(self, seq: int, data: bytes) -> Any:
        await self.call.write(fast.ProduceRequest(batch=fast.Batch(seq=seq, data=data)))
        return await asyncio.wait_for(self.call.read(), 5)

    async def close(self) -> None:
        await self.channel.close()


def test_batches_are_acknowledged_in_order_and_read_by_danube_api_consumers(broker: Broker,
                                                                             topic: str) -> None:
    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await FastProducer.connect(broker.target, topic, "fast-p", reliable=True,
                                                  batch_records=100)
            consumer = await s.consumer(topic, "c", "sub", SubType.EXCLUSIVE)
            sent = [b"fast-%04d" % i for i in range(250)]
            futures = [await producer.send(p) for p in sent]
            await producer.flush()
            batches = list(dict.fromkeys(futures))  # the distinct batch futures, in order
            assert [f.result() for f in batches] == [(0, 99), (100, 199), (200, 249)]
            got = await consumer.get_n(250)
            assert offsets(got) == list(range(250)) and payloads(got) == sent
            assert {m.producer_name for m in got} == {"fast-p"}
            assert not got[0].HasField("routing_key") and not got[0].HasField("schema_id")
            assert got[0].msg_id.producer_id == producer.producer_id and got[0].msg_id.topic_name == topic
            assert await producer.send_batch([b"one", b"two"]) and (await producer.flush()) is None
            await producer.close()

    run_async(scenario())


def test_a_bad_batch_is_rejected_alone_and_leaves_nothing(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        raw = RawStream(broker)
        try:
            pid = await raw.open(topic, "raw-p")
            good = frames.encode_payloads([b"a", b"b"], producer_id=pid, producer_name="raw-p")
            first = await raw.send(1, good)
            assert (first.ack.seq, first.ack.first_offset, first.ack.last_offset) == (1, 0, 1)

            corrupt = bytearray(good)
            corrupt[-1] ^= 0xFF
            bad = await raw.send(2, bytes(corrupt))
            assert bad.WhichOneof("kind") == "rejected" and bad.rejected.seq == 2
            assert bad.rejected.code == "INVALID_ARGUMENT" and "CRC" in bad.rejected.message
            assert not bad.rejected.retriable

            stranger = frames.encode_payloads([b"x"], producer_id=pid + 1, producer_name="raw-p")
            wrong = await raw.send(3, stranger)
            assert wrong.rejected.code == "INVALID_ARGUMENT" and "producer" in wrong.rejected.message

            big = frames.encode_payloads([b"y" * 5000], producer_id=pid, producer_name="raw-p")
            oversize = await raw.send(4, big)
            assert oversize.rejected.code == "INVALID_ARGUMENT"
            assert "max_message_size" in oversize.rejected.message

            garbage = await raw.send(5, b"not a record batch")
            assert garbage.rejected.code == "INVALID_ARGUMENT"

            after = await raw.send(6, good)  # nothing of the rejected ones took an offset
            assert (after.ack.first_offset, after.ack.last_offset) == (2, 3)
        finally:
            await raw.close()

    run_async(scenario())


def test_the_stream_must_open_first_and_match_the_topic(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        raw = RawStream(broker)
        try:
            await raw.call.write(fast.ProduceRequest(batch=fast.Batch(seq=1, data=b"")))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await asyncio.wait_for(raw.call.read(), 5)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "Open" in (refused.value.details() or "")
        finally:
            await raw.close()
        p = await FastProducer.connect(broker.target, topic, "first", reliable=True)
        await p.close()
        with pytest.raises(ProduceRejected) as info:
            await FastProducer.connect(broker.target, topic, "second", reliable=False)
        assert info.value.grpc_code == "FAILED_PRECONDITION"
        with pytest.raises(ProduceRejected) as bad_name:
            await FastProducer.connect(broker.target, "/default/a.b", "p")
        assert bad_name.value.grpc_code == "INVALID_ARGUMENT"

    run_async(scenario())


def test_non_reliable_batches_reach_live_consumers(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await FastProducer.connect(broker.target, topic, "nr", reliable=False)
            consumer = await s.consumer(topic, "c", "live", SubType.SHARED)
            future = await producer.send_batch([b"n-%d" % i for i in range(5)])
            assert await future == (0, 4)
            got = await consumer.get_n(5)
            assert payloads(got) == [b"n-%d" % i for i in range(5)]
            await producer.close()

    run_async(scenario())


@pytest.mark.parametrize("reliable", [True, False], ids=["reliable", "non-reliable"])
def test_compressed_batches_reach_both_apis(broker: Broker, topic: str, reliable: bool) -> None:
    """docs/FORMAT.md#compression: a producer's zstd batches are stored and served to the fast API as they
    came (compressed) and decompressed for a Danube-API consumer."""
    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await FastProducer.connect(broker.target, topic, "zp", reliable=reliable,
                                                  compression="zstd")
            danube = await s.consumer(topic, "c", "danube-sub", SubType.EXCLUSIVE)
            fast_consumer = await FastConsumer.connect(broker.target, topic, "fast-sub", "fc") \
                if reliable else None
            sent = [b'{"order": %d, "status": "shipped", "currency": "EUR"}' % i for i in range(300)]
            for start in range(0, 300, 100):
                await producer.send_batch(sent[start:start + 100])
            await producer.flush()
            got = await danube.get_n(300)
            assert payloads(got) == sent
            if fast_consumer is not None:
                assert offsets(got) == list(range(300))
                stream = fast_consumer.batches()
                deliveries = [await asyncio.wait_for(anext(stream), 5)]
                while deliveries[-1].last_offset < 299:
                    deliveries.append(await asyncio.wait_for(anext(stream), 5))
                data = b"".join(d.data for d in deliveries)
                assert {h.compression for h in frames.scan_batches(data)} == {"zstd"}
                assert len(data) < len(b"".join(sent))
                assert [r.payload for r in frames.decode_records(data)] == sent
                await fast_consumer.close()
            await producer.close()

    run_async(scenario())


def test_a_compressed_batch_cannot_hide_an_oversized_record(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        raw = RawStream(broker)
        try:
            pid = await raw.open(topic, "raw-z")
            big = frames.encode_payloads([b"y" * 5000], producer_id=pid, producer_name="raw-z",
                                         compression="zstd")
            assert len(big) < 4096 and frames.parse_header(big).compression == "zstd"
            oversize = await raw.send(1, big)
            assert oversize.rejected.code == "INVALID_ARGUMENT"
            assert "max_message_size" in oversize.rejected.message
        finally:
            await raw.close()

    run_async(scenario())


def test_the_client_resends_unacknowledged_batches_after_a_restart(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start()
    topic = "/default/fast_restart"

    async def scenario() -> None:
        producer = await FastProducer.connect(broker.target, topic, "survivor", reliable=True,
                                              batch_records=50)
        try:
            before = [await producer.send_batch([b"a-%d" % i for i in range(50)]) for _ in range(4)]
            await producer.flush()
            assert [f.result() for f in before] == [(0, 49), (50, 99), (100, 149), (150, 199)]
            await asyncio.to_thread(broker.terminate)
            await asyncio.to_thread(broker.start)
            after = await producer.send_batch([b"b-%d" % i for i in range(50)])
            first, last = await asyncio.wait_for(after, 20)
            assert last - first == 49 and first >= 200  # at least once: nothing acknowledged is lost
        finally:
            await producer.close()
        async with Session(broker.url) as s:
            assert await s.partitions(topic) == [topic]

    run_async(scenario(), timeout=60)


def test_records_keep_keys_and_attributes_and_resend_after_a_restart(broker_factory: BrokerFactory) -> None:
    """send_records: routing keys, attributes and publish times reach the topic as given (read back through
    FastReader), and a batch sent across a broker restart is acknowledged like send_batch's."""
    broker = broker_factory.start()
    topic = "/default/fast_records"

    def records(tag: str) -> list[frames.Record]:
        return [frames.Record(f"{tag}-{i}".encode(), 1_700_000_000_000 + i, routing_key=f"k{i % 3}",
                              attributes={"i": str(i)} if i % 2 else None) for i in range(20)]

    async def scenario() -> None:
        producer = await FastProducer.connect(broker.target, topic, "records", reliable=True)
        try:
            assert await asyncio.wait_for(await producer.send_records(records("a")), 10) == (0, 19)
            await asyncio.to_thread(broker.terminate)
            await asyncio.to_thread(broker.start)
            first, last = await asyncio.wait_for(await producer.send_records(records("b")), 20)
            assert last - first == 19 and first >= 20
        finally:
            await producer.close()
        async with TopicReader(broker.target) as reader:
            got = [r for data, _, _ in [x async for x in reader.read(topic, 0, 0)]
                   for r in frames.decode_records(data)]
        sent = records("a") + records("b")
        assert [(r.payload, r.routing_key, r.attributes, r.publish_time) for r in got[:20]] == \
            [(r.payload, r.routing_key, r.attributes, r.publish_time) for r in sent[:20]]
        assert [r.payload for r in got[-20:]] == [r.payload for r in sent[20:]]

    run_async(scenario(), timeout=60)


def test_a_send_cancelled_while_it_waits_to_write_is_still_sent_and_flush_returns(broker: Broker,
                                                                                 topic: str) -> None:
    """A caller cancelled after its batch was registered (here: waiting for the stream's write lock, as a
    task cancelled at the end of a benchmark was) must not leave the batch unsent: flush() would wait for its
    ack for ever."""
    async def scenario() -> None:
        producer = await FastProducer.connect(broker.target, topic, "cancelled", reliable=True)
        try:
            await producer._write_lock.acquire()  # another write in progress
            sending = asyncio.create_task(producer.send_batch([b"a", b"b"]))
            async with asyncio.timeout(5):
                while not producer._unacked:  # until it is registered and waits for the lock
                    await asyncio.sleep(0)
            sending.cancel()
            producer._write_lock.release()
            await asyncio.wait_for(producer.flush(), 10)
            after = await producer.send_batch([b"c"])
            assert await asyncio.wait_for(after, 10) == (2, 2)  # the cancelled batch took 0..1
        finally:
            await asyncio.wait_for(producer.close(), 10)

    run_async(scenario())

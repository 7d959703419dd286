"""Idempotent produce across a broker crash (broker/sequences.py): a sequenced batch acknowledged before a
kill -9, sent again after the restart on a new stream (as a producer does whose ack was lost), is answered
with the first copy's offsets and stored once; new batches go on after it. Through a raw Produce stream, so
the test decides exactly what is sent again."""

from __future__ import annotations

import grpc
from compat_support import run_async

from danube_fast import frames
from danube_fast.client.producer import produce_method
from danube_fast.client.reader import TopicReader
from danube_fast.fast_wire import encode_batch_request
from danube_fast.proto import FastApi_pb2 as fast
from danube_fast.testing.broker import BrokerFactory

TOPIC = "/default/idempotent_crash"
SESSION = 0x5EED


async def _stream(target: str) -> tuple[grpc.aio.Channel, object, int]:
    channel = grpc.aio.insecure_channel(target)
    call = produce_method(channel)()
    await call.write(fast.ProduceRequest(open=fast.Open(topic=TOPIC, producer_name="p", reliable=True)))
    opened = await call.read()
    return channel, call, opened.opened.producer_id


def _batch(producer_id: int, sequence: int) -> bytes:
    payloads = [b"s%d-%d" % (sequence, i) for i in range(5)]
    return frames.encode_payloads(payloads, producer_id=producer_id, producer_name="p", session=SESSION,
                                  sequence=sequence)


async def _send(call: object, seq: int, data: bytes) -> tuple[int, int]:
    await call.write(encode_batch_request(seq, data))  # type: ignore[attr-defined]
    response = await call.read()  # type: ignore[attr-defined]
    assert response.WhichOneof("kind") == "ack", response
    return response.ack.first_offset, response.ack.last_offset


def test_a_retry_after_a_crash_is_answered_from_the_first_copy(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.add()
    broker.start()

    async def before() -> list[tuple[int, int]]:
        channel, call, pid = await _stream(broker.target)
        acks = [await _send(call, s, _batch(pid, s)) for s in (1, 2, 3)]
        await channel.close()
        return acks

    acks = run_async(before(), timeout=30)
    broker.kill()  # kill -9: the table of sequences is gone with the process
    broker.start()

    async def after() -> None:
        channel, call, pid = await _stream(broker.target)
        assert await _send(call, 1, _batch(pid, 3)) == acks[2]  # the lost ack's batch, sent again
        assert await _send(call, 2, _batch(pid, 2)) == acks[1]
        fourth = await _send(call, 3, _batch(pid, 4))
        assert fourth[0] > acks[2][1]
        await channel.close()
        async with TopicReader(broker.target) as reader:
            stored = [r.payload for data, _, _ in [x async for x in reader.read(TOPIC, 0, 0)]
                      for r in frames.decode_records(data)]
        assert stored == [b"s%d-%d" % (s, i) for s in (1, 2, 3, 4) for i in range(5)]

    run_async(after(), timeout=30)


def test_a_sequenced_batch_must_be_alone_in_its_request_and_name_its_stream_producer(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.add()
    broker.start()

    async def scenario() -> None:
        channel, call, pid = await _stream(broker.target)
        checks = [
            (_batch(pid, 1) + _batch(pid, 2), "must be the only one"),
            (frames.encode_payloads([b"x"], producer_id=pid, producer_name="q", session=SESSION, sequence=1),
             "names producer 'q'"),
        ]
        for seq, (data, why) in enumerate(checks, 1):
            await call.write(encode_batch_request(seq, data))
            response = await call.read()
            assert response.WhichOneof("kind") == "rejected", response
            assert response.rejected.code == "INVALID_ARGUMENT" and why in response.rejected.message
        assert await _send(call, 3, _batch(pid, 1)) == (0, 4)  # nothing of the refused ones was stored
        await channel.close()

    run_async(scenario(), timeout=30)

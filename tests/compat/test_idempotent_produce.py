"""Idempotent produce across a broker crash (broker/sequences.py): a sequenced batch acknowledged before a
kill -9, sent again after the restart on a new stream (as a producer does whose ack was lost), is answered
with the first copy's offsets and stored once; new batches go on after it. Through a raw Produce stream
(danube_fast/testing/raw_producer.py), so the test decides exactly what is sent again."""

from __future__ import annotations

from compat_support import run_async

from danube_fast.client.reader import TopicReader
from danube_fast.codec import frames
from danube_fast.testing.broker import BrokerFactory
from danube_fast.testing.raw_producer import RawProducer

TOPIC = "/default/idempotent_crash"


def payloads(sequence: int) -> list[bytes]:
    return [b"s%d-%d" % (sequence, i) for i in range(5)]


async def stored(target: str, topic: str) -> list[bytes]:
    async with TopicReader(target) as reader:
        return [r.payload for data, _, _ in [x async for x in reader.read(topic, 0, 0)]
                for r in frames.decode_records(data)]


def test_a_retry_after_a_crash_is_answered_from_the_first_copy(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.add()
    broker.start()

    async def before() -> list[tuple[int, int]]:
        p = await RawProducer.open(broker.target, TOPIC, "p")
        acks = [await p.offsets(s, p.batch(payloads(s), s)) for s in (1, 2, 3)]
        await p.close()
        return acks

    acks = run_async(before(), timeout=30)
    broker.kill()  # kill -9: the table of sequences is gone with the process
    broker.start()

    async def after() -> None:
        p = await RawProducer.open(broker.target, TOPIC, "p")
        assert await p.offsets(1, p.batch(payloads(3), 3)) == acks[2]  # the lost ack's batch, sent again
        assert await p.offsets(2, p.batch(payloads(2), 2)) == acks[1]
        fourth = await p.offsets(3, p.batch(payloads(4), 4))
        assert fourth[0] > acks[2][1]
        await p.close()
        assert await stored(broker.target, TOPIC) == [x for s in (1, 2, 3, 4) for x in payloads(s)]

    run_async(after(), timeout=30)


def test_a_sequenced_batch_must_be_alone_in_its_request_and_name_its_stream_producer(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.add()
    broker.start()

    async def scenario() -> None:
        p = await RawProducer.open(broker.target, TOPIC, "p")
        other = frames.encode_payloads([b"x"], producer_id=p.producer_id, producer_name="q",
                                       session=p.session, sequence=1)
        checks = [(p.batch([b"a"], 1) + p.batch([b"b"], 2), "must be the only one"),
                  (other, "names producer 'q'")]
        for seq, (data, why) in enumerate(checks, 1):
            response = await p.send(seq, data)
            assert response.WhichOneof("kind") == "rejected", response
            assert response.rejected.code == "INVALID_ARGUMENT" and why in response.rejected.message
        assert await p.offsets(3, p.batch([b"c"], 1)) == (0, 0)  # nothing of the refused ones was stored
        await p.close()

    run_async(scenario(), timeout=30)

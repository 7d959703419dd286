"""Random request sequences on the bidirectional streams of the fast API (Produce, Consume), the methods that
tests/compat/test_request_fuzz.py cannot reach with one request: each session opens a stream, usually with a
valid Open or Subscribe first (so that later requests get past the first check), then sends random
requests: repeated Opens, batches whose data is a valid record batch mangled (bits flipped, truncated,
another producer id, several batches joined) or random bytes, huge and zero sequence numbers, acks and nacks
of offsets never sent, a Subscribe after the first request.

What a bug looks like, and what this test refuses: a status UNKNOWN, an INTERNAL a handler made from an
unexpected exception, a traceback in the broker's log, a broker that stops answering a plain produce after
the sessions, or one that does not restart cleanly. Seeded like test_request_fuzz.py (FUZZ_SEED,
FUZZ_SESSIONS).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import struct
from typing import Any

import grpc
import pytest
from compat_support import run_async
from test_request_fuzz import fill

from danube_fast.client import FastProducer
from danube_fast.codec import frames
from danube_fast.proto import FastApi_pb2 as fast
from danube_fast.testing.broker import Broker, BrokerFactory

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SEED = int(os.environ.get("FUZZ_SEED", "20261128"))
SESSIONS = int(os.environ.get("FUZZ_SESSIONS", "120"))
REQUESTS = 6  # at most, per session
SESSION_SECONDS = 2.0
TOPIC = "/default/stream-fuzz"
SEEN: set[str] = set()  # answers and statuses the sessions met: the test checks it reached past the checks
PRODUCE = "/danube_fast.v1.FastProducer/Produce"
CONSUME = "/danube_fast.v1.FastConsumer/Consume"


def mangled_batch(rng: random.Random, producer_id: int) -> bytes:
    payloads = [rng.randbytes(rng.randint(0, 64)) for _ in range(rng.randint(1, 5))]
    data = bytearray(frames.encode_payloads(payloads, producer_id=producer_id))
    how = rng.randrange(6)
    if how == 0:
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how == 1:
        del data[rng.randrange(1, len(data)):]
    elif how == 2:
        struct.pack_into("<Q", data, 40, rng.choice([0, producer_id + 1, 2**64 - 1]))
    elif how == 3:
        data = data + data  # two whole batches
    elif how == 4:
        struct.pack_into("<I", data, 12, rng.choice([0, 55, 2**32 - 1]))  # batch_length
    return bytes(data)  # how == 5: valid


def produce_open(rng: random.Random) -> fast.ProduceRequest | None:
    if rng.random() < 0.2:
        return None
    return fast.ProduceRequest(open=fast.Open(topic=TOPIC, producer_name=f"p{rng.randrange(3)}",
                                              reliable=rng.random() < 0.7))


def produce_rest(rng: random.Random, producer_id: int) -> list[fast.ProduceRequest]:
    """Batches stamped mostly with the id the broker gave (so that they reach the WAL), and other requests."""
    requests = []
    for _ in range(rng.randint(0, REQUESTS)):
        if rng.random() < 0.6:
            seq = rng.choice([0, 1, 2, 2**63, 2**64 - 1])
            stamped = producer_id if rng.random() < 0.8 else rng.choice([0, producer_id + 1])
            data = mangled_batch(rng, stamped) if rng.random() < 0.9 else rng.randbytes(50)
            requests.append(fast.ProduceRequest(batch=fast.Batch(seq=seq, data=data)))
        else:
            requests.append(fill(fast.ProduceRequest(), rng))
    return requests


def consume_open(rng: random.Random) -> fast.ConsumeRequest | None:
    if rng.random() < 0.2:
        return None
    return fast.ConsumeRequest(subscribe=fast.Subscribe(
        topic=TOPIC, subscription=f"s{rng.randrange(3)}", consumer_name=f"c{rng.randrange(3)}",
        window_bytes=rng.choice([0, 1, 2**64 - 1])))


def consume_rest(rng: random.Random, _: int) -> list[fast.ConsumeRequest]:
    requests = []
    for _ in range(rng.randint(0, REQUESTS)):
        if rng.random() < 0.6:
            ack = fast.Acknowledge(offsets=[rng.choice([0, 5, 2**63, 2**64 - 1])],
                                   nacks=rng.choice([[], [0], [2**64 - 1]]))
            if rng.random() < 0.5:
                ack.up_to = rng.choice([0, 10, 2**64 - 1])
            requests.append(fast.ConsumeRequest(ack=ack))
        else:
            requests.append(fill(fast.ConsumeRequest(), rng))
    return requests


async def session(channel: grpc.aio.Channel, path: str, rng: random.Random) -> tuple[str | None, list[Any]]:
    """One stream: the opening request, its answer read (a producer's id is needed to stamp batches), then
    the rest; (a problem or None, the requests sent)."""
    producing = path == PRODUCE
    first = (produce_open if producing else consume_open)(rng)
    sent: list[Any] = []
    call = channel.stream_stream(path, request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=bytes)()
    try:
        async with asyncio.timeout(SESSION_SECONDS):
            producer_id = 0
            with contextlib.suppress(asyncio.InvalidStateError):  # the broker ended the stream already
                if first is not None:
                    sent.append(first)
                    await call.write(first)
                    answer = await call.read()
                    if producing and answer is not grpc.aio.EOF:
                        producer_id = fast.ProduceResponse.FromString(answer).opened.producer_id
                for request in (produce_rest if producing else consume_rest)(rng, producer_id):
                    sent.append(request)
                    await call.write(request)
                await call.done_writing()
            while (answer := await call.read()) is not grpc.aio.EOF:
                if producing:
                    SEEN.add(fast.ProduceResponse.FromString(answer).WhichOneof("kind") or "")
    except TimeoutError:
        return None, sent  # a valid Consume stream waits for records: fine
    except grpc.aio.AioRpcError as e:
        code, details = e.code(), e.details() or ""
        SEEN.add(code.name)
        if code == grpc.StatusCode.UNKNOWN or (code == grpc.StatusCode.INTERNAL and " failed: " in details
                                               and "Error(" in details):
            return f"{code.name}: {details[:300]}", sent
    finally:
        call.cancel()
    return None, sent


async def hammer(broker: Broker, seed: int) -> list[str]:
    rng = random.Random(seed)
    problems = []
    async with grpc.aio.insecure_channel(broker.target) as channel:
        for n in range(SESSIONS):
            path = rng.choice([PRODUCE, CONSUME])
            problem, requests = await session(channel, path, rng)
            if problem is not None:
                problems.append(f"{path} session {n} (seed {seed}): {problem}; requests {requests!r:.400}")
    producer = await FastProducer.connect(broker.target, "/default/after-fuzz", "after")
    try:
        await asyncio.wait_for(await producer.send_batch([b"still serving"]), 10)
    finally:
        await producer.close()
    return problems


def test_random_stream_sessions_get_statuses_and_the_broker_restarts(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start()
    problems = run_async(hammer(broker, SEED), timeout=250)
    assert not problems, "\n".join(problems[:10])
    # batches stored and batches refused, streams refused, as the sessions meant
    assert {"ack", "rejected", "INVALID_ARGUMENT"} <= SEEN, SEEN
    assert "Traceback" not in broker.log_path.read_text(), broker.log_path.read_text()[-4000:]
    broker.restart()
    assert broker.running

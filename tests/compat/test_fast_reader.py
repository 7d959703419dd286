"""FastReader against the broker subprocess: a Reliable topic's records by offset range, whatever API wrote
them, whichever tier holds them, and nothing written while reading (no subscription, no cursor)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from compat_support import Session, bounded, run_async, send_all

from danube_fast.broker.services.fast_reader import read_range
from danube_fast.client import FastConsumer, FastProducer
from danube_fast.client.reader import ReadFailed, Records, TopicReader, records_in
from danube_fast.codec import frames
from danube_fast.errors import ApiError
from danube_fast.proto import DanubeAdmin_pb2 as admin
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.proto import FastApi_pb2 as fast
from danube_fast.proto import FastApi_pb2_grpc as fast_grpc
from danube_fast.testing.broker import Broker, BrokerFactory

# Small segments, deleted locally once uploaded, frequent uploads: old offsets end up in the object tier only
# (the standalone broker's folder store, DATA_DIR/objects).
TIERED_CONFIG = "[wal]\nsegment_bytes = 4096\nretain_bytes = 0\n[cluster]\nupload_interval_ms = 100\n"


async def produce_mixed(broker: Broker, topic: str) -> list[bytes]:
    """5 records through the Danube API, 300 in 3 fast-API batches, 5 more through the Danube API; their
    payloads in offset order."""
    expected: list[bytes] = []
    async with Session(broker.url) as s:
        danube_p = await s.producer(topic, "danube-p", reliable=True)
        before = [b"danube-%d" % i for i in range(5)]
        await send_all(danube_p, before)
        expected += before
        fast_p = await FastProducer.connect(broker.target, topic, "fast-p", reliable=True)
        for b in range(3):
            batch = [b"fast-%03d" % (b * 100 + i) for i in range(100)]
            assert await bounded(await fast_p.send_batch(batch), "fast batch") == \
                (len(expected), len(expected) + 99)
            expected += batch
        await fast_p.close()
        after = [b"danube-%d" % i for i in range(5, 10)]
        await send_all(danube_p, after)
        expected += after
    return expected


async def produce_batches(broker: Broker, topic: str, batches: int, per_batch: int = 50, pad: int = 0
                          ) -> list[bytes]:
    producer = await FastProducer.connect(broker.target, topic, "p", reliable=True)
    expected: list[bytes] = []
    for b in range(batches):
        batch = [b"r-%06d" % (b * per_batch + i) + b"." * pad for i in range(per_batch)]
        await bounded(await producer.send_batch(batch), f"batch {b}")
        expected += batch
    await producer.close()
    return expected


async def read_all(reader: TopicReader, topic: str, start: int, end: int, max_bytes: int = 0
                   ) -> list[Records]:
    return [item async for item in reader.read(topic, start, end, max_bytes)]


def check_items(items: list[Records], max_bytes: int = 0) -> None:
    """Each item is whole batches that its offsets describe, within max_bytes unless one batch, contiguous
    with the previous item."""
    for i, (data, first, last) in enumerate(items):
        headers = frames.scan_batches(data)
        assert headers[0].base_offset == first and headers[-1].last_offset == last, (i, first, last)
        assert not max_bytes or len(data) <= max_bytes or len(headers) == 1, (i, len(data), max_bytes)
        if i:
            assert first == items[i - 1][2] + 1, f"item {i} starts at {first} after {items[i - 1][2]}"


def in_range(items: list[Records], start: int, end: int) -> list[frames.Record]:
    return [r for data, _, _ in items for r in records_in(data, start, end)]


async def raw_read(broker: Broker, topic: str, from_offset: int, to_offset: int) -> list[fast.ReadResponse]:
    async with grpc.aio.insecure_channel(broker.target) as channel:
        stub: Any = fast_grpc.FastReaderStub(channel)  # type: ignore[no-untyped-call]
        call = stub.Read(fast.ReadRequest(topic=topic, from_offset=from_offset, to_offset=to_offset))
        return await bounded(_collect(call), f"Read {topic} [{from_offset}, {to_offset})")


async def _collect(call: Any) -> list[Any]:
    return [response async for response in call]


async def subscriptions(broker: Broker, topic: str) -> list[str]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
        stub: Any = admin_grpc.TopicAdminStub(channel)  # type: ignore[no-untyped-call]
        listed = await bounded(stub.ListSubscriptions(admin.TopicRequest(name=topic)), "ListSubscriptions")
        return sorted(listed.subscriptions)


async def refusal(awaitable: Any, what: str) -> ReadFailed:
    with pytest.raises(ReadFailed) as failed:
        await bounded(awaitable, what)
    return failed.value


def test_reads_every_committed_record_in_order(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        expected = await produce_mixed(broker, topic)
        n = len(expected)
        async with TopicReader(broker.target) as reader:
            assert await reader.offsets(topic) == (0, n)

            items = await read_all(reader, topic, 0, n, max_bytes=1000)
            check_items(items, 1000)
            assert len(items) > 3, "max_bytes did not split the read"
            table = frames.decode_arrow(b"".join(data for data, _, _ in items))
            assert table.column("offset").to_pylist() == list(range(n))
            assert table.column("value").to_pylist() == expected

            sub = await read_all(reader, topic, 57, 203)
            check_items(sub)
            assert sub[0][1] <= 57 and sub[-1][2] >= 202
            got = in_range(sub, 57, 203)
            assert [r.offset for r in got] == list(range(57, 203))
            assert [r.payload for r in got] == expected[57:203]

            tail = await read_all(reader, topic, 250, 0)  # end 0: what is committed now
            assert [r.payload for r in in_range(tail, 250, n)] == expected[250:]
            assert await read_all(reader, topic, n + 5, n + 10) == []
            assert await read_all(reader, topic, n, 0) == []

        # The wire's own defaults: to_offset 0 is the committed end, a to_offset beyond it is cut there.
        responses = await raw_read(broker, topic, 300, 0)
        assert responses[-1].records.last_offset == n - 1
        got = [r.payload for resp in responses for r in records_in(resp.records.data, 300, n)]
        assert got == expected[300:]
        beyond = await raw_read(broker, topic, 300, 10_000)
        assert [b.records.last_offset for b in beyond] == [r.records.last_offset for r in responses]
        assert await raw_read(broker, topic, n + 1, 0) == []
        assert await subscriptions(broker, topic) == [], "reading created a subscription"

    run_async(scenario())


def test_refusals(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        producer = await FastProducer.connect(broker.target, topic, "nr", reliable=False)
        await producer.close()
        async with TopicReader(broker.target) as reader:
            live = await refusal(reader.offsets(topic), "Offsets of a NonReliable topic")
            assert live.grpc_code == "FAILED_PRECONDITION" and "NonReliable" in str(live), live
            live = await refusal(read_all(reader, topic, 0, 10), "Read of a NonReliable topic")
            assert live.grpc_code == "FAILED_PRECONDITION", live
            for bad in ("/default/no space", "no-namespace", "/default/"):
                invalid = await refusal(read_all(reader, bad, 0, 10), f"Read of {bad!r}")
                assert invalid.grpc_code == "INVALID_ARGUMENT", invalid
            missing = await refusal(reader.offsets(topic + "-missing"), "Offsets of a missing topic")
            assert missing.grpc_code == "INVALID_ARGUMENT" and "does not exist" in str(missing), missing
        reliable = topic + "-r"
        await produce_batches(broker, reliable, 1)
        async with grpc.aio.insecure_channel(broker.target) as channel:
            stub: Any = fast_grpc.FastReaderStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.aio.AioRpcError) as backwards:
                request = fast.ReadRequest(topic=reliable, from_offset=5, to_offset=2)
                await bounded(_collect(stub.Read(request)), "Read of [5, 2)")
            assert backwards.value.code() == grpc.StatusCode.INVALID_ARGUMENT, backwards.value

    run_async(scenario())


def test_reading_writes_nothing(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        expected = await produce_batches(broker, topic, 4)
        consumer = await FastConsumer.connect(broker.target, topic, "keep", "c")
        assert consumer.start_offset == len(expected)  # a new subscription starts at the latest offset
        await consumer.close()
        expected += await produce_batches(broker, topic, 2)
        consumer = await FastConsumer.connect(broker.target, topic, "keep", "c")
        stream = consumer.batches()
        first = await asyncio.wait_for(anext(stream), 5)
        await consumer.ack_cumulative(first.first_offset + 9)
        await consumer.close()
        cursor_next = first.first_offset + 10
        assert await subscriptions(broker, topic) == ["keep"]

        async with TopicReader(broker.target) as reader:
            for _ in range(2):
                assert await reader.offsets(topic) == (0, len(expected))
                items = await read_all(reader, topic, 0, 0)
                assert [r.payload for r in in_range(items, 0, len(expected))] == expected
                partial = reader.read(topic, 0, len(expected), max_bytes=100)
                await anext(partial)  # a read left unfinished changes nothing either
                await partial.aclose()

        assert await subscriptions(broker, topic) == ["keep"]
        again = await FastConsumer.connect(broker.target, topic, "keep", "c")
        assert again.start_offset == cursor_next, "reading moved the subscription's cursor"
        await again.close()

    run_async(scenario())


def test_the_same_after_a_broker_restart_and_across_one(broker_factory: BrokerFactory, topic: str) -> None:
    """A read in progress when the broker stops ends with UNAVAILABLE (the broker's own, or gRPC's
    "Cancelling all calls" for a stream that flow control held past the stop's grace); the reader retries on
    the restarted broker from the next offset it had not yielded: every record once, in order."""
    broker = broker_factory.start()

    async def scenario() -> None:
        expected = await produce_batches(broker, topic, 100, pad=100)  # 500 KiB: more than a stream buffers
        n = len(expected)
        async with TopicReader(broker.target) as reader:
            before = await read_all(reader, topic, 0, n)
            await asyncio.to_thread(broker.restart)
            assert await reader.offsets(topic) == (0, n)
            after = await read_all(reader, topic, 0, n)
            assert [r.payload for r in in_range(after, 0, n)] == expected
            assert [(first, last) for _, first, last in after] == [(first, last) for _, first, last in before]

            items: list[Records] = []
            retried = reader.retried
            stream = reader.read(topic, 0, n, max_bytes=2000)
            items.append(await anext(stream))
            await asyncio.to_thread(broker.restart)
            items += [item async for item in stream]
            assert reader.retried > retried, "the read did not span the restart"
            check_items(items, 2000)
            assert [r.payload for r in in_range(items, 0, n)] == expected

    run_async(scenario())


def _wal_start(broker: Broker, topic: str) -> int:
    """The base offset of the oldest WAL segment left on disk (0 while there is none yet)."""
    ns, short = topic.strip("/").split("/")
    bases = [int(p.name.removesuffix(".log")) for p in Path(broker.data_dir, "wal", ns, short).glob("*.log")]
    return min(bases, default=0)


def test_offsets_only_in_the_object_tier(broker_factory: BrokerFactory, topic: str) -> None:
    """Uploaded segments are deleted from the WAL: the oldest offsets are read from the object tier, the
    newest from the WAL, in one read, before and after a restart."""
    broker = broker_factory.start(TIERED_CONFIG)

    async def scenario() -> None:
        expected = await produce_batches(broker, topic, 60)
        n = len(expected)
        deadline = time.monotonic() + 20
        while _wal_start(broker, topic) < n // 2:
            assert time.monotonic() < deadline, f"the WAL still starts at {_wal_start(broker, topic)}"
            await asyncio.sleep(0.1)
        ns, short = topic.strip("/").split("/")
        assert list(Path(broker.data_dir, "objects", ns, short).glob("data-0-*.dnb1")), "no object from 0"
        async with TopicReader(broker.target) as reader:
            for restarted in (False, True):
                if restarted:
                    await asyncio.to_thread(broker.restart)
                assert await reader.offsets(topic) == (0, n)
                items = await read_all(reader, topic, 0, n, max_bytes=4096)
                check_items(items, 4096)
                assert [r.payload for r in in_range(items, 0, n)] == expected
                assert items[0][1] == 0 and items[-1][2] == n - 1

    run_async(scenario())


async def _no_message() -> AsyncIterator[bytes]:
    return
    yield  # an async generator that sends no message


def test_malformed_and_missing_requests_are_invalid_argument(broker: Broker) -> None:
    """As every method of the broker (tests/compat/test_hostile_input.py): bytes that do not parse, and a
    request stream that ends without its one message, get INVALID_ARGUMENT."""
    garbage = b"\x0a\xff\xff\xff\x0f"  # field 1, a length far past the end

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(broker.target) as channel:
            offsets, read = "/danube_fast.v1.FastReader/Offsets", "/danube_fast.v1.FastReader/Read"
            calls = [channel.unary_unary(offsets)(garbage), channel.stream_unary(offsets)(_no_message()),
                     _collect(channel.unary_stream(read)(garbage)),
                     _collect(channel.stream_stream(read)(_no_message()))]
            for i, call in enumerate(calls):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await bounded(call, f"bad call {i}")
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (i, refused.value)

    run_async(scenario())


class _Trimmed:
    """A topic log whose retention already deleted offsets below 100 (no broker keeps such a topic on demand:
    the standalone broker's object tier keeps everything)."""

    start_offset = 100
    committed_offset = 500


@pytest.mark.parametrize(("from_offset", "to_offset", "expected"), [
    (100, 0, (100, 500)), (150, 10_000, (150, 500)), (600, 0, (600, 500)), (50, 50, (50, 50)),
])
def test_the_range_a_read_covers(from_offset: int, to_offset: int, expected: tuple[int, int]) -> None:
    request = fast.ReadRequest(topic="/default/t", from_offset=from_offset, to_offset=to_offset)
    assert read_range(request, _Trimmed()) == expected


def test_a_read_below_the_first_stored_offset_is_out_of_range() -> None:
    with pytest.raises(ApiError) as below:
        read_range(fast.ReadRequest(topic="/default/t", from_offset=40, to_offset=0), _Trimmed())
    assert below.value.grpc_code == "OUT_OF_RANGE"
    assert "offset 40" in str(below.value) and "first readable offset is 100" in str(below.value)

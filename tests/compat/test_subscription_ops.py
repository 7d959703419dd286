"""Day-two operations on subscriptions (docs/SUBSCRIPTIONS.md) against the broker subprocess: seek by offset,
time, earliest, latest and shift while the official client's and our fast consumers stay connected; skip;
peek that changes nothing; a subscription created at a position before its first consumer; the moves kept
across a restart; partitioned topics; browsing a topic's records without a subscription; the CLI's JSON;
message expiry; and the refusals, each naming what was wrong."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from typing import Any

import grpc
import pytest
from compat_support import Session, offsets, payloads, run_async, send_all
from danube import SubType
from prometheus_client.parser import text_string_to_metric_families

from danube_fast.client import FastConsumer, FastProducer
from danube_fast.codec import frames
from danube_fast.proto import PolicyAdmin_pb2 as policy_pb
from danube_fast.proto import PolicyAdmin_pb2_grpc as policy_grpc
from danube_fast.proto import SubscriptionAdmin_pb2 as pb
from danube_fast.proto import SubscriptionAdmin_pb2_grpc as pb_grpc
from danube_fast.testing.broker import Broker, BrokerFactory

CLI = [sys.executable, "-m", "danube_fast.cli.main"]


class Admin:
    """SubscriptionAdmin on the broker's admin port."""

    def __init__(self, broker: Broker) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}")
        self.stub: Any = pb_grpc.SubscriptionAdminStub(self.channel)  # type: ignore[no-untyped-call]

    async def seek(self, topic: str, sub: str, **to: Any) -> list[pb.Position]:
        return list((await self.stub.Seek(pb.SeekRequest(topic=topic, subscription=sub, **to),
                                          timeout=10)).positions)

    async def describe(self, topic: str, sub: str) -> pb.SubscriptionState:
        got = await self.stub.Describe(pb.DescribeRequest(topic=topic, subscription=sub), timeout=10)
        return got.partitions[0]

    async def refused(self, method: str, request: Any) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await getattr(self.stub, method)(request, timeout=10)
        return e.value

    async def settled(self, topic: str, sub: str, backlog: int = 0, timeout: float = 30.0) -> None:
        """Wait until every partition's backlog is `backlog` (0: the acks sent have reached the broker)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            got = await self.stub.Describe(pb.DescribeRequest(topic=topic, subscription=sub), timeout=10)
            if sum(p.backlog for p in got.partitions) == backlog:
                return
            assert asyncio.get_running_loop().time() < deadline, f"{topic} {sub}: backlog {got}"
            await asyncio.sleep(0.05)

    async def browse(self, topic: str, **start: Any) -> tuple[list[int], list[tuple[str, int, int]]]:
        """The offsets of a Browse page and its ranges."""
        got = await self.stub.Browse(pb.BrowseRequest(topic=topic, **start), timeout=10)
        return ([r.offset for r in got.records],
                [(r.stored_topic, r.start_offset, r.end_offset) for r in got.ranges])

    async def close(self) -> None:
        await self.channel.close()


def admin_cli(broker: Broker, *args: str, code: int = 0) -> Any:
    done = subprocess.run([*CLI, "admin", "subscriptions", *args, "--admin-addr",
                           f"127.0.0.1:{broker.admin_port}", "--output", "json"], capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == code, f"{args}: exit {done.returncode}\n{done.stdout!r}\n{done.stderr.decode()}"
    return json.loads(done.stdout) if code == 0 else done.stderr.decode()


async def ack_all(consumer: Any, messages: list[Any]) -> None:
    for m in messages:
        await consumer.ack(m)


@pytest.mark.parametrize("kind", [SubType.EXCLUSIVE, SubType.FAILOVER], ids=["exclusive", "failover"])
def test_seek_moves_connected_official_consumers_back_by_time_and_forward(broker: Broker, topic: str,
                                                                          kind: Any) -> None:
    """An Exclusive (or Failover) consumer that acknowledged everything gets every record from a time on
    again, in order, on the stream it has; then seek by offset, shift and latest; describe shows each
    position."""

    async def scenario() -> None:
        admin = Admin(broker)
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            consumer = await s.consumer(topic, "c", "sub", kind)
            sent = [b"r-%d" % i for i in range(20)]
            for i, payload in enumerate(sent):
                await send_all(producer, [payload])
                if i == 9:
                    await asyncio.sleep(0.05)  # offset 10 is the first published after a clear gap
            got = await consumer.get_n(20)
            assert offsets(got) == list(range(20))
            await ack_all(consumer, got)
            moved = await admin.seek(topic, "sub", time_ms=got[10].publish_time)
            assert [(p.from_offset, p.to_offset, p.records, p.moved) for p in moved] == [(20, 10, -10, True)]
            again = await consumer.get_n(10)
            assert offsets(again) == list(range(10, 20)) and payloads(again) == sent[10:]
            await ack_all(consumer, again)

            await admin.seek(topic, "sub", offset=15)
            again = await consumer.get_n(5)
            assert offsets(again) == list(range(15, 20))
            state = await admin.describe(topic, "sub")
            assert (state.position, state.end_offset, state.served_by) == (15, 20, "per_message")
            assert state.type == ("Exclusive" if kind == SubType.EXCLUSIVE else "Failover")
            assert [(c.name, c.active) for c in state.consumers] == [("c", True)]
            await admin.seek(topic, "sub", shift=-3)  # held messages go back: 12 on, in order
            again = await consumer.get_n(8)
            assert offsets(again) == list(range(12, 20))
            await ack_all(consumer, again)
            await admin.settled(topic, "sub")
            assert (await admin.describe(topic, "sub")).position == 20
            moved = await admin.seek(topic, "sub", earliest=True, dry_run=True)
            assert [(p.from_offset, p.to_offset, p.records, p.moved) for p in moved] == [(20, 0, -20, False)]
            await consumer.expect_silence(0.5)  # a dry run moves nothing
            await admin.seek(topic, "sub", latest=True)
            await send_all(producer, [b"after"])
            assert payloads(await consumer.get_n(1)) == [b"after"]
        await admin.close()

    run_async(scenario())


def test_seek_a_shared_subscription_with_two_consumers(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        admin = Admin(broker)
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            a = await s.consumer(topic, "a", "shared", SubType.SHARED)
            b = await s.consumer(topic, "b", "shared", SubType.SHARED)
            await send_all(producer, [b"s-%d" % i for i in range(10)])
            got: list[Any] = []
            while len(got) < 10:
                for c in (a, b):
                    while not c.queue.empty():
                        m = c.queue.get_nowait()
                        got.append(m)
                        await c.ack(m)
                await asyncio.sleep(0.05)
            await admin.settled(topic, "shared")
            await admin.seek(topic, "shared", earliest=True)
            again: list[Any] = []
            for _ in range(100):
                for c in (a, b):
                    while not c.queue.empty():
                        again.append(c.queue.get_nowait())
                if len(again) >= 10:
                    break
                await asyncio.sleep(0.05)
            assert sorted(offsets(again)) == list(range(10))
        await admin.close()

    run_async(scenario())


def test_a_fast_consumer_follows_a_seek_and_a_skip(broker: Broker, topic: str) -> None:
    """The fast stream ends with UNAVAILABLE saying why; FastConsumer subscribes again at the position."""

    async def scenario() -> None:
        admin = Admin(broker)
        producer = await FastProducer.connect(broker.target, topic, "p", reliable=True)
        for b in range(5):
            await producer.send_batch([b"f-%d" % (b * 10 + i) for i in range(10)])
        await producer.flush()
        consumer = await FastConsumer.connect(broker.target, topic, "fsub", "c", initial_position="earliest")
        assert consumer.start_offset == 0
        stream = consumer.records()
        first = [await asyncio.wait_for(anext(stream), 5) for _ in range(50)]
        assert [r.offset for r in first] == list(range(50))
        await consumer.ack_cumulative(49)
        await admin.settled(topic, "fsub")
        await admin.seek(topic, "fsub", offset=20)
        again = [await asyncio.wait_for(anext(stream), 10) for _ in range(30)]
        assert [r.offset for r in again] == list(range(20, 50))
        assert consumer.reconnects == 1 and consumer.start_offset == 20
        state = await admin.describe(topic, "fsub")
        assert state.served_by == "batches"
        moved = list((await admin.stub.Skip(pb.SkipRequest(topic=topic, subscription="fsub", records=25),
                                            timeout=10)).positions)
        assert [(p.from_offset, p.to_offset, p.records) for p in moved] == [(20, 45, 25)]
        rest = [await asyncio.wait_for(anext(stream), 10) for _ in range(5)]
        assert [r.offset for r in rest] == list(range(45, 50))
        await consumer.close()
        await producer.close()
        await admin.close()

    run_async(scenario())


def test_skip_and_peek_then_a_restart_keeps_the_position(broker_factory: BrokerFactory, topic: str) -> None:
    broker = broker_factory.start()

    async def fill_and_move() -> None:
        admin = Admin(broker)
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            consumer = await s.consumer(topic, "c", "sub", SubType.EXCLUSIVE)
            await consumer.close()  # the subscription exists; nobody consumes
            await send_all(producer, [b"k-%d" % i for i in range(30)])
        peeked = await admin.stub.Peek(pb.PeekRequest(topic=topic, subscription="sub", count=3), timeout=10)
        assert [(r.offset, r.payload) for r in peeked.records] == [(0, b"k-0"), (1, b"k-1"), (2, b"k-2")]
        assert peeked.records[0].producer_name == "p" and peeked.records[0].publish_time_ms > 0
        assert (await admin.describe(topic, "sub")).position == 0  # peeking changed nothing
        assert metric(broker, "danube_subscription_redelivered_total", topic, "sub") == 0
        moved = await admin.stub.Skip(pb.SkipRequest(topic=topic, subscription="sub", records=12), timeout=10)
        assert [(p.from_offset, p.to_offset) for p in moved.positions] == [(0, 12)]
        peeked = await admin.stub.Peek(pb.PeekRequest(topic=topic, subscription="sub"), timeout=10)
        assert [r.offset for r in peeked.records] == [12]
        await admin.close()

    run_async(fill_and_move())
    broker.restart()

    async def after_restart() -> None:
        async with Session(broker.url) as s:
            consumer = await s.consumer(topic, "c", "sub", SubType.EXCLUSIVE)
            got = await consumer.get_n(18)
            assert offsets(got) == list(range(12, 30))
            await ack_all(consumer, got)
        admin = Admin(broker)
        moved = await admin.stub.Skip(pb.SkipRequest(topic=topic, subscription="sub", all=True), timeout=10)
        assert [(p.to_offset, p.records) for p in moved.positions] == [(30, 0)]
        await admin.close()

    run_async(after_restart())


def test_create_at_earliest_for_the_official_client(broker: Broker, topic: str) -> None:
    """The official client's new subscriptions start at the end; one created first by an operator at
    earliest (or an offset) gives the client everything from there, without a change to its wire."""

    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            await send_all(producer, [b"e-%d" % i for i in range(8)])
            admin = Admin(broker)
            made = await admin.stub.Create(pb.CreateRequest(topic=topic, subscription="from-start",
                                                            earliest=True, subscription_type=1), timeout=10)
            assert [(p.to_offset, p.moved) for p in made.positions] == [(0, True)]
            await admin.stub.Create(pb.CreateRequest(topic=topic, subscription="from-5", offset=5),
                                    timeout=10)
            error = await admin.refused("Create", pb.CreateRequest(topic=topic, subscription="from-5",
                                                                   latest=True))
            assert error.code() == grpc.StatusCode.ALREADY_EXISTS and "from-5" in (error.details() or "")
            state = await admin.describe(topic, "from-start")
            assert (state.type, state.position, state.backlog, list(state.consumers)) == ("Shared", 0, 8, [])
            consumer = await s.consumer(topic, "c", "from-start", SubType.SHARED)
            assert payloads(await consumer.get_n(8)) == [b"e-%d" % i for i in range(8)]
            other = await s.consumer(topic, "d", "from-5", SubType.EXCLUSIVE)
            assert offsets(await other.get_n(3)) == [5, 6, 7]
            await admin.close()

    run_async(scenario())


def test_partitioned_topic_seeks_every_partition(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True, partitions=2)
            consumer = await s.consumer(topic, "c", "sub", SubType.EXCLUSIVE)
            await send_all(producer, [b"p-%d" % i for i in range(10)])
            got = await consumer.get_n(10)
            await ack_all(consumer, got)
            admin = Admin(broker)
            await admin.settled(topic, "sub")
            moved = await admin.seek(topic, "sub", earliest=True)
            assert [p.stored_topic for p in moved] == [f"{topic}-part-0", f"{topic}-part-1"]
            assert sum(-p.records for p in moved) == 10
            again = await consumer.get_n(10)
            assert sorted(payloads(again)) == sorted(payloads(got))
            # Browse: each partition answers, with its own range.
            parts = [f"{topic}-part-0", f"{topic}-part-1"]
            page = await admin.stub.Browse(pb.BrowseRequest(topic=topic, earliest=True, count=100),
                                           timeout=10)
            ends = {r.stored_topic: r.end_offset for r in page.ranges}
            assert [r.stored_topic for r in page.ranges] == parts and sum(ends.values()) == 10
            assert [(r.stored_topic, r.offset) for r in page.records] == [
                (p, o) for p in parts for o in range(ends[p])]
            assert sorted(r.payload for r in page.records) == sorted(payloads(got))
            last = await admin.stub.Browse(pb.BrowseRequest(topic=topic, latest=True, backward=True),
                                           timeout=10)
            assert [(r.stored_topic, r.offset) for r in last.records] == [(p, ends[p] - 1) for p in parts]
            await admin.close()

    run_async(scenario())


def test_browse_pages_forwards_and_backwards_by_offset_time_and_ends(broker: Broker, topic: str) -> None:
    """Six batches of five records: pages cross batches, backward pages come in offset order, paging either
    way visits every record once, and nothing about the topic's subscriptions changes."""

    async def scenario() -> None:
        admin = Admin(broker)
        producer = await FastProducer.connect(broker.target, topic, "p", reliable=True)
        for b in range(6):
            await producer.send_batch([b"b-%d" % (b * 5 + i) for i in range(5)])
            await producer.flush()
            if b == 2:
                await asyncio.sleep(0.05)  # offset 15 is the first published after a clear gap
        await admin.stub.Create(pb.CreateRequest(topic=topic, subscription="watch", earliest=True),
                                timeout=10)
        ranges = [(topic, 0, 30)]

        assert await admin.browse(topic, offset=3, count=4) == ([3, 4, 5, 6], ranges)
        assert await admin.browse(topic, offset=27, count=10) == ([27, 28, 29], ranges)
        assert await admin.browse(topic, offset=12, count=4, backward=True) == ([8, 9, 10, 11], ranges)
        assert await admin.browse(topic, offset=3, count=10, backward=True) == ([0, 1, 2], ranges)
        assert await admin.browse(topic, earliest=True) == ([0], ranges)  # count 0 means 1
        assert await admin.browse(topic, earliest=True, backward=True) == ([], ranges)
        assert await admin.browse(topic, latest=True, count=5) == ([], ranges)
        assert await admin.browse(topic, latest=True, count=7, backward=True) == (list(range(23, 30)), ranges)
        assert await admin.browse(topic, offset=30, count=2, backward=True) == ([28, 29], ranges)

        page = await admin.stub.Browse(pb.BrowseRequest(topic=topic, offset=14, count=2), timeout=10)
        assert [(r.stored_topic, r.payload, r.producer_name) for r in page.records] == [
            (topic, b"b-14", "p"), (topic, b"b-15", "p")]
        published = page.records[1].publish_time_ms
        assert page.records[0].publish_time_ms < published
        assert await admin.browse(topic, time_ms=published, count=5) == (list(range(15, 20)), ranges)
        assert await admin.browse(topic, time_ms=published, count=2, backward=True) == ([13, 14], ranges)
        assert await admin.browse(topic, time_ms=0, count=1) == ([0], ranges)

        forward: list[int] = []
        got, _ = await admin.browse(topic, earliest=True, count=7)
        while got:
            forward += got
            got, _ = await admin.browse(topic, offset=got[-1] + 1, count=7)
        assert forward == list(range(30))
        backward: list[int] = []
        got, _ = await admin.browse(topic, latest=True, count=7, backward=True)
        while got:
            backward = got + backward
            got, _ = await admin.browse(topic, offset=got[0], count=7, backward=True)
        assert backward == list(range(30))

        state = await admin.describe(topic, "watch")
        assert (state.position, state.backlog, state.unacked) == (0, 30, 0)  # browsing moved nothing
        listed = await admin.stub.List(pb.ListRequest(topic=topic), timeout=10)
        assert [s.subscription for s in listed.partitions] == ["watch"]  # and created nothing
        await producer.close()
        await admin.close()

    run_async(scenario())


def test_refusals_name_what_was_wrong_and_change_nothing(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            consumer = await s.consumer(topic, "c", "sub", SubType.EXCLUSIVE)
            await send_all(producer, [b"x-%d" % i for i in range(5)])
            await ack_all(consumer, await consumer.get_n(5))
            live = await s.producer(topic + "-live", "p")  # NonReliable
            await s.consumer(topic + "-live", "c", "sub", SubType.EXCLUSIVE)
            await send_all(live, [b"y"])
        admin = Admin(broker)
        await admin.settled(topic, "sub")
        cases = [
            ("Seek", pb.SeekRequest(topic=topic, subscription="sub", offset=6),
             grpc.StatusCode.INVALID_ARGUMENT, "offset 6, outside"),
            ("Seek", pb.SeekRequest(topic=topic, subscription="sub", shift=-6),
             grpc.StatusCode.INVALID_ARGUMENT, "shift -6"),
            ("Seek", pb.SeekRequest(topic=topic, subscription="sub", time_ms=2**62),
             grpc.StatusCode.INVALID_ARGUMENT, "in the future"),
            ("Seek", pb.SeekRequest(topic=topic, subscription="sub"), grpc.StatusCode.INVALID_ARGUMENT,
             "needs one of"),
            ("Seek", pb.SeekRequest(topic=topic, subscription="nope", earliest=True),
             grpc.StatusCode.NOT_FOUND, "'nope'"),
            ("Seek", pb.SeekRequest(topic="/default/no-such-topic", subscription="sub", earliest=True),
             grpc.StatusCode.NOT_FOUND, "no-such-topic"),
            ("Seek", pb.SeekRequest(topic=topic + "-live", subscription="sub", earliest=True),
             grpc.StatusCode.FAILED_PRECONDITION, "NonReliable"),
            ("Skip", pb.SkipRequest(topic=topic, subscription="sub"), grpc.StatusCode.INVALID_ARGUMENT,
             "records or all"),
            ("Peek", pb.PeekRequest(topic=topic, subscription="sub", count=1001),
             grpc.StatusCode.INVALID_ARGUMENT, "1001"),
            ("Create", pb.CreateRequest(topic=topic, subscription="new", offset=99),
             grpc.StatusCode.INVALID_ARGUMENT, "offset 99"),
            ("Create", pb.CreateRequest(topic=topic, subscription="new", subscription_type=7),
             grpc.StatusCode.INVALID_ARGUMENT, "type 7"),
            ("Browse", pb.BrowseRequest(topic=topic, count=3), grpc.StatusCode.INVALID_ARGUMENT,
             "needs one of"),
            ("Browse", pb.BrowseRequest(topic=topic, earliest=True, count=1001),
             grpc.StatusCode.INVALID_ARGUMENT, "count 1001"),
            ("Browse", pb.BrowseRequest(topic=topic, offset=6, backward=True),
             grpc.StatusCode.INVALID_ARGUMENT, "offset 6, outside what"),
            ("Browse", pb.BrowseRequest(topic=topic, offset=6), grpc.StatusCode.INVALID_ARGUMENT,
             "0 (the first kept) to 5 (the end"),
            ("Browse", pb.BrowseRequest(topic=topic, time_ms=2**62), grpc.StatusCode.INVALID_ARGUMENT,
             "in the future"),
            ("Browse", pb.BrowseRequest(topic="/default/no-such-topic", latest=True),
             grpc.StatusCode.NOT_FOUND, "no-such-topic"),
            ("Browse", pb.BrowseRequest(topic=topic + "-live", earliest=True),
             grpc.StatusCode.FAILED_PRECONDITION, "NonReliable"),
        ]
        for method, request, code, words in cases:
            error = await admin.refused(method, request)
            assert error.code() == code and words in (error.details() or ""), (method, request, error)
        assert (await admin.describe(topic, "sub")).position == 5
        # A NonReliable topic's subscriptions are listed and described, without a position.
        listed = await admin.stub.List(pb.ListRequest(topic=topic + "-live"), timeout=10)
        assert [(s.subscription, s.served_by, s.position, s.end_offset) for s in listed.partitions] == [
            ("sub", "live", 0, 0)]
        assert (await admin.describe(topic + "-live", "sub")).type == "Exclusive"
        await admin.close()

    run_async(scenario())


def test_the_cli_seeks_skips_peeks_and_describes_in_json(broker: Broker, topic: str) -> None:
    async def fill() -> None:
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            consumer = await s.consumer(topic, "c", "sub", SubType.EXCLUSIVE)
            await consumer.close()
            await send_all(producer, [b"c-%d" % i for i in range(6)])

    run_async(fill())
    listed = admin_cli(broker, "list", topic)["subscriptions"]
    assert [(s["subscription"], s["type"], s["position"], s["backlog"], s["consumers"]) for s in listed] == [
        ("sub", "Exclusive", 0, 6, 0)]
    peeked = admin_cli(broker, "peek", topic, "sub", "--count", "2")["records"]
    assert [(r["offset"], r["payload"], r["producer_name"]) for r in peeked] == [(0, "c-0", "p"),
                                                                                  (1, "c-1", "p")]
    dry = admin_cli(broker, "skip", topic, "sub", "--count", "4", "--dry-run")["positions"]
    assert [(p["from_offset"], p["to_offset"], p["records"], p["moved"]) for p in dry] == [(0, 4, 4, False)]
    assert admin_cli(broker, "seek", topic, "sub", "--latest")["positions"][0]["to_offset"] == 6
    assert admin_cli(broker, "seek", topic, "sub", "--time", "2000-01-01T00:00:00")["positions"][0][
        "to_offset"] == 0
    browsed = admin_cli(broker, "browse", topic, "--latest", "--backward", "--count", "2")
    assert [(r["offset"], r["payload"], r["producer_name"]) for r in browsed["records"]] == [(4, "c-4", "p"),
                                                                                           (5, "c-5", "p")]
    assert browsed["ranges"] == [{"stored_topic": topic, "start_offset": 0, "end_offset": 6}]
    browsed = admin_cli(broker, "browse", topic, "--time", "2000-01-01T00:00:00", "--count", "3")
    assert [r["offset"] for r in browsed["records"]] == [0, 1, 2]
    assert [r["offset"] for r in admin_cli(broker, "browse", topic, "--offset", "5")["records"]] == [5]
    assert "offset 9, outside" in admin_cli(broker, "browse", topic, "--offset", "9", code=1)
    described = admin_cli(broker, "describe", topic, "sub")["partitions"]
    assert [(d["position"], d["backlog"], d["type"]) for d in described] == [(0, 6, "Exclusive")]
    made = admin_cli(broker, "create", topic, "late", "--position", "3", "--type", "shared")["positions"]
    assert made[0]["to_offset"] == 3
    error = admin_cli(broker, "seek", topic, "sub", "--offset", "7", code=1)
    assert "offset 7, outside" in error
    assert "ISO 8601" in subprocess.run([*CLI, "admin", "subscriptions", "seek", topic, "sub", "--time", "x"],
                                        capture_output=True, timeout=60, check=False).stderr.decode()


def test_fast_consumer_initial_position(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        producer = await FastProducer.connect(broker.target, topic, "p", reliable=True)
        await producer.send_batch([b"i-%d" % i for i in range(4)])
        await producer.flush()
        latest = await FastConsumer.connect(broker.target, topic, "late", "c")
        earliest = await FastConsumer.connect(broker.target, topic, "early", "c", initial_position="earliest")
        assert (latest.start_offset, earliest.start_offset) == (4, 0)
        got = await asyncio.wait_for(anext(earliest.batches()), 5)
        assert [r.payload for r in frames.decode_records(got.data)] == [b"i-%d" % i for i in range(4)]
        with pytest.raises(ValueError, match="initial_position"):
            FastConsumer(broker.target, topic, "x", "c", initial_position="middle")
        for c in (latest, earliest):
            await c.close()
        await producer.close()

    run_async(scenario())


def test_message_ttl_expires_what_a_forgotten_subscription_holds(broker_factory: BrokerFactory,
                                                                  topic: str) -> None:
    """messageTTLInSeconds on the topic: the next retention pass acknowledges, for the subscription nobody
    reads, the records older than the TTL, counts them in a metric, and leaves a live consumer's newer
    records to it; retention deletes nothing for it."""
    broker = broker_factory.start("[broker]\nretention_check_ms = 200\n")

    async def scenario() -> None:
        admin = Admin(broker)
        async with Session(broker.url) as s:
            producer = await s.producer(topic, "p", reliable=True)
            forgotten = await s.consumer(topic, "f", "forgotten", SubType.EXCLUSIVE)
            await forgotten.close()
            live = await s.consumer(topic, "c", "live", SubType.EXCLUSIVE)
            await send_all(producer, [b"old-%d" % i for i in range(5)])
            assert offsets(await live.get_n(5)) == list(range(5))  # delivered, not acknowledged
            await asyncio.sleep(1.2)
            await send_all(producer, [b"new-%d" % i for i in range(3)])
            assert offsets(await live.get_n(3)) == [5, 6, 7]
            assert (await admin.describe(topic, "forgotten")).position == 0  # no TTL yet: nothing expires
            set_ttl = subprocess.run([*CLI, "admin", "policies", "set", topic, "--message-ttl-seconds", "1",
                                      "--admin-addr", f"127.0.0.1:{broker.admin_port}"], capture_output=True,
                                     timeout=60, check=False)
            assert set_ttl.returncode == 0, set_ttl.stderr.decode()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
                policies: Any = policy_grpc.PolicyAdminStub(channel)  # type: ignore[no-untyped-call]
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await policies.SetTopicPolicy(policy_pb.SetTopicPolicyRequest(
                        topic=topic, changes='{"messageTTLInSeconds": -5}'), timeout=10)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "messageTTLInSeconds" in (refused.value.details() or "")
            for _ in range(100):
                if (await admin.describe(topic, "forgotten")).position == 5:
                    break
                await asyncio.sleep(0.1)
            assert (await admin.describe(topic, "forgotten")).position == 5
            assert (await admin.describe(topic, "live")).position == 5  # its unacknowledged old ones expired
            # The live consumer is told: what it held goes back, and the next delivery is at the new position.
            again = await live.get_n(3)
            assert offsets(again) == [5, 6, 7]
        await admin.close()
        assert metric(broker, "danube_subscription_expired_total", topic, "forgotten") == 5

    run_async(scenario())


def metric(broker: Broker, name: str, topic: str, subscription: str) -> float:
    """A subscription's sample on the broker's metrics endpoint; -1 when it has none."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == {"topic": topic, "subscription": subscription}:
                return sample.value
    return -1

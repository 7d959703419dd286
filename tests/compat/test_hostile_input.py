"""Hostile and unlucky input against a real broker process: no request may stop the broker from restarting,
each gets a clear status with a short message, and a topic that cannot be loaded is left out alone.

Names are bounded (docs in danube_fast/names.py): namespace 64 bytes, topic 192, every other name
256, no control characters; refused before anything is created. Malformed or truncated requests get
INVALID_ARGUMENT and a rate-limited log line (danube_fast/broker/services/wire_guard.py).
"""

from __future__ import annotations

import asyncio
import shutil
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from compat_support import RawApi, bounded, rpc_error, run_async, status_line

from danube_fast.proto import DanubeAdmin_pb2 as admin
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import FastApi_pb2 as fast
from danube_fast.proto import FastApi_pb2_grpc as fast_grpc
from danube_fast.proto import SchemaRegistry_pb2 as schema
from danube_fast.proto import SchemaRegistry_pb2_grpc as schema_grpc
from danube_fast.testing.broker import Broker, BrokerFactory

Code = grpc.StatusCode
MAX_DETAILS = 1024  # an error message must stay far below the client's 8 KB metadata limit
HUGE = "x" * 10_000
MEGA = "n" * 1_000_000


def expect_invalid(error: Any, what: str) -> None:
    assert error.code() == Code.INVALID_ARGUMENT, f"{what}: {status_line(error)}"
    assert len(error.details()) < MAX_DETAILS, f"{what}: a {len(error.details())}-byte message"


def lookup(api: RawApi, topic: str) -> Any:
    return api.discovery.TopicLookup(pb.TopicLookupRequest(request_id=api.next_id(), topic=topic))


class Stubs:
    def __init__(self, broker: Broker) -> None:
        self.admin_channel = grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}")
        self.topics: Any = admin_grpc.TopicAdminStub(self.admin_channel)  # type: ignore[no-untyped-call]
        self.namespaces: Any = admin_grpc.NamespaceAdminStub(self.admin_channel)  # type: ignore[no-untyped-call]
        self.schema: Any = schema_grpc.SchemaRegistryStub(self.admin_channel)  # type: ignore[no-untyped-call]
        self.client_channel = grpc.aio.insecure_channel(broker.target)
        self.fast: Any = fast_grpc.FastProducerStub(self.client_channel)  # type: ignore[no-untyped-call]
        self.fast_consumer: Any = fast_grpc.FastConsumerStub(self.client_channel)  # type: ignore[no-untyped-call]

    async def fast_open(self, topic: str, name: str) -> Any:
        call = self.fast.Produce()
        await call.write(fast.ProduceRequest(open=fast.Open(topic=topic, producer_name=name, reliable=True)))
        return await call.read()

    async def fast_subscribe(self, topic: str, subscription: str, name: str) -> Any:
        call = self.fast_consumer.Consume()
        await call.write(fast.ConsumeRequest(subscribe=fast.Subscribe(topic=topic, subscription=subscription,
                                                                      consumer_name=name)))
        return await call.read()

    async def close(self) -> None:
        await self.admin_channel.close()
        await self.client_channel.close()


# --- names ------------------------------------------------------------------------------------------------


def test_a_long_topic_name_is_refused_and_the_broker_still_restarts(broker_factory: BrokerFactory) -> None:
    """At 61f1986 a 256+ character topic was committed to the metadata, its WAL failed to open ("File name
    too long"), and every later start failed on it."""
    broker = broker_factory.start()
    names = ["/default/" + "t" * 193, "/default/" + "t" * 300, "/" + "n" * 65 + "/t", "/default/" + HUGE,
             "/default/" + "é" * 100]  # 100 characters, 200 bytes

    async def scenario() -> None:
        async with RawApi(broker.target) as api:
            s = Stubs(broker)
            try:
                for name in names:
                    expect_invalid(await rpc_error(api.create_producer(name, "p", reliable=True),
                                                   "CreateProducer"), f"CreateProducer {name[:20]}")
                    e = await rpc_error(s.fast_open(name, "p"), "fast Open")
                    expect_invalid(e, f"fast Open {name[:20]}")
                    e = await rpc_error(s.topics.CreateTopic(admin.NewTopicRequest(
                        name=name, dispatch_strategy=1)), "CreateTopic")
                    expect_invalid(e, f"CreateTopic {name[:20]}")
                    e = await rpc_error(lookup(api, name), "TopicLookup")
                    expect_invalid(e, f"TopicLookup {name[:20]}")
                # The longest valid name works, and so do its dead letters' and partitions' names.
                longest = "/default/" + "t" * 192
                await api.create_producer(longest, "p", reliable=True)
                # A partitioned topic whose last partition's name would be too long creates nothing:
                # 185 + len("-part-9") = 192 fits, "-part-10" does not.
                base = "/default/" + "q" * 185
                e = await rpc_error(s.topics.CreatePartitionedTopic(admin.PartitionedTopicRequest(
                    base_name=base, partitions=11, dispatch_strategy=1)), "CreatePartitionedTopic")
                expect_invalid(e, "CreatePartitionedTopic with too long partition names")
                e = await rpc_error(lookup(api, base + "-part-0"), "lookup of a partition never created")
                assert e.code() == Code.NOT_FOUND, status_line(e)
                e = await rpc_error(s.topics.CreatePartitionedTopic(admin.PartitionedTopicRequest(
                    base_name="/default/many", partitions=100_000, dispatch_strategy=1)),
                    "100,000 partitions")
                expect_invalid(e, "CreatePartitionedTopic with 100,000 partitions")
            finally:
                await s.close()

    run_async(scenario())
    broker.restart()
    broker.restart()  # twice: the first restart must not have left anything behind either

    async def after() -> None:
        async with RawApi(broker.target) as api:
            await api.create_producer("/default/" + "t" * 192, "p", reliable=True)

    run_async(after())


def test_client_chosen_names_are_bounded_on_every_api(broker: Broker, topic: str) -> None:
    """Producer, consumer, subscription and namespace names and schema subjects: 1 MB, NUL or a control
    character are refused with a short INVALID_ARGUMENT, and a refused producer leaves no topic behind."""

    async def scenario() -> None:
        async with RawApi(broker.target) as api:
            s = Stubs(broker)
            try:
                fresh = topic + "_fresh"
                for bad in (MEGA, "p\x00q", "p\nq", "x" * 257):
                    e = await rpc_error(api.create_producer(fresh, bad, reliable=True), "CreateProducer")
                    expect_invalid(e, f"producer name {bad[:10]!r}")
                    expect_invalid(await rpc_error(s.fast_open(fresh, bad), "fast Open"),
                                   f"fast producer name {bad[:10]!r}")
                e = await rpc_error(lookup(api, fresh), "lookup after refused producers")
                assert e.code() == Code.NOT_FOUND, f"a refused producer created its topic: {status_line(e)}"

                await api.create_producer(topic, "p", reliable=True)
                for bad in (MEGA, "s\x00", "a/b", "x" * 257):
                    expect_invalid(await rpc_error(api.subscribe(topic, "c", bad), "Subscribe"),
                                   f"subscription {bad[:10]!r}")
                    expect_invalid(await rpc_error(s.fast_subscribe(topic, bad, "c"), "fast Subscribe"),
                                   f"fast subscription {bad[:10]!r}")
                for bad in (MEGA, "c\x00", "c\x7f"):
                    expect_invalid(await rpc_error(api.subscribe(topic, bad, "s"), "Subscribe"),
                                   f"consumer name {bad[:10]!r}")
                    expect_invalid(await rpc_error(s.fast_subscribe(topic, "s", bad), "fast Subscribe"),
                                   f"fast consumer name {bad[:10]!r}")
                for bad in (HUGE, "n" * 65, "a\x00b"):
                    e = await rpc_error(s.namespaces.CreateNamespace(admin.NamespaceRequest(name=bad)),
                                        "CreateNamespace")
                    expect_invalid(e, f"namespace {bad[:10]!r}")
                for bad in (HUGE, "a\x00b", "a/b"):
                    e = await rpc_error(s.schema.RegisterSchema(schema.RegisterSchemaRequest(
                        subject=bad, schema_type="json_schema", schema_definition=b'{"type": "object"}')),
                        "RegisterSchema")
                    expect_invalid(e, f"subject {bad[:10]!r}")
                # Names that exist nowhere are quoted short in NOT_FOUND and INTERNAL answers too.
                ack = pb.AckRequest(request_id=1, subscription_name=HUGE,
                                    msg_id=pb.MsgID(topic_name=topic, topic_offset=0))
                e = await rpc_error(api.consumer.Ack(ack), "Ack on a huge subscription name")
                assert len(e.details()) < MAX_DETAILS, status_line(e)
                e = await rpc_error(s.topics.Unsubscribe(admin.SubscriptionRequest(
                    topic=topic, subscription=HUGE)), "Unsubscribe of a huge subscription name")
                assert len(e.details()) < MAX_DETAILS, status_line(e)
                e = await rpc_error(s.schema.GetLatestSchema(schema.GetLatestSchemaRequest(subject=HUGE)),
                                    "GetLatestSchema of a huge subject")
                assert e.code() == Code.NOT_FOUND and len(e.details()) < MAX_DETAILS, status_line(e)
            finally:
                await s.close()

    run_async(scenario())


def test_a_topic_that_cannot_be_loaded_leaves_the_others_served(broker_factory: BrokerFactory) -> None:
    """A WAL that cannot be opened at start costs that topic alone: the broker starts, serves the others
    with their data, and answers for the broken one with FAILED_PRECONDITION saying why."""
    broker = broker_factory.start()
    good, bad = "/default/loads_fine", "/default/cannot_load"

    async def produce() -> None:
        async with RawApi(broker.target) as api:
            for name in (good, bad):
                p = await api.create_producer(name, "p", reliable=True)
                for i in range(3):
                    await bounded(api.producer.SendMessage(pb.StreamMessage(
                        request_id=i + 1, payload=b"m%d" % i, msg_id=pb.MsgID(
                            producer_id=p.producer_id, topic_name=name, broker_addr=broker.url))), "send")

    run_async(produce())
    broker.terminate()
    wal = broker.data_dir / "wal" / "default" / "cannot_load"
    shutil.rmtree(wal)
    wal.write_bytes(b"not a directory")  # the WAL's directory is a file now: opening it fails
    broker.start()

    async def check() -> None:
        async with RawApi(broker.target) as api:
            e = await rpc_error(api.create_producer(bad, "p", reliable=True), "CreateProducer, broken topic")
            assert e.code() == Code.FAILED_PRECONDITION, status_line(e)
            assert "could not be loaded" in e.details(), status_line(e)
            e = await rpc_error(api.subscribe(bad, "c", "s"), "Subscribe to the broken topic")
            assert e.code() == Code.FAILED_PRECONDITION, status_line(e)
            e = await rpc_error(lookup(api, bad), "lookup of the broken topic")
            assert e.code() == Code.FAILED_PRECONDITION, status_line(e)
            # The other topic serves its stored messages.
            await api.create_producer(good, "p", reliable=True)
            c = await api.subscribe(good, "c", "s")
            assert c.consumer_id

    run_async(check())
    assert "cannot load topic /default/cannot_load" in broker.log_tail()
    assert "1 could not be loaded" in broker.log_tail()
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics", timeout=5) as response:
        assert 'danube_topic_load_failed{topic="/default/cannot_load"} 1' in response.read().decode()


def test_creating_a_topic_is_all_or_nothing(broker_factory: BrokerFactory) -> None:
    """When the new topic's WAL cannot be created, its metadata is taken back: the error is answered, the
    broker restarts, and the same topic can be created once the disk allows it."""
    broker = broker_factory.start()

    async def create_namespace() -> None:
        s = Stubs(broker)
        try:
            await bounded(s.namespaces.CreateNamespace(admin.NamespaceRequest(name="blocked")), "namespace")
        finally:
            await s.close()

    run_async(create_namespace())
    blocker = broker.data_dir / "wal" / "blocked"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_bytes(b"a file where the namespace's WAL directory goes")
    topic = "/blocked/t"

    async def refused() -> None:
        async with RawApi(broker.target) as api:
            e = await rpc_error(api.create_producer(topic, "p", reliable=True), "CreateProducer")
            assert e.code() == Code.UNAVAILABLE and "WAL" in e.details(), status_line(e)
            e = await rpc_error(lookup(api, topic), "lookup after the failed creation")
            assert e.code() == Code.NOT_FOUND, status_line(e)

    run_async(refused())
    broker.restart()
    assert "cannot load topic" not in broker.log_tail()
    blocker.unlink()

    async def created() -> None:
        async with RawApi(broker.target) as api:
            await api.create_producer(topic, "p", reliable=True)

    run_async(created())


# --- the wire ---------------------------------------------------------------------------------------------

UNARY = ["/danube.ProducerService/CreateProducer", "/danube.ProducerService/SendMessage",
         "/danube.ConsumerService/Subscribe", "/danube.ConsumerService/Ack", "/danube.ConsumerService/Nack",
         "/danube.Discovery/TopicLookup", "/danube.Discovery/TopicPartitions",
         "/danube.HealthCheck/HealthCheck", "/danube_schema.SchemaRegistry/RegisterSchema",
         "/danube_fast.v1.FastReader/Offsets"]
ADMIN_UNARY = ["/danube_admin.TopicAdmin/CreateTopic", "/danube_admin.NamespaceAdmin/CreateNamespace",
               "/danube_admin.BrokerAdmin/ListBrokers"]
STREAMING = ["/danube.ConsumerService/ReceiveMessages", "/danube_fast.v1.FastProducer/Produce",
             "/danube_fast.v1.FastConsumer/Consume", "/danube_fast.v1.FastReader/Read"]
GARBAGE = b"\x0a\xff\xff\xff\x0f"  # field 1, a length far past the end


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield  # an async generator that sends no message


@pytest.mark.parametrize("port", ["client", "admin"])
def test_malformed_and_truncated_requests_are_invalid_argument(broker: Broker, port: str) -> None:
    """Every method: bytes that do not parse get INVALID_ARGUMENT (not UNKNOWN), and a unary call whose
    request stream ends without a message is answered (grpc.aio alone never answers it)."""
    target = broker.target if port == "client" else f"127.0.0.1:{broker.admin_port}"
    unary = UNARY if port == "client" else ADMIN_UNARY

    async def scenario() -> list[str]:
        problems = []
        async with grpc.aio.insecure_channel(target) as channel:
            for method in unary + (STREAMING if port == "client" else []):
                try:
                    if method in STREAMING:
                        call = channel.stream_stream(method)(iter([GARBAGE]))
                        await asyncio.wait_for(call.read(), 5)
                    else:
                        await asyncio.wait_for(channel.unary_unary(method)(GARBAGE), 5)
                    problems.append(f"{method}: garbage accepted")
                except grpc.aio.AioRpcError as e:
                    if e.code() != Code.INVALID_ARGUMENT:
                        problems.append(f"{method} garbage: {status_line(e)}")
                except TimeoutError:
                    problems.append(f"{method} garbage: no answer in 5 s")
                if method in STREAMING:
                    continue
                try:
                    await asyncio.wait_for(channel.stream_unary(method)(_nothing()), 5)
                    problems.append(f"{method}: an empty request stream was answered OK")
                except grpc.aio.AioRpcError as e:
                    if e.code() != Code.INVALID_ARGUMENT:
                        problems.append(f"{method} empty: {status_line(e)}")
                except TimeoutError:
                    problems.append(f"{method} empty: no answer in 5 s")
        return problems

    problems = run_async(scenario())
    assert not problems, "\n".join(problems)


def test_a_flood_of_bad_calls_logs_a_few_short_lines(broker_factory: BrokerFactory) -> None:
    """300 malformed calls: INVALID_ARGUMENT each, no traceback in the log, a handful of lines."""
    broker = broker_factory.start()
    before = broker.log_tail().count("\n")

    async def flood() -> None:
        async with grpc.aio.insecure_channel(broker.target) as channel:
            send = channel.unary_unary("/danube.ProducerService/SendMessage")
            for _ in range(300):
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await asyncio.wait_for(send(GARBAGE), 5)
                assert raised.value.code() == Code.INVALID_ARGUMENT, status_line(raised.value)

    run_async(flood())
    log = broker.log_tail()
    assert "Traceback" not in log, log
    assert log.count("\n") - before <= 5, log


def test_oversized_metadata_is_refused_and_the_broker_serves_on(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        async with RawApi(broker.target) as api:
            request = pb.TopicLookupRequest(request_id=1, topic=topic)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await asyncio.wait_for(api.discovery.TopicLookup(request, metadata=[("x-big", "v" * 64_000)]),
                                       5)
            assert raised.value.code() != Code.OK
            await api.create_producer(topic, "p", reliable=True)

    run_async(scenario())

"""Bad requests on the raw wire (the client's descriptors): the status code the contract names, a message that
says what was wrong, and a broker that is none the worse for it (docs/WIRE.md C.2-C.11, D.7, D.10-D.12).

After every test the broker must still serve a normal produce/consume, and the reliable messages it
acknowledged at the start of the module must all still be readable (the autouse fixture `still_healthy`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from compat_support import RawApi, Session, bounded, offsets, payloads, rpc_error, run_async, status_line
from danube import SubType

from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.testing.broker import Broker

MAX_MESSAGE_SIZE = 1024
BROKER_CONFIG = f"""
[policy]
max_message_size = {MAX_MESSAGE_SIZE}
"""

Code = grpc.StatusCode
UNKNOWN_ID = 0x5EED_0000_DEAD_BEEF  # ids are random u64s: this one is not in use
PRODUCER = pb.HealthCheckRequest.Producer
CONSUMER = pb.HealthCheckRequest.Consumer
OK = pb.HealthCheckResponse.OK
CLOSE = pb.HealthCheckResponse.CLOSE

BASELINE_TOPIC = "/default/bad_input_baseline"
BASELINE_SUBSCRIPTION = "verify"
BASELINE = [b"baseline-%d" % i for i in range(5)]


@pytest.fixture(scope="module")
def baseline(shared_broker: Broker) -> list[bytes]:
    """Reliable messages acknowledged by the broker before any bad call, on a subscription that never acks
    them, so that every check reads all of them again."""

    async def produce() -> None:
        async with Session(shared_broker.url) as s:
            producer = await s.producer(BASELINE_TOPIC, "baseline", reliable=True)
            consumer = await s.consumer(BASELINE_TOPIC, "verifier", BASELINE_SUBSCRIPTION, settle=0)
            await consumer.close()
            for payload in BASELINE:
                await bounded(producer.send(payload, None), "baseline send")

    run_async(produce())
    return BASELINE


@pytest.fixture(autouse=True)
def still_healthy(broker: Broker, baseline: list[bytes], topic: str) -> Iterator[None]:
    yield
    health_topic = topic + "_health"

    async def check() -> None:
        async with Session(broker.url) as s:
            verifier = await s.consumer(BASELINE_TOPIC, "verifier", BASELINE_SUBSCRIPTION, settle=0)
            got = await verifier.get_n(len(baseline))
            assert payloads(got) == baseline and offsets(got) == list(range(len(baseline))), (
                "the acknowledged reliable data changed")
            await verifier.close()  # without acking: the next check reads them again

            producer = await s.producer(health_topic, "hp")
            consumer = await s.consumer(health_topic, "hc", "hs")
            await bounded(producer.send(b"ping", None), "health send")
            assert bytes((await consumer.get()).payload) == b"ping"

    run_async(check())


def expect(error: Any, code: grpc.StatusCode, *words: str) -> None:
    """`error` has status `code` and its details mention each of `words` (case-insensitive)."""
    details = (error.details() or "").lower()
    assert error.code() == code and all(w.lower() in details for w in words), (
        f"expected {code.name} mentioning {words}, got {status_line(error)}")


# --- topic names and discovery (C.2, C.3) -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["default/t", "/default/a.b", "/default/", "//t", "/a/b/c", "/default/a b"])
def test_invalid_topic_name_is_invalid_argument(broker: Broker, name: str) -> None:
    async def scenario() -> list[str]:
        problems = []
        async with RawApi(broker.target) as api:
            calls = {
                "TopicLookup": api.discovery.TopicLookup(pb.TopicLookupRequest(request_id=1, topic=name)),
                "TopicPartitions": api.discovery.TopicPartitions(
                    pb.TopicLookupRequest(request_id=2, topic=name)),
                "CreateProducer": api.producer.CreateProducer(pb.ProducerRequest(
                    request_id=3, producer_name="p", topic_name=name, dispatch_strategy=pb.Reliable)),
                "Subscribe": api.consumer.Subscribe(pb.ConsumerRequest(
                    request_id=4, topic_name=name, consumer_name="c", subscription="s")),
            }
            for rpc, call in calls.items():
                e = await rpc_error(call, f"{rpc}({name!r})")
                if e.code() != Code.INVALID_ARGUMENT or name not in e.details() or (
                        "invalid" not in e.details().lower()):
                    problems.append(f"{rpc}: {status_line(e)}")
        return problems

    problems = run_async(scenario())
    assert not problems, f"expected INVALID_ARGUMENT saying {name!r} is invalid: {problems}"


def test_lookup_and_partitions(broker: Broker, topic: str) -> None:
    """Unknown topic: lookup NOT_FOUND, partitions []. Known topic: Connect to this broker's URL, no proxy,
    request_id echoed; partitions [topic]."""

    async def scenario() -> None:
        async with RawApi(broker.target) as api:
            e = await rpc_error(api.discovery.TopicLookup(pb.TopicLookupRequest(request_id=7, topic=topic)),
                                "lookup of an unknown topic")
            expect(e, Code.NOT_FOUND, topic)
            unknown = await bounded(api.discovery.TopicPartitions(
                pb.TopicLookupRequest(request_id=8, topic=topic)), "partitions of an unknown topic")
            assert list(unknown.partitions) == [] and unknown.request_id == 8, unknown

            await api.create_producer(topic, "p")
            found = await bounded(api.discovery.TopicLookup(pb.TopicLookupRequest(request_id=9, topic=topic)),
                                  "lookup")
            assert found.response_type == pb.TopicLookupResponse.Connect, found
            assert found.connect_url == broker.url and found.broker_url == broker.url, found
            assert found.proxy is False and found.request_id == 9, found
            known = await bounded(api.discovery.TopicPartitions(
                pb.TopicLookupRequest(request_id=10, topic=topic)), "partitions")
            assert list(known.partitions) == [topic] and known.request_id == 10, known

    run_async(scenario())


# --- CreateProducer and Subscribe (C.4, C.5, C.7) ---------------------------------------------------------


def test_topic_in_a_missing_namespace_is_unavailable(broker: Broker) -> None:
    """Namespaces are never auto-created; the contract's code is UNAVAILABLE (the client retries ~3 s)."""
    topic = "/no_such_namespace/t"

    async def scenario() -> None:
        async with RawApi(broker.target) as api:
            e = await rpc_error(api.create_producer(topic, "p", reliable=True), "CreateProducer")
            expect(e, Code.UNAVAILABLE, "no_such_namespace")
            e = await rpc_error(api.discovery.TopicLookup(pb.TopicLookupRequest(request_id=1, topic=topic)),
                                "lookup after the refusal")
            expect(e, Code.NOT_FOUND)

    run_async(scenario())


def test_subscribe_to_a_missing_topic_is_invalid_argument(broker: Broker, topic: str) -> None:
    """Consumers never create topics (C.4 step 5, D.12)."""

    async def scenario() -> None:
        async with RawApi(broker.target) as api:
            e = await rpc_error(api.subscribe(topic, "c", "s"), "Subscribe to a missing topic")
            assert e.code() == Code.INVALID_ARGUMENT, status_line(e)
            details = e.details().lower()
            assert topic in e.details() or any(w in details for w in ("exist", "missing", "not found")), (
                status_line(e))
            e = await rpc_error(api.discovery.TopicLookup(pb.TopicLookupRequest(request_id=1, topic=topic)),
                                "lookup after the refusal")
            expect(e, Code.NOT_FOUND)

    run_async(scenario())


def test_the_other_dispatch_strategy_is_failed_precondition(broker: Broker, topic: str) -> None:
    """The first producer fixes the topic's strategy; a producer asking for the other one is refused
    (both ways round), and the first producer is unaffected."""
    reliable_topic = topic + "_r"

    async def scenario() -> None:
        async with RawApi(broker.target) as api:
            first = await api.create_producer(topic, "first")
            e = await rpc_error(api.create_producer(topic, "second", reliable=True),
                                "Reliable on NonReliable")
            expect(e, Code.FAILED_PRECONDITION, "strategy")
            await api.create_producer(reliable_topic, "first", reliable=True)
            e = await rpc_error(api.create_producer(reliable_topic, "second"), "NonReliable on Reliable")
            expect(e, Code.FAILED_PRECONDITION, "strategy")
            response = await bounded(api.producer.SendMessage(pb.StreamMessage(
                request_id=77, msg_id=pb.MsgID(producer_id=first.producer_id, topic_name=topic,
                                               broker_addr=broker.url), payload=b"still fine")), "send")
            assert response.request_id == 77

    run_async(scenario())


def test_duplicate_producer_name_returns_the_same_producer(broker: Broker, topic: str) -> None:
    """Idempotent by name, never ALREADY_EXISTS (fatal to the client: D.7)."""

    async def scenario() -> None:
        async with RawApi(broker.target) as api:
            one = await api.create_producer(topic, "twin")
            two = await api.create_producer(topic, "twin")
            other = await api.create_producer(topic, "other")
            assert one.producer_id == two.producer_id != 0, (one, two)
            assert other.producer_id not in (0, one.producer_id), (one, other)
            assert two.producer_name == "twin" and two.request_id == 2, two

    run_async(scenario())


def test_duplicate_consumer_name_returns_the_same_consumer(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        async with RawApi(broker.target) as api:
            await api.create_producer(topic, "p")
            one = await api.subscribe(topic, "twin", "s", pb.ConsumerRequest.Shared)
            two = await api.subscribe(topic, "twin", "s", pb.ConsumerRequest.Shared)
            other = await api.subscribe(topic, "other", "s", pb.ConsumerRequest.Shared)
            assert one.consumer_id == two.consumer_id != 0, (one, two)
            assert other.consumer_id not in (0, one.consumer_id), (one, other)
            assert two.consumer_name == "twin" and two.request_id == 3, two

    run_async(scenario())


# --- SendMessage, ReceiveMessages, Ack (C.6, C.8, C.10) ----------------------------------------------------


def test_send_with_an_unknown_producer_id_is_not_found(broker: Broker, topic: str) -> None:
    async def scenario() -> None:
        async with RawApi(broker.target) as api:
            await api.create_producer(topic, "p")
            message = pb.StreamMessage(request_id=5, payload=b"x", producer_name="ghost", msg_id=pb.MsgID(
                producer_id=UNKNOWN_ID, topic_name=topic, broker_addr=broker.url))
            e = await rpc_error(api.producer.SendMessage(message), "SendMessage from an unknown producer")
            expect(e, Code.NOT_FOUND, str(UNKNOWN_ID))

    run_async(scenario())


def test_receive_with_an_unknown_consumer_id_is_not_found(broker: Broker) -> None:
    async def scenario() -> None:
        async with RawApi(broker.target) as api:
            call = api.consumer.ReceiveMessages(pb.ReceiveRequest(request_id=1, consumer_id=UNKNOWN_ID))

            async def drain() -> list[Any]:
                return [m async for m in call]

            try:
                e = await rpc_error(drain(), "ReceiveMessages for an unknown consumer")
            finally:
                call.cancel()
            expect(e, Code.NOT_FOUND, str(UNKNOWN_ID))

    run_async(scenario())


def test_ack_without_msg_id_is_invalid_argument(broker: Broker, topic: str) -> None:
    """v0.7.3 panics here (D.16); the contract asks for INVALID_ARGUMENT (C.10)."""

    async def scenario() -> None:
        async with RawApi(broker.target) as api:
            await api.create_producer(topic, "p", reliable=True)
            await api.subscribe(topic, "c", "s")
            e = await rpc_error(api.consumer.Ack(pb.AckRequest(request_id=1, subscription_name="s")),
                                "Ack without msg_id")
            expect(e, Code.INVALID_ARGUMENT, "msg_id")

    run_async(scenario())


@pytest.mark.parametrize("size", [MAX_MESSAGE_SIZE + 1, 64 * 1024, 11 * 1024 * 1024],
                         ids=["limit_plus_1", "64KiB", "11MiB"])
def test_payload_over_max_message_size_is_invalid_argument(broker: Broker, topic: str, size: int) -> None:
    """Over the policy's max_message_size: INVALID_ARGUMENT, never a retryable code (the client would retry
    forever: D.7, D.11), also above the broker's default 10 MiB gRPC receive limit. At the limit: accepted
    and delivered. The official client gets the error back instead of hanging."""

    async def scenario() -> None:
        async with RawApi(broker.target) as api, Session(broker.url) as s:
            created = await api.create_producer(topic, "raw")
            consumer = await s.consumer(topic, "c", "s", SubType.EXCLUSIVE)

            def message(request_id: int, payload_size: int) -> Any:
                msg_id = pb.MsgID(producer_id=created.producer_id, topic_name=topic, broker_addr=broker.url)
                return pb.StreamMessage(request_id=request_id, payload=b"z" * payload_size,
                                        producer_name="raw", msg_id=msg_id)

            e = await rpc_error(api.producer.SendMessage(message(10, size)), f"SendMessage of {size} bytes")
            assert e.code() == Code.INVALID_ARGUMENT, status_line(e)
            details = e.details().lower()
            assert "size" in details or str(MAX_MESSAGE_SIZE) in details, status_line(e)

            at_limit = await bounded(api.producer.SendMessage(message(11, MAX_MESSAGE_SIZE)), "at the limit")
            assert at_limit.request_id == 11
            delivered = await consumer.get()
            assert len(delivered.payload) == MAX_MESSAGE_SIZE and delivered.request_id == 11

            producer = await s.producer(topic, "client")
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await asyncio.wait_for(producer.send(b"y" * size, None), 10)
            assert raised.value.code() == Code.INVALID_ARGUMENT, status_line(raised.value)
            await consumer.expect_silence(0.3)

    run_async(scenario())


# --- HealthCheck (C.11, D.8, D.10) ------------------------------------------------------------------------


def test_health_check(broker: Broker, topic: str) -> None:
    """Unknown ids: CLOSE, not an error (an error silently ends the client's health loop). Known producer:
    OK. Consumer: OK while its stream is open, CLOSE soon after the stream ends (inactive). A client type
    that does not exist: INVALID_ARGUMENT."""

    async def scenario() -> None:
        async with RawApi(broker.target) as api:
            assert await api.health_check(PRODUCER, UNKNOWN_ID) == CLOSE
            assert await api.health_check(CONSUMER, UNKNOWN_ID) == CLOSE
            bad_type = pb.HealthCheckRequest(request_id=1, client=7, id=UNKNOWN_ID)  # type: ignore[arg-type]
            e = await rpc_error(api.health.HealthCheck(bad_type), "HealthCheck of client type 7")
            assert e.code() == Code.INVALID_ARGUMENT, status_line(e)

            producer = await api.create_producer(topic, "p")
            assert await api.health_check(PRODUCER, producer.producer_id) == OK
            consumer = await api.subscribe(topic, "c", "s")
            stream = api.consumer.ReceiveMessages(pb.ReceiveRequest(request_id=2,
                                                                    consumer_id=consumer.consumer_id))
            reader = asyncio.ensure_future(stream.read())
            try:
                await asyncio.sleep(0.3)
                assert not reader.done(), "the stream ended with nothing to deliver"
                assert await api.health_check(CONSUMER, consumer.consumer_id) == OK
            finally:
                stream.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            status = int(OK)
            for _ in range(30):
                status = await api.health_check(CONSUMER, consumer.consumer_id)
                if status == CLOSE:
                    break
                await asyncio.sleep(0.1)
            assert status == CLOSE, "a consumer whose stream ended is still reported OK after 3 s"

    run_async(scenario())

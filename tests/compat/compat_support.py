"""Support for the compatibility suite: an event-loop runner, and thin wrappers over the official client
(danube-client 0.5.0, imported as `danube`) and the raw gRPC stubs. The broker processes are the harness's
(danube_fast/testing/broker.py).

Every wait is bounded (a broker bug must fail a test, not hang it), and every failure message says what was
expected and what arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import Awaitable, Coroutine, Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
import uvloop
from danube import DanubeClientBuilder, DispatchStrategy, SubType
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.proto import DanubeApi_pb2_grpc as pb_grpc
from danube_fast.testing.plugin import grpc_poller_teardown

T = TypeVar("T")

# How long a single expected event may take. Generous for a loaded 2-core machine, short next to the
# per-test timeout, so that a missing message fails with a message instead of a pytest-timeout traceback.
WAIT = 8.0
CREATE_TIMEOUT = 15.0  # the client retries UNAVAILABLE for about 3 s: stay above that
RPC_TIMEOUT = 5.0


# --- running coroutines -------------------------------------------------------------------------------------


def run_async(coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    """Run `coro` on a fresh uvloop loop (one loop, not the `run` fixture's two: every test here talks to a
    broker subprocess, which is what dominates). An error the loop only logs fails a test that otherwise
    passed; tasks left behind (client health checks, receive loops) are cancelled before the loop closes."""
    loop = uvloop.new_event_loop()
    errors: list[dict[str, Any]] = []
    def handle(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not grpc_poller_teardown(context):
            errors.append(context)

    loop.set_exception_handler(handle)
    try:
        result = loop.run_until_complete(asyncio.wait_for(coro, timeout))
    finally:
        _cancel_remaining(loop)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    assert not errors, f"the event loop reported unhandled errors: {errors}"
    return result


def _cancel_remaining(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


async def bounded(awaitable: Awaitable[T], what: str, timeout: float = RPC_TIMEOUT) -> T:
    """`awaitable` within `timeout`, or an AssertionError naming `what` (instead of a bare TimeoutError)."""
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except TimeoutError:
        raise AssertionError(f"{what}: no answer within {timeout} s") from None


# --- the official client ------------------------------------------------------------------------------------


async def reset_when_connected(proxy: Any, timeout: float = 30.0) -> int:
    """Reset the proxy's open connections once there is one; how many. A client reconnects after a reset in
    its own time: on a busy machine the next reset could otherwise come while it has none open."""
    deadline = time.monotonic() + timeout
    while proxy.open_connections == 0:
        assert time.monotonic() < deadline, f"no connection through the proxy within {timeout} s"
        await asyncio.sleep(0.01)
    reset: int = proxy.reset()
    return reset


def describe(m: Any) -> str:
    """A delivered StreamMessage in one line, for assertion messages."""
    key = repr(m.routing_key) if m.HasField("routing_key") else "-"
    return (f"<{m.msg_id.topic_name}@{m.msg_id.topic_offset} payload={bytes(m.payload)[:40]!r} key={key} "
            f"request_id={m.request_id}>")


class ConsumerHandle:
    """A subscribed danube `Consumer` with its receive queue, read with timeouts."""

    def __init__(self, consumer: Any, queue: asyncio.Queue[Any], name: str) -> None:
        self.consumer = consumer
        self.queue = queue
        self.name = name
        self.closed = False

    async def get(self, timeout: float = WAIT) -> Any:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            raise AssertionError(f"consumer {self.name}: no message within {timeout} s") from None

    async def get_n(self, n: int, timeout: float = WAIT) -> list[Any]:
        """Exactly the next `n` messages (more may follow: see `expect_silence`)."""
        got: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(got) < n:
            remaining = deadline - time.monotonic()
            try:
                got.append(await asyncio.wait_for(self.queue.get(), max(remaining, 0.001)))
            except TimeoutError:
                raise AssertionError(
                    f"consumer {self.name}: {len(got)} of {n} messages within {timeout} s; got "
                    f"{[describe(m) for m in got][-10:]}") from None
        return got

    async def expect_silence(self, seconds: float = 0.5) -> None:
        """Nothing more is delivered during `seconds`."""
        await asyncio.sleep(seconds)
        extra = []
        while not self.queue.empty():
            extra.append(self.queue.get_nowait())
        assert not extra, f"consumer {self.name}: unexpected deliveries {[describe(m) for m in extra]}"

    async def ack(self, message: Any) -> None:
        await bounded(self.consumer.ack(message), f"{self.name}: ack of {describe(message)}")

    async def nack(self, message: Any, delay_ms: int | None = None) -> None:
        await bounded(self.consumer.nack(message, delay_ms=delay_ms),
                      f"{self.name}: nack of {describe(message)}")

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await bounded(self.consumer.close(), f"{self.name}: close")


class Session:
    """`async with Session(url) as s:` one danube client; producers and consumers made through it are closed,
    and its gRPC channels too (the client has no close of its own), when the block ends."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client: Any = None
        self._producers: list[Any] = []
        self._consumers: list[ConsumerHandle] = []

    async def __aenter__(self) -> Session:
        self.client = await DanubeClientBuilder().service_url(self.url).build()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        for handle in self._consumers:
            with contextlib.suppress(Exception):
                await handle.close()
        for producer in self._producers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.close(), RPC_TIMEOUT)
        # ConnectionManager keeps one channel per (connect_url, broker_url) and never closes them.
        for connection in list(self.client.connection_manager._connections.values()):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.channel.close(), RPC_TIMEOUT)

    async def producer(self, topic: str, name: str, *, reliable: bool = False, partitions: int = 0,
                       subject: str | None = None, version: int | None = None) -> Any:
        """A producer; with `subject` its messages carry the subject's latest version, or `version`."""
        builder = self.client.new_producer().with_topic(topic).with_name(name)
        if reliable:
            builder = builder.with_dispatch_strategy(DispatchStrategy.RELIABLE)
        if partitions:
            builder = builder.with_partitions(partitions)
        if subject is not None:
            builder = builder.with_schema_subject(subject) if version is None else \
                builder.with_schema_version(subject, version)
        producer = builder.build()
        await bounded(producer.create(), f"create producer {name} on {topic}", CREATE_TIMEOUT)
        self._producers.append(producer)
        return producer

    async def register_schema(self, subject: str, kind: Any, definition: Any) -> int:
        """Register `definition` (JSON-serialisable) under `subject`; the subject's schema id."""
        builder = self.client.schema().register_schema(subject).with_type(kind).with_schema_data(
            json.dumps(definition).encode())
        return int(await bounded(builder.execute(), f"register {subject}"))

    async def consumer(self, topic: str, name: str, subscription: str, sub_type: Any = SubType.EXCLUSIVE,
                       key_filters: Sequence[str] = (), settle: float = 0.2) -> ConsumerHandle:
        """Subscribe and start receiving; `settle` lets the ReceiveMessages stream reach the broker before
        the test publishes (non-reliable topics drop what no open stream takes)."""
        builder = (self.client.new_consumer().with_topic(topic).with_consumer_name(name)
                   .with_subscription(subscription).with_subscription_type(sub_type))
        if key_filters:
            builder = builder.with_key_filters(list(key_filters))
        consumer = builder.build()
        await bounded(consumer.subscribe(), f"subscribe {name} to {topic} ({subscription})", CREATE_TIMEOUT)
        queue = await consumer.receive()
        handle = ConsumerHandle(consumer, queue, name)
        self._consumers.append(handle)
        if settle:
            await asyncio.sleep(settle)
        return handle

    async def partitions(self, topic: str) -> list[str]:
        """What TopicPartitions answers, as the client sees it (always asked of the bootstrap URL)."""
        return list(await bounded(self.client.lookup_service.topic_partitions(self.url, topic),
                                  f"TopicPartitions {topic}"))


async def send_all(producer: Any, payloads: Iterable[bytes], what: str = "send") -> list[int]:
    """Send one after the other (so per-topic order is the list's order); the ids `send()` returned."""
    ids = []
    for payload in payloads:
        ids.append(await bounded(producer.send(payload, None), f"{what} {payload[:40]!r}"))
    return ids


async def collect(handles: Sequence[ConsumerHandle], total: int, *, ack: bool,
                  timeout: float = WAIT) -> dict[str, list[Any]]:
    """Read every handle concurrently until `total` messages arrived in all, acking each if `ack`."""
    got: dict[str, list[Any]] = {h.name: [] for h in handles}
    done = asyncio.Event()
    stopped = False

    async def drain(handle: ConsumerHandle) -> None:
        # `stopped`, not only cancel(): Python 3.11's wait_for (inside `ack`) can swallow a cancellation
        # that arrives as the ack completes, and the drain would then wait on the queue for ever.
        while not stopped:
            message = await handle.queue.get()
            got[handle.name].append(message)
            if ack:
                await handle.ack(message)
            if sum(map(len, got.values())) >= total:
                done.set()

    tasks = [asyncio.ensure_future(drain(h)) for h in handles]
    waiter: asyncio.Future[Any] = asyncio.ensure_future(done.wait())
    try:
        finished, _ = await asyncio.wait([waiter, *tasks], timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            if t in finished:
                t.result()  # a drain only ends by raising (a failed ack): re-raise it here
        if waiter not in finished:
            counts = {name: len(ms) for name, ms in got.items()}
            raise AssertionError(f"{sum(counts.values())} of {total} messages within {timeout} s: {counts}")
    finally:
        stopped = True
        for future in (waiter, *tasks):
            future.cancel()
        _, stuck = await asyncio.wait([waiter, *tasks], timeout=RPC_TIMEOUT)
        for future in stuck:  # swallowed the cancellation while its ack completed: once more
            future.cancel()
    return got


def offsets(messages: Iterable[Any]) -> list[int]:
    return [m.msg_id.topic_offset for m in messages]


def payloads(messages: Iterable[Any]) -> list[bytes]:
    return [bytes(m.payload) for m in messages]


# --- the raw wire -------------------------------------------------------------------------------------------


class RawApi:
    """The client-facing services over one plaintext channel, built from danube_fast's generated stubs (the
    same descriptors as the client's). Use inside a running loop: `async with RawApi(broker.target) as api:`.
    """

    def __init__(self, target: str) -> None:
        self.target = target
        self.channel: Any = None
        self.producer: Any = None
        self.consumer: Any = None
        self.discovery: Any = None
        self.health: Any = None
        self._request_id = 0

    async def __aenter__(self) -> RawApi:
        # A private subchannel pool: gRPC otherwise shares connections per target process-wide, and one left
        # in reconnect backoff by a stopped broker would fail this channel's calls fast after a restart.
        self.channel = grpc.aio.insecure_channel(self.target, options=[("grpc.use_local_subchannel_pool", 1)])
        # The generated stubs are untyped code (danube_fast/proto is exempt from mypy).
        self.producer = pb_grpc.ProducerServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.consumer = pb_grpc.ConsumerServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.discovery = pb_grpc.DiscoveryStub(self.channel)  # type: ignore[no-untyped-call]
        self.health = pb_grpc.HealthCheckStub(self.channel)  # type: ignore[no-untyped-call]
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.channel.close()

    def next_id(self) -> int:
        self._request_id += 1
        return self._request_id

    async def create_producer(self, topic: str, name: str, *, reliable: bool = False) -> Any:
        request = pb.ProducerRequest(
            request_id=self.next_id(), producer_name=name, topic_name=topic, producer_access_mode=pb.Shared,
            dispatch_strategy=pb.Reliable if reliable else pb.NonReliable)
        return await bounded(self.producer.CreateProducer(request), f"CreateProducer {name} on {topic}")

    async def subscribe(self, topic: str, name: str, subscription: str,
                        sub_type: pb.ConsumerRequest.SubscriptionType = pb.ConsumerRequest.Exclusive) -> Any:
        request = pb.ConsumerRequest(request_id=self.next_id(), topic_name=topic, consumer_name=name,
                                     subscription=subscription, subscription_type=sub_type)
        return await bounded(self.consumer.Subscribe(request), f"Subscribe {name} to {topic}")

    async def health_check(self, client: pb.HealthCheckRequest.ClientType, client_id: int) -> int:
        request = pb.HealthCheckRequest(request_id=self.next_id(), client=client, id=client_id)
        response = await bounded(self.health.HealthCheck(request), f"HealthCheck {client}/{client_id}")
        return int(response.status)


async def rpc_error(awaitable: Awaitable[Any], what: str, timeout: float = RPC_TIMEOUT) -> Any:
    """The grpc.aio.AioRpcError that `awaitable` fails with; an AssertionError if it succeeds or hangs."""
    try:
        result = await asyncio.wait_for(awaitable, timeout)
    except grpc.aio.AioRpcError as e:
        return e
    except TimeoutError:
        raise AssertionError(f"{what}: no answer within {timeout} s, expected an error status") from None
    raise AssertionError(f"{what}: succeeded with {result!r}, expected an error status")


def status_line(error: Any) -> str:
    return f"{error.code().name}: {error.details()!r}"


def scrape(broker: Any, accept: str | None = None) -> dict[str, float]:
    """`name{labels}` -> value, from GET /metrics (in a thread: urllib blocks), read by prometheus-client's
    parser; labels written topic first, then by name. `accept` asks for another format (OpenMetrics)."""
    request = urllib.request.Request(f"http://127.0.0.1:{broker.prom_port}/metrics",
                                     headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=5) as r:
        kind = r.headers["Content-Type"]
        text = r.read().decode()
    assert r.status == 200
    if accept is None:
        assert kind.startswith("text/plain; version=0.0.4"), kind
        families = text_string_to_metric_families(text)
    else:
        assert kind.startswith("application/openmetrics-text"), kind
        families = openmetrics_families(text)
    samples = {}
    for family in families:
        for sample in family.samples:
            ordered = sorted(sample.labels.items(), key=lambda kv: (kv[0] != "topic", kv[0]))
            labels = ",".join(f'{k}="{v}"' for k, v in ordered)
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples

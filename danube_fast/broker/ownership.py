"""What the topic core needs from the part that decides which broker serves a topic, as two small protocols,
and standalone mode's implementations of them.

- `Fence`: what a topic's appends and metadata writes pass. Standalone: `Unfenced` (this broker owns every
  topic; writes go straight to the store). Cluster mode: `cluster.guard.TopicGuard`, fenced on the
  topic's assignment.
- `Placement`: where topics live and how a new one gets a home. Standalone: `LocalPlacement` (here, at
  once). Cluster mode: `cluster.assignments.ClusterPlacement` (the leader's load manager assigns it).

The composition root (`broker/server.py`) picks the implementations; nothing else under `broker/`, the
cluster package aside, imports `broker.cluster` (tests/test_imports.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from danube_fast.errors import ApiError
from danube_fast.meta import keys
from danube_fast.meta.resources import BrokerRegistration, Marker
from danube_fast.meta.store import MetadataStore, Op, Put, TxnResult
from danube_fast.names import TopicName

T = TypeVar("T")  # the served topic (broker.topic.Topic; generic here so this module need not import it)


class Fence(Protocol):
    """Per topic, owned by it. An append is `admit(n)`, the append, `done()` (whatever its outcome), then
    `confirm()` before it is acknowledged; a NonReliable publish only `confirm()`s."""

    def start_at(self, offset: int) -> None:
        """The offset the next admitted record gets: where the topic's WAL continues (once, at its load)."""

    async def admit(self, records: int) -> None: ...

    def done(self) -> None: ...

    async def confirm(self) -> None: ...

    async def write(self, ops: Sequence[Op]) -> TxnResult:
        """Every metadata write the owner makes (cursors, descriptors)."""
        ...

    def close(self) -> None:
        """The topic is being unloaded: no new appends."""
        ...

    async def settle(self) -> None:
        """After `close`: wait for every admitted append."""
        ...


class Unfenced:
    """Standalone: nothing can take a topic away, so every check passes and writes are plain transactions.
    Without a store (unit tests of topics whose metadata is not written) a write is a bug: it raises."""

    def __init__(self, store: MetadataStore | None) -> None:
        self._store = store

    def start_at(self, offset: int) -> None:
        pass

    async def admit(self, records: int) -> None:
        pass

    def done(self) -> None:
        pass

    async def confirm(self) -> None:
        pass

    async def write(self, ops: Sequence[Op]) -> TxnResult:
        if self._store is None:
            raise RuntimeError("this topic was built without a metadata store and cannot write to one")
        return await self._store.transaction([], ops)

    def close(self) -> None:
        pass

    async def settle(self) -> None:
        pass


class Placement(Protocol):
    """Owned by the broker; read by the topic registry and the discovery service."""

    @property
    def clustered(self) -> bool:
        """Topics may live on other brokers (a topic in the store may not be served here)."""
        ...

    @property
    def assign_wait(self) -> float:
        """Seconds a lookup waits for a topic without an owner to get one."""
        ...

    def owner(self, name: TopicName) -> int | None:
        """The live broker serving `name`, if it is known to be another one or this one."""
        ...

    def registration(self, broker: int) -> BrokerRegistration | None: ...

    def place_new(self, name: TopicName) -> Op:
        """The write that gives a topic being created its home (in the creating transaction)."""
        ...

    def taken(self, name: TopicName) -> ApiError:
        """The answer to creating a topic the store already has but this broker does not serve."""
        ...

    async def created(self, name: TopicName, open_here: Callable[[], Awaitable[T]],
                      find: Callable[[str], T | None]) -> T:
        """The topic just written to the store, once it is served here: `open_here` opens it on this broker,
        `find` looks for it among the served topics by full name."""
        ...

    async def loading_here(self, name: TopicName, find: Callable[[str], T | None]) -> T | None:
        """A topic assigned to this broker and not served yet, once it is (None: assigned elsewhere or to
        nobody, or not loaded within `assign_wait`)."""
        ...


class LocalPlacement:
    """Standalone: every topic is this broker's, assigned to it in the creating transaction."""

    clustered = False
    assign_wait = 0.0

    def __init__(self, broker_id: int) -> None:
        self._broker_id = broker_id

    def owner(self, name: TopicName) -> int | None:
        return None

    def registration(self, broker: int) -> BrokerRegistration | None:
        return None

    def place_new(self, name: TopicName) -> Op:
        return Put(keys.broker_topic(self._broker_id, name.namespace, name.topic), Marker().to_json())

    def taken(self, name: TopicName) -> ApiError:
        return ApiError("ALREADY_EXISTS", f"topic {name} exists in the metadata store but is not loaded")

    async def created(self, name: TopicName, open_here: Callable[[], Awaitable[T]],
                      find: Callable[[str], T | None]) -> T:
        return await open_here()

    async def loading_here(self, name: TopicName, find: Callable[[str], T | None]) -> T | None:
        return None

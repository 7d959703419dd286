"""Fencing: every write a broker makes on the strength of a role is a transaction that re-checks the role.

A lease (or an etcd lock) alone is not mutual exclusion (docs/METADATA.md#fencing): a broker that paused in a
GC, a VM migration or SIGSTOP for longer than its lease still believes it owns a topic, and its next write may
reach etcd after the topic was assigned to another broker. So nothing is written on a belief: a topic owner's
cursor, descriptor and sealed-state writes compare the assignment key (`fenced_write`), and the leader's
assignment writes compare the leader key (`danube_fast.meta.election`). etcd evaluates the compare and the
write atomically, so a deposed owner's write fails however late it arrives.

The fence compares the key's **create_revision**, not its mod_revision. A create revision names one
incarnation of the key: deleting and re-creating the assignment (an unload, a move and a move back to the
same broker) gives a new one, which fences out every write based on the old one, exactly as the leader key's
create revision is the controller epoch (docs/METADATA.md#election-and-the-controller-epoch). A mod_revision
would also change when the load manager merely rewrites the same assignment, fencing out an owner that still
owns the topic for no reason.

The local half, `Ownership.check()`, stops a broker from acknowledging once its lease may have expired (on
its own monotonic clock), before it even talks to etcd; it is an early refusal, the compare is the guarantee.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from danube_fast.meta import keys
from danube_fast.meta.store import Compare, Get, KeyValue, MetadataError, MetadataStore, Op, TxnResult

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt}


class OwnershipLost(MetadataError):
    """The broker no longer owns the topic: its assignment is gone or re-created, or its lease may have
    expired. Not retriable here: the client looks the topic up again and goes to the new owner."""

    retriable = False
    grpc_code = "FAILED_PRECONDITION"


def compare_holds(c: Compare, kv: KeyValue | None) -> bool:
    """`c` evaluated against `kv` as etcd would (a missing key has version and revisions 0; a value compare
    on a missing key is false)."""
    if c.target == "value":
        return kv is not None and _OPS[c.op](kv.value, c.value)
    actual = 0 if kv is None else getattr(kv, c.target)
    return _OPS[c.op](actual, c.value)


async def guarded_write(store: MetadataStore, fence: Sequence[Compare], ops: Sequence[Op],
                        extra_compares: Sequence[Compare], lost: Callable[[KeyValue | None], MetadataError],
                        ) -> TxnResult:
    """`ops` in one transaction guarded by `fence` (compares on one key) and `extra_compares`.

    When the transaction fails, its failure branch has read the fence key in the same revision, which tells
    the two causes apart: the fence failed -> raise `lost(kv)`; only an extra compare failed -> return a
    result with `succeeded` False and no responses. MetadataUnavailable passes through.
    """
    key = fence[0].key
    if any(c.key != key for c in fence):
        raise ValueError("a fence compares one key")
    result = await store.transaction([*fence, *extra_compares], ops, [Get(key)])
    if result.succeeded:
        return result
    found = result.responses[0]
    kv = found[0] if isinstance(found, list) and found else None
    if not all(compare_holds(c, kv) for c in fence):
        raise lost(kv)
    return TxnResult(False, result.revision, [])


def _ownership_lost(key: str, revision: int) -> Callable[[KeyValue | None], MetadataError]:
    def lost(kv: KeyValue | None) -> MetadataError:
        now = "is gone" if kv is None else f"was re-created at revision {kv.create_revision}"
        return OwnershipLost(f"assignment {key} of revision {revision} {now}: the topic has moved")
    return lost


async def fenced_write(store: MetadataStore, assignment_key: str, expected_revision: int, ops: Sequence[Op],
                       extra_compares: Sequence[Compare] = ()) -> TxnResult:
    """`ops`, applied only while `assignment_key` exists with create revision `expected_revision`; else
    OwnershipLost. A failed extra compare returns a result with `succeeded` False (see guarded_write)."""
    fence = [Compare(assignment_key, "create_revision", "==", expected_revision)]
    return await guarded_write(store, fence, ops, extra_compares,
                               _ownership_lost(assignment_key, expected_revision))


class Ownership:
    """What a broker keeps per topic it serves: the assignment key, its create revision, and a view of the
    broker's lease deadline (`lease_deadline()`, on `clock`, typically the keeper of the broker's lease).

    Owner: the topic's task. `check()` before acknowledging anything (a broker resuming from a pause finds
    its deadline passed and refuses before talking to etcd); `write()` for every metadata write the owner
    makes. Once lost, it stays lost: a broker that is given the topic again gets a new Ownership.
    """

    def __init__(self, store: MetadataStore, assignment_key: str, revision: int,
                 lease_deadline: Callable[[], float], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.key = assignment_key
        self.revision = revision
        self._lease_deadline = lease_deadline
        self._clock = clock
        self._lost: str | None = None

    @classmethod
    async def acquire(cls, store: MetadataStore, broker_id: int, namespace: str, topic: str,
                      lease_deadline: Callable[[], float], *,
                      clock: Callable[[], float] = time.monotonic) -> Ownership:
        """The ownership of the topic's current assignment to `broker_id`; OwnershipLost if there is none."""
        key = keys.broker_topic(broker_id, namespace, topic)
        kv = await store.get(key)
        if kv is None:
            raise OwnershipLost(f"{keys.topic_name(namespace, topic)} is not assigned to broker {broker_id}")
        return cls(store, key, kv.create_revision, lease_deadline, clock=clock)

    @property
    def lost(self) -> bool:
        return self._lost is not None or self._clock() >= self._lease_deadline()

    @property
    def lost_reason(self) -> str | None:
        """Why the ownership is lost for good (a fence failed or a revalidation found it gone), else None."""
        return self._lost

    async def write_fenced(self, ops: Sequence[Op], extra_compares: Sequence[Compare] = ()) -> TxnResult:
        """`write()` without the local lease-deadline refusal: the store's compare alone decides. For an owner
        that keeps serving through a store outage (its lease deadline passes while nobody can reassign)."""
        if self._lost is not None:
            raise OwnershipLost(self._lost)
        try:
            return await fenced_write(self.store, self.key, self.revision, ops, extra_compares)
        except OwnershipLost as e:
            self._lose(e)

    def check(self) -> None:
        """OwnershipLost if the ownership was lost, or the broker's lease may have expired by now."""
        if self._lost is not None:
            raise OwnershipLost(self._lost)
        late = self._clock() - self._lease_deadline()
        if late >= 0:
            raise OwnershipLost(f"the broker's lease may have expired {late:.3f} s ago: it no longer owns "
                                f"the topic of {self.key}")

    async def revalidate(self, *, check: bool = True) -> None:
        """Read the assignment: OwnershipLost (and lost for good) unless it is still this one. `check=False`
        skips the local lease-deadline refusal first (see write_fenced)."""
        if check:
            self.check()
        kv = await self.store.get(self.key)
        if kv is None or kv.create_revision != self.revision:
            self._lose(_ownership_lost(self.key, self.revision)(kv))

    async def write(self, ops: Sequence[Op], extra_compares: Sequence[Compare] = ()) -> TxnResult:
        """check(), then fenced_write(); a fence failure marks the ownership lost."""
        self.check()
        try:
            return await fenced_write(self.store, self.key, self.revision, ops, extra_compares)
        except OwnershipLost as e:
            self._lose(e)

    def _lose(self, error: MetadataError) -> NoReturn:
        self._lost = str(error)
        raise error

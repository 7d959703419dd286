"""Where a topic's offsets continue when it changes owner: the `state` key
(docs/TOPIC_MOVE.md#the-state-key-sealed-state-and-offset-reservation), used as an offset reservation as well
as the sealed state.

The value is a SealedState, `{sealed, last_committed_offset, broker_id, timestamp}`, read the same way in both
forms: **no offset above `last_committed_offset` was committed by `broker_id`**, so the next owner starts at
`last_committed_offset + 1` either way.
- `sealed: true` is the sealed state: the old owner drained everything into the object tier first, so
  the value is exact and the next owner continues without a gap.
  A replicated topic's owner may hand the topic to its in-sync followers instead of draining it
  (docs/REPLICATION.md, "A planned move"): the sealed state then says so in its extra field `handover`
  (`{epoch, to: [broker ids]}`), and the records above what the objects hold are in those followers'
  copies of that term (and in the old owner's own, kept as a copy), not yet in the objects.
- `sealed: false` is a reservation the owner writes (fenced) before it appends, and extends ahead of need
  (`Reservation`). If the owner dies, the next owner starts past the reservation, so no offset the dead
  broker may have acknowledged is ever reused. Offsets between what reached the object tier and the
  reservation are a *gap*: the dead broker's WAL holds them, and it uploads them when it returns
  (`danube_fast.broker.cluster.orphans`). Gaps are listed in the value's extra field `gaps`
  (`[[first, last, broker_id], ...]`) until descriptors cover them, so readers know to wait for them.

Upstream deletes the sealed state once the topic is loaded; here the new owner replaces it with its own
reservation instead (a reservation is needed from the first append on).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from danube_fast.meta import keys
from danube_fast.meta.resources import JSON, JSONObject, ObjectDescriptor, SealedState
from danube_fast.meta.store import Delete, MetadataStore, Op, Put, TxnResult
from danube_fast.storage.gaps import Gap, gaps_from, open_gaps
from danube_fast.storage.objects import expiry
from danube_fast.storage.objects.catalog import load_descriptors

FencedWrite = Callable[[Sequence[Op]], Awaitable[TxnResult]]


def uploaded_through(found: Sequence[ObjectDescriptor]) -> int:
    """The last offset of the contiguous run of objects from the first one; -1 with none."""
    last = -1
    for d in found:
        if last >= 0 and d.start_offset > last + 1:
            break
        last = max(last, d.end_offset)
    return last


def state_gaps(state: SealedState | None) -> list[Gap]:
    raw = state.extra.get("gaps", []) if state is not None else []
    out: list[Gap] = []
    if isinstance(raw, list):
        for g in raw:
            if isinstance(g, list) and len(g) == 3:
                first, last, broker = g
                if isinstance(first, int) and isinstance(last, int) and isinstance(broker, int):
                    out.append((first, last, broker))
    return out


@dataclass(frozen=True)
class Handover:
    """A sealed state's `handover`: the followers of term `epoch` that hold every record through the sealed
    offset, one of which continues the topic from its copy."""

    epoch: int
    to: tuple[int, ...]

    def to_json(self) -> JSONObject:
        return {"epoch": self.epoch, "to": list(self.to)}


def handover_of(state: SealedState | None) -> Handover | None:
    raw = state.extra.get("handover") if state is not None and state.sealed else None
    if not isinstance(raw, dict):
        return None
    epoch, to = raw.get("epoch"), raw.get("to")
    if not isinstance(epoch, int) or not isinstance(to, list):
        return None
    brokers = tuple(b for b in to if isinstance(b, int))
    return Handover(epoch, brokers) if len(brokers) == len(to) else None


async def read_state(store: MetadataStore, namespace: str, topic: str) -> SealedState | None:
    kv = await store.get(keys.sealed_state(namespace, topic))
    return None if kv is None else SealedState.from_json(kv.value, key=kv.key)


@dataclass(frozen=True)
class LoadPoint:
    """What a broker taking a topic needs: `start`, the offset a new WAL begins at; `keep_local`, whether a
    local WAL left from an earlier run is this broker's own continuing log (else it is an orphan); the
    object tier's contiguous end `uploaded`; `gaps` still waiting for a dead owner's WAL."""

    start: int
    keep_local: bool
    uploaded: int
    gaps: tuple[Gap, ...]
    sequences: JSON = None  # the idempotent producers' table the old owner sealed (broker/sequences.py)


async def load_point(store: MetadataStore, namespace: str, topic: str, broker_id: int) -> LoadPoint:
    state = await read_state(store, namespace, topic)
    found = await load_descriptors(store, namespace, topic)
    uploaded = uploaded_through(found)
    top = max((d.end_offset for d in found), default=-1)
    gaps = open_gaps(state_gaps(state), found)
    if state is None:  # a topic never moved (or from standalone): the local WAL, if any, is the log
        return LoadPoint(top + 1, True, uploaded, tuple(gaps))
    if not state.sealed and state.broker_id == broker_id:  # our own reservation: we restarted
        gaps = await _above_floor(store, namespace, topic, gaps)
        return LoadPoint(max(top, state.last_committed_offset) + 1, True, uploaded, tuple(gaps))
    if not state.sealed or handover_of(state) is not None:
        # The owner died holding a reservation (its WAL has what the objects lack), or handed the topic over
        # (its followers' copies have it): a gap, unless this broker continues from such a copy.
        first = max(top, -1) + 1
        if first <= state.last_committed_offset:
            gaps = open_gaps([*gaps, (first, state.last_committed_offset, state.broker_id)], found)
    gaps = await _above_floor(store, namespace, topic, gaps)
    sequences = state.extra.get("sequences") if state.sealed else None
    return LoadPoint(max(top, state.last_committed_offset) + 1, False, uploaded, tuple(gaps), sequences)


async def _above_floor(store: MetadataStore, namespace: str, topic: str, gaps: list[Gap]) -> list[Gap]:
    """`gaps` cut at retention's floor: below it nothing is pending (recovered, then deleted by retention)."""
    if not gaps:
        return gaps
    retained = await expiry.read_state(store, namespace, topic)
    return gaps_from(gaps, retained.floor) if retained is not None else gaps


def state_ops(namespace: str, topic: str, broker_id: int, *, sealed: bool, last: int,
              gaps: Sequence[Gap], sequences: JSON = None, handover: Handover | None = None) -> list[Op]:
    """The state key's write; sealed only: `sequences`, the idempotent producers' table (next owner), and
    `handover`, the followers that hold the records the objects lack."""
    key = keys.sealed_state(namespace, topic)
    if last < 0:  # nothing was ever committed: a new owner starts at 0 without being told
        return [Delete(key)] if sealed else []
    extra: JSONObject = {"gaps": [[first, last, broker] for first, last, broker in gaps]} if gaps else {}
    if sealed and sequences:
        extra["sequences"] = sequences
    if sealed and handover is not None:
        extra["handover"] = handover.to_json()
    value = SealedState(sealed, last, broker_id, int(time.time()), extra=extra)
    return [Put(key, value.to_json())]


class Reservation:
    """The owner's bound on the offsets it may commit, extended `block` offsets at a time by a fenced write
    before it is reached (half a block ahead), so appends rarely wait for it. Owner: the topic."""

    def __init__(self, namespace: str, topic: str, broker_id: int, write: FencedWrite, block: int,
                 gaps: Sequence[Gap]) -> None:
        self._ns, self._topic, self._broker = namespace, topic, broker_id
        self._write = write
        self._block = block
        self.gaps = list(gaps)
        self.through = -1  # no offset above this may be committed
        self._extending: Awaitable[None] | None = None

    async def extend(self, need: int) -> None:
        """Reserve through at least `need` (and a block beyond)."""
        through = max(self.through, need) + self._block
        await self._write(state_ops(self._ns, self._topic, self._broker, sealed=False, last=through,
                                    gaps=self.gaps))
        self.through = max(self.through, through)

    def needs(self, last: int) -> bool:
        return last > self.through

    def low(self, last: int) -> bool:
        """Past half the reserved block: extend in the background now."""
        return last > self.through - self._block // 2

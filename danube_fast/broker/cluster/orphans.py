"""Orphan recovery: a WAL directory whose topic this broker no longer owns (it crashed, or lost its lease,
and the topic went elsewhere) still holds records it may have acknowledged. They lie in this broker's
offset reservation (handoff.py), which no later owner reuses, so `recover` uploads the records the object
tier lacks, declares the rest of the reservation empty (a zero-size descriptor), and deletes the directory.
Its descriptor writes only create keys: they never overwrite what another owner wrote. A replicated topic
an in-sync follower took over from this broker (its `replaced/{broker}` key, docs/REPLICATION.md) needs
nothing from the directory: the follower's copy holds every record this broker acknowledged, and offsets
above it were never acknowledged, so the directory is deleted as it is.

Owner: the broker's event loop; the reconciler (reconciler.py) calls `recover` for orphans it finds.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import replace

from danube_fast.broker.cluster import handoff
from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.tiering import DRAIN_TIMEOUT, Tier
from danube_fast.meta import keys
from danube_fast.meta.resources import ObjectDescriptor, ReplacedLog, SealedState
from danube_fast.meta.store import Compare, MetadataError, MetadataStore, Op, Put, TxnResult
from danube_fast.names import TopicName
from danube_fast.storage.gaps import open_gaps, uncovered
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.storage.uploader import Uploader
from danube_fast.storage.wal import Wal

log = logging.getLogger("danube_fast.tier")


class Orphans:
    def __init__(self, config: BrokerConfig, store: MetadataStore, tier: Tier, broker_id: int) -> None:
        self._config = config
        self._store = store
        self._tier = tier
        self.broker_id = broker_id

    async def recover(self, name: TopicName, directory: str) -> None:
        """This broker's own WAL of a topic it no longer owns."""
        await self._recover(name, directory, self.broker_id, complete=True)

    async def recover_copy(self, name: TopicName, directory: str, of: int, complete: bool) -> None:
        """A follower's copy of dead broker `of`'s term of a replicated topic, after the topic went to a
        broker that holds no copy (docs/REPLICATION.md): its records fill the gap `of` left. `complete`: the
        copy holds every record `of` acknowledged (this broker was a successor of that term), so the rest of
        the gap is declared empty; else it stays, for `of`'s own WAL."""
        await self._recover(name, directory, of, complete)

    async def _recover(self, name: TopicName, directory: str, of: int, complete: bool) -> None:
        ns, t = name.namespace, name.topic
        own = of == self.broker_id
        what = "orphan WAL" if own else f"copy of broker {of}'s log"
        replaced = await self._store.get(keys.replaced_log(ns, t, of))
        if replaced is not None:
            through = ReplacedLog.from_json(replaced.value, key=replaced.key).through
            log.info("%s: a follower took the topic over with every record through %d; the %s goes",
                     name, through, what)
            await _delete(directory)
            return
        wal = await Wal.open(directory, self._config.wal)
        try:
            state = await handoff.read_state(self._store, ns, t)
            found = await load_descriptors(self._store, ns, t)
            bound = self._bound(state, of, own)
            if bound is None and own:
                bound = await self._replaced_bound(ns, t, state)
            missing = open_gaps([(wal.start_offset, wal.committed_offset - 1, of)], found)
            first = missing[0][0] if missing else None
            if first is None:
                last = wal.committed_offset - 1  # every record is in the object tier already
            elif bound is None or first > bound:
                if not own:  # no gap of that broker's waits: sealed, taken over or recovered already
                    log.info("%s: nothing of the %s is missing; it goes", name, what)
                    await wal.close()
                    await _delete(directory)
                    return
                log.warning("%s: orphan WAL holds offsets from %d that no reservation of broker %d covers; "
                            "kept in %s for an operator", name, first, of, directory)
                return
            else:
                last = await self._upload_from(wal, ns, t, of, first, min(bound + 1, wal.committed_offset))
            # The rest of the range holds nothing acknowledged: declared empty where no object covers it
            # (records above `last` may be in objects already: the owner uploaded them before it died).
            empty = [] if not complete or bound is None or last >= bound else \
                uncovered(last + 1, bound, await load_descriptors(self._store, ns, t))
            if empty:
                puts = [Put(keys.object_descriptor(ns, t, low),
                            ObjectDescriptor("", low, high, 0, True, int(time.time())).to_json())
                        for low, high in empty]
                done = await self._create_only(ns, t, of, puts)
                if not done.succeeded:
                    raise MetadataError(f"{name}: the {what} was replaced, or recovered, meanwhile")
            log.info("%s: %s recovered: records through %d in the object tier%s", name, what, last,
                     "".join(f", {low}..{high} declared empty" for low, high in empty))
        finally:
            await wal.close()
        await _delete(directory)

    @staticmethod
    def _bound(state: SealedState | None, of: int, own: bool) -> int | None:
        """The last offset broker `of` could have committed that a later owner left missing: the gap that
        owner recorded for it, or (this broker's own log) its own reservation. A copy never fills its
        owner's reservation: that owner, or the term after it, still holds the range."""
        if state is None:
            return None
        if own and not state.sealed and state.broker_id == of:
            return state.last_committed_offset
        for _, last, broker in handoff.state_gaps(state):
            if broker == of:
                return last
        return None

    async def _replaced_bound(self, ns: str, t: str, state: SealedState | None) -> int | None:
        """The end of a dead broker's gap that this broker took over from its copy (`replaced/{dead}` names
        it) and then lost before it wrote a reservation of its own: the next owner recorded the range as
        the dead broker's, whose recovery leaves it to the broker that replaced it, so this WAL, which holds
        every record the dead broker acknowledged, fills it (the chaos campaign caught readers waiting
        there for good)."""
        for _, last, broker in handoff.state_gaps(state):
            kv = await self._store.get(keys.replaced_log(ns, t, broker))
            if kv is not None and ReplacedLog.from_json(kv.value, key=kv.key).by == self.broker_id:
                return last
        return None

    async def _upload_from(self, wal: Wal, ns: str, t: str, of: int, first: int, end: int) -> int:
        """Upload the records of [first, end) the log holds; the last offset uploaded."""
        if end <= first:
            return first - 1
        uploader = Uploader(wal, self._tier.objects, self._store, ns, t, checkpoint=first - 1,
                            write_meta=functools.partial(self._create_only, ns, t, of),
                            config=replace(self._tier.uploader_config, delete_local=False))
        await uploader.start()
        try:
            return await uploader.drain(DRAIN_TIMEOUT, end)
        finally:
            await uploader.close()

    async def _create_only(self, ns: str, t: str, of: int, ops: Sequence[Op]) -> TxnResult:
        """Descriptor puts that only create keys (objects/cur stays the current owner's), and only while no
        successor has taken the topic over from broker `of` (`replaced/{of}`): a takeover continues the
        topic below `of`'s reservation, where these would otherwise land (reconciler.py `_takeover`
        checks the descriptors again after it wrote that key)."""
        puts = [op for op in ops if isinstance(op, Put) and not op.key.endswith("/objects/cur")]
        compares = [Compare(p.key, "version", "==", 0) for p in puts]
        compares.append(Compare(keys.replaced_log(ns, t, of), "version", "==", 0))
        return await self._store.transaction(compares, puts, [])


async def _delete(directory: str) -> None:
    """A recovered WAL's (or copy's) directory, off the event loop."""
    await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, directory)

"""A delayed record being released (taken out of the index, its message read again from the log) is still
covered by the delayed state a cursor save writes meanwhile: a crash then must not lose it
(dispatch/reliable.py, docs/SUBSCRIPTIONS.md "Delayed delivery")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from danube_fast import deliver_at
from danube_fast.broker import messages
from danube_fast.broker.config import DispatchConfig
from danube_fast.broker.dispatch.cursor import Cursor, Delayed
from danube_fast.broker.dispatch.reliable import FETCH_BYTES, ReliableDispatcher
from danube_fast.broker.subscription import Subscription
from danube_fast.meta.resources import SubscriptionType
from danube_fast.proto import DanubeApi_pb2 as pb
from danube_fast.storage import SyncPolicy, Wal, WalConfig
from tests.broker.broker_support import TOPIC, message

Run = Callable[..., Any]
DELAY_MS = 300


class SlowReads:
    """The WAL, but a read of a due delayed record (FETCH_BYTES) waits for `go` once `hold` is set: a
    read from a slow disk."""

    def __init__(self, wal: Wal) -> None:
        self._wal = wal
        self.hold = False
        self.waiting = asyncio.Event()
        self.go = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wal, name)

    async def read(self, offset: int, max_bytes: int) -> Any:
        if self.hold and max_bytes == FETCH_BYTES:
            self.waiting.set()
            await self.go.wait()
        return await self._wal.read(offset, max_bytes)


def test_a_save_while_a_due_record_is_read_covers_it(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        wal = await Wal.open(tmp_path / "wal", WalConfig(sync=SyncPolicy("none")))
        saved: list[Delayed | None] = []

        async def save(floor: int, delayed: object = None) -> None:
            if isinstance(delayed, Delayed) or delayed is None:
                saved.append(delayed)

        config = DispatchConfig()
        slow = SlowReads(wal)
        at = deliver_at.now_ms() + DELAY_MS
        for i in range(3):
            m: pb.StreamMessage = message(i)
            m.attributes[deliver_at.ATTRIBUTE] = str(at)
            await wal.append(messages.encode(m))
        sub = Subscription(TOPIC, "sub", SubscriptionType.SHARED)
        cursor = Cursor(0, save, config)

        async def no_dead_letters(msg: pb.StreamMessage) -> None:
            raise AssertionError("nothing is dead-lettered here")

        dispatcher = ReliableDispatcher(sub, slow, config, cursor, no_dead_letters)  # type: ignore[arg-type]
        sub.dispatcher = dispatcher
        try:
            deadline = time.monotonic() + 10
            while dispatcher.counters().get("delayed") != 3:
                assert time.monotonic() < deadline, "the three records never reached the index"
                await asyncio.sleep(0.01)
            slow.hold = True
            await asyncio.wait_for(slow.waiting.wait(), 10)  # their time came: being read again
            await cursor.save()
            assert saved and saved[-1] is not None, "the save forgot the records being released"
            assert saved[-1].from_offset <= 0 and saved[-1].from_time <= at, saved[-1]
            slow.go.set()
        finally:
            slow.go.set()
            await dispatcher.close(save=False)
            await wal.close()

    run(main())

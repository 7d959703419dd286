"""One suite, every MetadataStore: the embedded SQLite store and a real etcd behave the same.

Each test runs on asyncio and uvloop (the `run` fixture) and on both stores (the `store` fixture).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

from danube_fast.meta.store import (
    MAX_TXN_OPS,
    MAX_VALUE_BYTES,
    Compacted,
    Compare,
    Delete,
    Get,
    InvalidKey,
    InvalidRevision,
    InvalidTransaction,
    KeyValue,
    LeaseNotFound,
    MetadataStore,
    Op,
    Put,
    ValueTooLarge,
    WatchEvent,
)
from danube_fast.testing.plugin import StoreFactory

Check = Callable[[MetadataStore], Awaitable[None]]
TEST_SECONDS = 10


def contract(run: Callable[..., Any], store: StoreFactory, check: Check) -> None:
    async def body() -> None:
        async with store() as s:
            await check(s)

    run(body(), timeout=TEST_SECONDS)


async def take(watch: AsyncIterator[WatchEvent], n: int, timeout: float = 5.0) -> list[WatchEvent]:
    return [await asyncio.wait_for(anext(watch), timeout) for _ in range(n)]


async def close(watch: AsyncIterator[WatchEvent]) -> None:
    await watch.aclose()  # type: ignore[attr-defined]  # both stores return async generators


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"not true within {timeout} s"
        await asyncio.sleep(step)


# keys and revisions --------------------------------------------------------------------------------------


def test_put_get_delete_revisions(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore) -> None:
        assert isinstance(s, MetadataStore)
        base = await s.current_revision()
        assert await s.get("/k") is None
        r1 = await s.put("/k", b"one")
        assert r1 == base + 1 == await s.current_revision()
        assert await s.get("/k") == KeyValue("/k", b"one", r1, r1, 1)
        r2 = await s.put("/k", b"two")
        assert r2 == r1 + 1
        assert await s.get("/k") == KeyValue("/k", b"two", r1, r2, 2)
        assert await s.delete("/k") is True
        r3 = await s.current_revision()
        assert r3 == r2 + 1 and await s.get("/k") is None
        assert await s.delete("/k") is False
        assert await s.current_revision() == r3, "deleting nothing takes no revision"
        r4 = await s.put("/k", b"three")
        assert await s.get("/k") == KeyValue("/k", b"three", r4, r4, 1), "version restarts after a delete"
        assert r4 == r3 + 1
        assert await s.put("/empty", b"") == r4 + 1
        assert (await s.get("/empty")) == KeyValue("/empty", b"", r4 + 1, r4 + 1, 1)

    contract(run, store, check)


def test_get_prefix_is_sorted_by_key_bytes(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore) -> None:
        keys = ["/p/b", "/p/\u00e9", "/p/a/x", "/p0", "/p", "/q/a", "/p/a", "/p/z"]
        for i, key in enumerate(keys):
            await s.put(key, str(i).encode())
        found = await s.get_prefix("/p/")
        assert [kv.key for kv in found] == sorted((k for k in keys if k.startswith("/p/")), key=str.encode)
        assert [kv.value for kv in found] == [str(keys.index(kv.key)).encode() for kv in found]
        assert [kv.key for kv in await s.get_prefix("/p")] == ["/p", "/p/a", "/p/a/x", "/p/b", "/p/z",
                                                               "/p/\u00e9", "/p0"]
        assert await s.get_prefix("/none/") == []

    contract(run, store, check)


def test_delete_prefix_counts_and_takes_one_revision(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore) -> None:
        for key in ("/d/a", "/d/b", "/d/c/d", "/d2"):
            await s.put(key, b"v")
        before = await s.current_revision()
        assert await s.delete_prefix("/d/") == 3
        assert await s.current_revision() == before + 1
        assert await s.delete_prefix("/d/") == 0
        assert await s.current_revision() == before + 1
        assert [kv.key for kv in await s.get_prefix("/d")] == ["/d2"]

    contract(run, store, check)


# transactions --------------------------------------------------------------------------------------------


def test_compare_targets_and_operators(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore) -> None:
        created = await s.put("/t/k", b"m")
        modified = await s.put("/t/k", b"m")  # version 2
        cases: list[tuple[Compare, bool]] = []
        for target, actual in (("version", 2), ("create_revision", created), ("mod_revision", modified)):
            cases += [(Compare("/t/k", target, op, actual + delta), expected) for op, delta, expected in (
                ("==", 0, True), ("==", 1, False), ("!=", 0, False), ("!=", 1, True), ("<", 1, True),
                ("<", 0, False), (">", -1, True), (">", 0, False))]
            # a missing key has version, create_revision and mod_revision 0
            cases += [(Compare("/t/none", target, op, value), expected) for op, value, expected in (
                ("==", 0, True), (">", 0, False), ("<", 1, True), ("!=", 0, False))]
        cases += [(Compare("/t/k", "value", "==", b"m"), True), (Compare("/t/k", "value", "==", b"n"), False),
                  (Compare("/t/k", "value", "!=", b"n"), True), (Compare("/t/k", "value", "<", b"n"), True),
                  (Compare("/t/k", "value", "<", b"m"), False), (Compare("/t/k", "value", ">", b""), True),
                  (Compare("/t/k", "value", ">", b"mm"), False)]
        # etcd: a value compare on a missing key is false, whatever the operator
        cases += [(Compare("/t/none", "value", op, b"x"), False) for op in ("==", "!=", "<", ">")]
        cases += [(Compare("/t/none", "value", "==", b""), False)]
        for compare, expected in cases:
            result = await s.transaction([compare], [Get("/t/k")], [])
            assert result.succeeded is expected, compare
        both = [Compare("/t/k", "version", "==", 2), Compare("/t/k", "value", "==", b"x")]
        assert (await s.transaction(both, [], [])).succeeded is False, "every compare must hold"
        assert (await s.transaction([], [], [])).succeeded is True, "no compare holds trivially"
        assert await s.current_revision() == modified, "reads and failed compares take no revision"

    contract(run, store, check)


def test_a_compare_over_a_prefix_holds_for_every_key_under_it(run: Callable[..., Any], store: StoreFactory
                                                               ) -> None:
    """etcd's range compare: every key under the prefix must pass; with none, a missing key is compared (so
    `version == 0` over a prefix means "no key under it", and a value compare fails)."""
    async def check(s: MetadataStore) -> None:
        def holds(*compares: Compare) -> Awaitable[bool]:
            async def txn() -> bool:
                return (await s.transaction(list(compares), [], [])).succeeded
            return txn()

        nothing = Compare("/p/", "version", "==", 0, prefix=True)
        assert await holds(nothing)
        assert not await holds(Compare("/p/", "value", "==", b"", prefix=True))
        first = await s.put("/p/a", b"x")
        second = await s.put("/p/b", b"y")
        await s.put("/pq", b"z")  # beside the prefix, not under it
        await s.put("/p/b", b"y")  # version 2
        assert not await holds(nothing)
        assert await holds(Compare("/p/", "create_revision", "<", second + 1, prefix=True))
        assert not await holds(Compare("/p/", "create_revision", "<", second, prefix=True))
        assert await holds(Compare("/p/", "create_revision", ">", first - 1, prefix=True))
        assert not await holds(Compare("/p/", "version", "==", 1, prefix=True))  # /p/b is at 2
        assert await holds(Compare("/p/", "value", ">", b"w", prefix=True))
        assert not await holds(Compare("/p/", "value", "==", b"x", prefix=True))
        assert await holds(Compare("/pq", "value", "==", b"z"))  # a key's compare is unchanged
        await s.delete_prefix("/p/")
        assert await holds(nothing)

    contract(run, store, check)


def test_transaction_branches_and_responses(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore) -> None:
        r0 = await s.put("/x/old", b"old")
        await s.put("/x/gone", b"gone")
        absent = Compare("/x/new", "version", "==", 0)
        ops: Sequence[Op] = [Put("/x/new", b"new"), Get("/x/", prefix=True), Delete("/x/gone"),
                             Delete("/x/nothing"), Get("/x/new"), Put("/x/old", b"older")]
        result = await s.transaction([absent], ops, [Get("/x/old")])
        rev = r0 + 2
        assert result.succeeded and result.revision == rev == await s.current_revision()
        assert result.responses == [
            None,
            [KeyValue("/x/gone", b"gone", r0 + 1, r0 + 1, 1), KeyValue("/x/new", b"new", rev, rev, 1),
             KeyValue("/x/old", b"old", r0, r0, 1)],  # reads see the branch's earlier writes
            1, 0, [KeyValue("/x/new", b"new", rev, rev, 1)], None]
        assert await s.get("/x/old") == KeyValue("/x/old", b"older", r0, rev, 2)
        assert await s.get("/x/gone") is None
        again = await s.transaction([absent], ops, [Get("/x/old"), Get("/x/missing")])
        assert not again.succeeded and again.revision == rev
        assert again.responses == [[KeyValue("/x/old", b"older", r0, rev, 2)], []]
        empty = await s.transaction([absent], [Put("/x/never", b"")])
        assert not empty.succeeded and empty.responses == [] and empty.revision == rev
        failed_write = await s.transaction([absent], [], [Put("/x/f", b"1"), Delete("/x/old")])
        assert not failed_write.succeeded and failed_write.revision == rev + 1
        assert failed_write.responses == [None, 1]

    contract(run, store, check)


def test_invalid_transactions_write_nothing(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore) -> None:
        rev = await s.put("/v/k", b"v")
        bad: list[tuple[Sequence[Compare], Sequence[Op], Sequence[Op]]] = [
            ([], [Put("/v/a", b"1"), Put("/v/a", b"2")], []),
            ([], [Put("/v/a", b"1"), Delete("/v/a")], []),
            ([], [Delete("/v/", prefix=True), Put("/v/a", b"1")], []),
            ([], [], [Put("/v/a", b"1"), Put("/v/a", b"2")]),
            ([], [Put(f"/v/{i}", b"") for i in range(MAX_TXN_OPS + 1)], []),
            ([Compare("/v/k", "value", "==", 1)], [Put("/v/a", b"1")], []),
            ([Compare("/v/k", "version", "==", b"1")], [Put("/v/a", b"1")], []),
        ]
        for compare, success, failure in bad:
            with pytest.raises(InvalidTransaction):
                await s.transaction(compare, success, failure)
        await s.transaction([], [Delete("/v/a"), Delete("/v/", prefix=True), Get("/v/k")])  # deletes overlap
        rev += 1
        with pytest.raises(LeaseNotFound):
            await s.transaction([], [Put("/v/b", b"1"), Put("/v/c", b"1", lease=0x7EADBEEF)])
        assert await s.get_prefix("/v/") == [] and await s.current_revision() == rev
        ok = await s.transaction([Compare("/v/b", "version", ">", 0)], [Put("/v/c", b"", lease=0x7EADBEEF)],
                                 [Put("/v/b", b"2")])
        assert not ok.succeeded and (await s.get("/v/b")) is not None, "only the branch taken needs its lease"

    contract(run, store, check)


def test_only_one_concurrent_create_wins(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore) -> None:
        async def create(i: int) -> bool:
            result = await s.transaction([Compare("/leader", "create_revision", "==", 0)],
                                         [Put("/leader", str(i).encode())], [Get("/leader")])
            return result.succeeded

        won = await asyncio.gather(*(create(i) for i in range(16)))
        assert won.count(True) == 1
        leader = await s.get("/leader")
        assert leader is not None and leader.value == str(won.index(True)).encode() and leader.version == 1

    contract(run, store, check)


# watches -------------------------------------------------------------------------------------------------


def test_watch_delivers_changes_in_revision_order(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore) -> None:
        watch = s.watch_prefix("/w/")  # starts now: the changes below come even before iteration begins
        r1 = await s.put("/w/a", b"1")
        r2 = await s.put("/w/b", b"2")
        await s.put("/elsewhere", b"x")
        r3 = (await s.transaction([], [Put("/w/c", b"3"), Delete("/w/a"), Put("/w/b", b"22")])).revision
        await s.delete("/w/none")
        assert await s.delete_prefix("/w/") == 2
        r4 = await s.current_revision()
        lease = await s.grant_lease(60)
        r5 = await s.put("/w/leased", b"l", lease=lease)
        assert await take(watch, 8) == [  # puts carry the key's create_revision, version and lease, as etcd's
            WatchEvent("put", "/w/a", b"1", r1, None, r1, 1),
            WatchEvent("put", "/w/b", b"2", r2, None, r2, 1),
            WatchEvent("put", "/w/c", b"3", r3, None, r3, 1),
            WatchEvent("delete", "/w/a", b"", r3, b"1"),
            WatchEvent("put", "/w/b", b"22", r3, b"2", r2, 2),
            WatchEvent("delete", "/w/b", b"", r4, b"22"),
            WatchEvent("delete", "/w/c", b"", r4, b"3"),
            WatchEvent("put", "/w/leased", b"l", r5, None, r5, 1, lease),
        ]
        await close(watch)
        await s.revoke_lease(lease)

    contract(run, store, check)


def test_watch_resumes_from_an_old_revision(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore) -> None:
        written = [await s.put(f"/r/{i}", b"%d" % i) for i in range(6)]
        start = written[2]

        async def write_more() -> None:
            for i in range(6, 30):
                written.append(await s.put(f"/r/{i % 4}", b"%d" % i))
                if i % 5 == 0:
                    await asyncio.sleep(0)

        writer = asyncio.create_task(write_more())  # history replay and live events meet mid-stream
        watch = s.watch_prefix("/r/", start_revision=start)
        events = await take(watch, 4)
        await writer
        events += await take(watch, len(written) - 6)
        assert [e.revision for e in events] == written[2:]
        assert [e.value for e in events] == [b"%d" % i for i in range(2, 30)]
        await close(watch)
        future = s.watch_prefix("/r/", start_revision=written[-1] + 2)
        await s.put("/r/skipped", b"")
        last = await s.put("/r/seen", b"")
        assert [e.key for e in await take(future, 1)] == ["/r/seen"] and last == written[-1] + 2
        await close(future)

    contract(run, store, check)


def test_watch_from_a_compacted_revision_raises(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore) -> None:
        revs = [await s.put("/c/k", b"%d" % i) for i in range(5)]
        await s.compact(revs[2])
        watch = s.watch_prefix("/c/", start_revision=revs[1])
        with pytest.raises(Compacted) as caught:
            await take(watch, 1)
        assert caught.value.compact_revision == revs[2]
        at_compaction = s.watch_prefix("/c/", start_revision=revs[2])
        assert [e.revision for e in await take(at_compaction, 3)] == revs[2:]
        await close(at_compaction)
        await s.compact(revs[1])  # already compacted: nothing to do
        with pytest.raises(InvalidRevision):
            await s.compact(revs[-1] + 100)

    contract(run, store, check)


# leases --------------------------------------------------------------------------------------------------


def test_lease_grant_keep_alive_revoke(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore) -> None:
        lease = await s.grant_lease(30)
        assert lease > 0 and lease != await s.grant_lease(30)
        await s.put("/l/b", b"b", lease=lease)
        await s.put("/l/a", b"a", lease=lease)
        await s.put("/l/c", b"c")
        kv = await s.get("/l/a")
        assert kv is not None and kv.lease == lease
        assert 0 < await s.keep_alive(lease) <= 30
        watch = s.watch_prefix("/l/")
        before = await s.current_revision()
        await s.revoke_lease(lease)
        assert await take(watch, 2) == [WatchEvent("delete", "/l/a", b"", before + 1, b"a"),
                                        WatchEvent("delete", "/l/b", b"", before + 1, b"b")]
        assert [kv.key for kv in await s.get_prefix("/l/")] == ["/l/c"]
        with pytest.raises(LeaseNotFound):
            await s.keep_alive(lease)
        with pytest.raises(LeaseNotFound):
            await s.revoke_lease(lease)
        with pytest.raises(LeaseNotFound):
            await s.put("/l/d", b"d", lease=lease)
        assert await s.get("/l/d") is None
        other = await s.grant_lease(30)
        await s.put("/l/c", b"c2", lease=other)
        await s.put("/l/c", b"c3")  # a put without a lease detaches the key
        await s.revoke_lease(other)
        assert (await s.get("/l/c")) is not None
        await close(watch)

    contract(run, store, check)


def test_lease_expiry_deletes_its_keys(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore) -> None:
        expiring, kept = await s.grant_lease(1), await s.grant_lease(1)  # etcd rounds 1 s up to its minimum
        await s.put("/e/expiring", b"1", lease=expiring)
        await s.put("/e/kept", b"2", lease=kept)
        watch = s.watch_prefix("/e/")
        before = await s.current_revision()

        async def keep() -> None:
            while True:
                await s.keep_alive(kept)
                await asyncio.sleep(0.3)

        keeper = asyncio.create_task(keep())
        try:
            expired = WatchEvent("delete", "/e/expiring", b"", before + 1, b"1")
            assert await take(watch, 1, timeout=6) == [expired]
            assert await s.get("/e/expiring") is None
            assert await s.get("/e/kept") is not None, "keep-alive holds the other lease"
            with pytest.raises(LeaseNotFound):
                await s.keep_alive(expiring)
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        await s.revoke_lease(kept)
        await wait_until(lambda: _absent(s, "/e/kept"), timeout=2)
        await close(watch)

    contract(run, store, check)


async def _absent(s: MetadataStore, key: str) -> bool:
    return await s.get(key) is None


# bad input -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["", "relative", "/nul\0byte", "\0/"])
def test_invalid_keys_are_refused(run: Callable[..., Any], store: StoreFactory, key: str) -> None:
    async def check(s: MetadataStore) -> None:
        rev = await s.current_revision()
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: s.get(key), lambda: s.get_prefix(key), lambda: s.put(key, b"v"), lambda: s.delete(key),
            lambda: s.delete_prefix(key), lambda: s.transaction([], [Put("/ok", b""), Put(key, b"v")]),
            lambda: s.transaction([Compare(key, "version", "==", 0)], [Put("/ok", b"")]),
            lambda: s.transaction([], [Put("/ok", b"")], [Get(key)])]
        for call in calls:
            with pytest.raises(InvalidKey):
                await call()
        with pytest.raises(InvalidKey):
            s.watch_prefix(key)
        assert await s.get("/ok") is None and await s.current_revision() == rev

    contract(run, store, check)


def test_value_size_limit(run: Callable[..., Any], store: StoreFactory) -> None:
    async def check(s: MetadataStore) -> None:
        key = "/danube-data/storage/topics/default/a-rather-long-topic-name/objects/00000000000000000000"
        with pytest.raises(ValueTooLarge):
            await s.put(key, b"x" * (MAX_VALUE_BYTES + 1))
        with pytest.raises(ValueTooLarge):
            await s.transaction([], [Put("/a", b""), Put(key, b"x" * (MAX_VALUE_BYTES + 1))])
        with pytest.raises(ValueTooLarge):  # each value fits, the request does not
            await s.transaction([], [Put("/a", b"x" * (MAX_VALUE_BYTES * 3 // 4)),
                                     Put("/b", b"x" * (MAX_VALUE_BYTES * 3 // 4))])
        assert await s.get_prefix("/") == []
        rev = await s.put(key, b"x" * MAX_VALUE_BYTES)  # the limit itself fits in one etcd request
        kv = await s.get(key)
        assert kv is not None and len(kv.value) == MAX_VALUE_BYTES and kv.mod_revision == rev
        with pytest.raises(TypeError):
            await s.put("/a", "text")  # type: ignore[arg-type]

    contract(run, store, check)

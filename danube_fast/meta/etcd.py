"""EtcdStore: the MetadataStore on an etcd v3 cluster, through grpc.aio channels and aetcd's generated stubs.

Requests use aetcd's generated etcd protocol (`aetcd.rpc`), not its Client: that opens only plaintext
channels (etcd_member.py opens ours, with TLS when asked), `Client.transaction` drops the response header
(the revision a transaction made), and its shared watcher ignores a server-side cancel without compaction
(the iterator would wait forever).

Every call has a deadline and etcd's "hasleader" metadata, so an unreachable or leaderless member fails fast
with MetadataUnavailable. With several endpoints, a call that finds its endpoint unreachable moves the next
calls to the next endpoint; it is not retried here (MetadataUnavailable is retriable: the caller decides).
With a user (EtcdAccess), every call carries the member's auth token; a call refused for a stale token logs
in again and is sent once more. A refused certificate or user is MetadataRefused, naming the endpoint and
what was refused (docs/SECURITY.md#the-metadata-store-etcd-over-tls-with-authentication).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from aetcd import rpc

from danube_fast.meta.etcd_access import HTTPS, NO_ACCESS, EtcdAccess
from danube_fast.meta.etcd_member import HandshakeFailed, Member, Metadata, stale_token
from danube_fast.meta.store import (
    Compacted,
    Compare,
    Get,
    InvalidRevision,
    KeyValue,
    LeaseNotFound,
    MetadataError,
    MetadataRefused,
    MetadataStoreFull,
    MetadataUnavailable,
    Op,
    Put,
    TxnResult,
    ValueTooLarge,
    WatchEvent,
    check_key,
    check_txn,
    prefix_range_end,
)

T = TypeVar("T")
REQUIRE_LEADER = (("hasleader", "true"),)  # etcd refuses the call (UNAVAILABLE) when it has no leader
UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
# etcd's ErrGRPCNoSpace (api/v3rpc/rpctypes/error.go), whose text is how etcd's own client tells it apart from
# its other RESOURCE_EXHAUSTED errors ("too many requests"): the backend reached --quota-backend-bytes.
NO_SPACE = "mvcc: database space exceeded"
_RESULTS = {"==": rpc.Compare.EQUAL, "!=": rpc.Compare.NOT_EQUAL, "<": rpc.Compare.LESS,
            ">": rpc.Compare.GREATER}
_TARGETS = {"value": rpc.Compare.VALUE, "version": rpc.Compare.VERSION, "create_revision": rpc.Compare.CREATE,
            "mod_revision": rpc.Compare.MOD}
RETRY_FIRST_DELAY, RETRY_MAX_DELAY = 0.05, 1.0  # seconds between attempts to resume a watch
STATUS_TASK = "_AioCall._handle_status_once_received"  # grpc.aio's task awaiting a stream's final status
DRAIN_SECONDS = 0.5  # bound on waiting for it after a cancel


def _status_tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", None) == STATUS_TASK}


async def _cancel(call: Any, before: set[asyncio.Task[Any]]) -> None:
    """Cancel a stream, then wait for gRPC's STATUS_TASK of it, which ends a few loop iterations later: if
    the loop closed first, grpc's completion queue would forward that event to the closed loop from whichever
    loop polls next, which reports "Event loop is closed" (1 in 10 loop pairs without this wait)."""
    call.cancel()
    pending = {t for t in _status_tasks() - before if not t.done()}  # ours, maybe a concurrent stream's
    if pending:
        await asyncio.wait(pending, timeout=DRAIN_SECONDS)


def _check_endpoint(endpoint: str) -> str:
    host, _, port = endpoint.removeprefix(HTTPS).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"an etcd endpoint is host:port or https://host:port, not {endpoint!r}")
    return endpoint


def _kv(kv: Any) -> KeyValue:
    return KeyValue(kv.key.decode(), kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)


def _event(event: Any) -> WatchEvent:
    deleted = event.type == rpc.Event.DELETE
    prev = event.prev_kv.value if event.HasField("prev_kv") else None
    kv = event.kv
    if deleted:
        return WatchEvent("delete", kv.key.decode(), b"", kv.mod_revision, prev)
    return WatchEvent("put", kv.key.decode(), kv.value, kv.mod_revision, prev, kv.create_revision, kv.version,
                      kv.lease)


def _request(op: Op) -> Any:
    key = op.key.encode()
    if isinstance(op, Put):
        return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=op.value, lease=op.lease))
    end = prefix_range_end(key) if op.prefix else b""
    if isinstance(op, Get):
        return rpc.RequestOp(request_range=rpc.RangeRequest(key=key, range_end=end))
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key, range_end=end))


def _compare(c: Compare) -> Any:
    key = c.key.encode()
    pb = rpc.Compare(key=key, result=_RESULTS[c.op], target=_TARGETS[c.target],
                     range_end=prefix_range_end(key) if c.prefix else b"")
    setattr(pb, c.target, c.value)  # the protobuf field is named like the target
    return pb


def _response(op: Any) -> list[KeyValue] | int | None:
    kind = op.WhichOneof("response")
    if kind == "response_range":
        return [_kv(kv) for kv in op.response_range.kvs]
    return op.response_delete_range.deleted if kind == "response_delete_range" else None


class EtcdStore:
    """Connect with `await EtcdStore.connect(["127.0.0.1:2379"])`; close with `await store.close()`. TLS
    when an endpoint is written https:// or `access` has a CA or client certificate; a user when `access`
    has one (its password resolved here: EtcdAccessError if there is none)."""

    def __init__(self, endpoints: Sequence[str], *, access: EtcdAccess = NO_ACCESS, timeout: float = 5.0,
                 watch_retry_seconds: float = 30.0) -> None:
        if not endpoints:
            raise ValueError("EtcdStore needs at least one endpoint")
        access.check()
        tls = access.tls or any(e.startswith(HTTPS) for e in endpoints)
        password = access.resolve_password()
        self._members = [Member(_check_endpoint(e), access, tls, password) for e in endpoints]
        self._endpoints = [m.name for m in self._members]
        self._tls = tls
        self._active = 0
        self._timeout = timeout
        self._watch_retry_seconds = watch_retry_seconds
        self._seen = 0  # the highest revision any response showed: where a watch "from now" starts
        self._closed = False

    @classmethod
    async def connect(cls, endpoints: Sequence[str], *, access: EtcdAccess = NO_ACCESS, timeout: float = 5.0,
                      watch_retry_seconds: float = 30.0) -> EtcdStore:
        """Raises MetadataUnavailable if no call reaches etcd within `timeout`; MetadataRefused at once when
        etcd refuses the TLS handshake (a certificate) or the user, or serves TLS to this plaintext client;
        EtcdAccessError for settings that cannot work."""
        store = cls(endpoints, access=access, timeout=timeout, watch_retry_seconds=watch_retry_seconds)
        deadline = time.monotonic() + timeout
        probed = False
        try:
            for member in store._members:
                member.open()  # creates the channel; gRPC connects on the first call
            while True:
                # A channel still in reconnect backoff (etcd just restarted) fails at once: try until the
                # deadline, as the docstring promises, instead of giving up on the first refusal.
                member = store._member()
                try:
                    await store.current_revision()
                    break
                except HandshakeFailed as e:
                    if e.certain:  # a certificate refused: waiting will not change that
                        raise MetadataRefused(str(e)) from e
                    if time.monotonic() + 0.1 > deadline:
                        raise
                except MetadataUnavailable as e:
                    if not store._tls and not probed and "Socket closed" in str(e):
                        probed = True
                        if await member.speaks_tls():
                            raise member.plaintext_on_tls() from e
                    if time.monotonic() + 0.1 > deadline:
                        raise
                await asyncio.sleep(0.1)
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        self._closed = True
        for member in self._members:
            await member.close()


    def _member(self) -> Member:
        if self._closed:
            raise MetadataUnavailable("the etcd metadata store is closed")
        return self._members[self._active]

    def _error(self, e: grpc.aio.AioRpcError, member: Member) -> MetadataError:
        code, details = e.code(), e.details() or ""
        refused = member.refusal(code, details)
        if isinstance(refused, HandshakeFailed):
            self._active = (self._active + 1) % len(self._members)
        if refused is not None:
            return refused
        if code in UNREACHABLE:
            self._active = (self._active + 1) % len(self._members)
            return MetadataUnavailable(f"etcd is unreachable at {', '.join(self._endpoints)}: {details}")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and NO_SPACE in details:
            return MetadataStoreFull(f"etcd's space quota is full, its NOSPACE alarm refuses writes "
                                     f"({details}): compact and defragment etcd, then disarm the alarm")
        if code == grpc.StatusCode.NOT_FOUND and "lease not found" in details:
            return LeaseNotFound(f"etcd: {details}")
        if "request is too large" in details:
            return ValueTooLarge(f"etcd: {details}")
        if code == grpc.StatusCode.OUT_OF_RANGE and "future revision" in details:
            return InvalidRevision(f"etcd: {details}")
        return MetadataError(f"etcd failed: {code.name}: {details}")

    async def _logged_in(self, call: Callable[[Member, Metadata], Awaitable[T]]) -> T:
        """`call(member, metadata)` on the active member; once more after a fresh login when etcd says the
        auth token went stale; any other failure as a MetadataError."""
        for attempt in (1, 2):
            member = self._member()
            try:
                return await call(member, await member.metadata(REQUIRE_LEADER, self._timeout))
            except grpc.aio.AioRpcError as e:
                if attempt == 1 and stale_token(e.code(), e.details() or ""):
                    member.forget_token()
                    continue
                raise self._error(e, member) from e
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _call(self, stub: str, method: str, request: Any) -> Any:
        async def unary(member: Member, metadata: Metadata) -> Any:
            return await getattr(getattr(member, stub), method)(request, timeout=self._timeout,
                                                                metadata=metadata)

        response = await self._logged_in(unary)
        self._seen = max(self._seen, response.header.revision)
        return response


    async def get(self, key: str) -> KeyValue | None:
        response = await self._call("kvstub", "Range", rpc.RangeRequest(key=check_key(key)))
        return _kv(response.kvs[0]) if response.kvs else None

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        key = check_key(prefix)
        request = rpc.RangeRequest(key=key, range_end=prefix_range_end(key))
        response = await self._call("kvstub", "Range", request)
        return [_kv(kv) for kv in response.kvs]  # etcd returns a range in key order

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        check_txn((), [Put(key, value, lease)], ())
        request = rpc.PutRequest(key=key.encode(), value=value, lease=lease)
        return int((await self._call("kvstub", "Put", request)).header.revision)

    async def delete(self, key: str) -> bool:
        response = await self._call("kvstub", "DeleteRange", rpc.DeleteRangeRequest(key=check_key(key)))
        return bool(response.deleted)

    async def delete_prefix(self, prefix: str) -> int:
        key = check_key(prefix)
        request = rpc.DeleteRangeRequest(key=key, range_end=prefix_range_end(key))
        return int((await self._call("kvstub", "DeleteRange", request)).deleted)

    async def transaction(self, compare: Sequence[Compare], success: Sequence[Op],
                          failure: Sequence[Op] = ()) -> TxnResult:
        check_txn(compare, success, failure)
        request = rpc.TxnRequest(compare=[_compare(c) for c in compare],
                                 success=[_request(op) for op in success],
                                 failure=[_request(op) for op in failure])
        response = await self._call("kvstub", "Txn", request)
        responses = [_response(r) for r in response.responses]
        return TxnResult(response.succeeded, response.header.revision, responses)

    async def current_revision(self) -> int:
        request = rpc.RangeRequest(key=b"\0", count_only=True)
        return int((await self._call("kvstub", "Range", request)).header.revision)

    async def compact(self, revision: int) -> None:
        if revision < 1:
            raise InvalidRevision(f"cannot compact to revision {revision}")
        try:
            await self._call("kvstub", "Compact", rpc.CompactionRequest(revision=revision))
        except MetadataError as e:
            if "required revision has been compacted" not in str(e):  # else: nothing to do
                raise


    async def grant_lease(self, ttl_seconds: int) -> int:
        response = await self._call("leasestub", "LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl_seconds))
        if response.error:
            raise MetadataError(f"etcd refused a lease: {response.error}")
        return int(response.ID)

    async def keep_alive(self, lease: int) -> int:
        async def once(member: Member, metadata: Metadata) -> Any:
            # One request, then half-close: etcd answers and ends the stream: nothing is left to cancel.
            call = member.leasestub.LeaseKeepAlive(timeout=self._timeout, metadata=metadata)
            await call.write(rpc.LeaseKeepAliveRequest(ID=lease))
            await call.done_writing()
            response = await call.read()
            while await call.read() is not grpc.aio.EOF:
                pass
            await call.code()  # gRPC has delivered the final status: no completion is left in flight
            return response

        response = await self._logged_in(once)
        if response is grpc.aio.EOF:
            raise MetadataUnavailable(f"etcd at {', '.join(self._endpoints)} left a keep-alive unanswered")
        if response.TTL <= 0:
            raise LeaseNotFound(f"lease {lease:x} expired or was revoked")
        return int(response.TTL)

    async def revoke_lease(self, lease: int) -> None:
        await self._call("leasestub", "LeaseRevoke", rpc.LeaseRevokeRequest(ID=lease))


    def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        """The start is fixed by this call: with start_revision 0, the watch starts after the last revision
        this store has seen, so no change made after the call is missed (some just before it may come)."""
        key = check_key(prefix)
        if start_revision < 0:
            raise InvalidRevision(f"a watch cannot start at revision {start_revision}")
        return self._watch(key, start_revision or self._seen + 1, implicit_start=start_revision == 0)

    async def _watch(self, key: bytes, start: int, implicit_start: bool) -> AsyncIterator[WatchEvent]:
        create = rpc.WatchCreateRequest(key=key, range_end=prefix_range_end(key), prev_kv=True)
        failing_since: float | None = None
        delay = RETRY_FIRST_DELAY
        while True:
            cause = "etcd ended the watch stream"
            member = self._member()
            before = _status_tasks()
            call = None
            try:
                metadata = await member.metadata(REQUIRE_LEADER, self._timeout)
                call = rpc.WatchStub(member.channel).Watch(metadata=metadata)
                create.start_revision = start
                await call.write(rpc.WatchRequest(create_request=create))
                while (response := await call.read()) is not grpc.aio.EOF:
                    if response.compact_revision:
                        if not implicit_start:
                            raise Compacted(f"etcd compacted the history a watch from revision {start} needs",
                                            response.compact_revision)
                        start = response.compact_revision  # "from now" is at least this late
                        break
                    if response.canceled:
                        cause = f"etcd canceled the watch: {response.cancel_reason}"
                        if stale_token(grpc.StatusCode.UNAUTHENTICATED, response.cancel_reason):
                            member.forget_token()  # the next attempt logs in again
                        elif "PermissionDenied" in response.cancel_reason:
                            raise member.refusal(grpc.StatusCode.PERMISSION_DENIED,
                                                 response.cancel_reason) or MetadataRefused(cause)
                        break
                    failing_since, delay = None, RETRY_FIRST_DELAY
                    self._seen = max(self._seen, response.header.revision)
                    for event in response.events:
                        if event.kv.mod_revision >= start:
                            implicit_start = False
                            yield _event(event)
                    if response.events:
                        start = max(start, response.events[-1].kv.mod_revision + 1)
            except grpc.aio.AioRpcError as e:
                error = self._error(e, member)
                if not isinstance(error, MetadataUnavailable):
                    raise error from e
                cause = str(error)
            finally:
                if call is not None:
                    await _cancel(call, before)
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since >= self._watch_retry_seconds:
                raise MetadataUnavailable(f"etcd is unreachable at {', '.join(self._endpoints)}: a watch "
                                          f"could not resume for {self._watch_retry_seconds} s ({cause})")
            await asyncio.sleep(delay)
            delay = min(2 * delay, RETRY_MAX_DELAY)

"""The deny list on its own (docs/SECURITY.md#revoking-tokens): DenyList on a real LocalCache over the
embedded store, the SecurityAdmin revocation calls in process (validation, and the cleanup of entries whose
token has expired), and the claims revocation needs. Against real brokers: test_security_cli.py and
test_secure_cluster.py."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest

from danube_fast.broker.services.security_admin import SecurityAdminService
from danube_fast.meta import keys
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import RevokedSubject, RevokedToken
from danube_fast.proto import SecurityAdmin_pb2 as pb
from danube_fast.security.config import MAX_LEEWAY_S
from danube_fast.security.revocation import DenyList
from danube_fast.security.tokens import TokenVerifier, VerifiedToken, sign_token
from tests.compat.compat_support import run_async
from tests.security.conftest import AUDIENCE, ISSUER, Pki
from tests.security.test_security_units import hs256

NOW = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


class Context:
    """What the servicer's `unary` wrapper uses of a grpc context: abort."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


@asynccontextmanager
async def cached_store(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedStore, LocalCache]]:
    store = await EmbeddedStore.open(tmp_path / "meta.db")
    cache = await LocalCache.start(store, [keys.security_prefix()])
    try:
        yield store, cache
    finally:
        await cache.close()
        await store.close()


def token(jti: str | None = "t-1", iat: float | None = NOW - 60, principal: str = "bob") -> VerifiedToken:
    return VerifiedToken(principal, 0.0, NOW + 600, jti, iat)


def on_cache(tmp_path: Path, test: Callable[[EmbeddedStore, LocalCache, DenyList, Clock], Awaitable[None]]
             ) -> None:
    async def scenario() -> None:
        async with cached_store(tmp_path) as (store, cache):
            clock = Clock()
            await test(store, cache, DenyList(cache, clock), clock)
    run_async(scenario())


async def put(store: EmbeddedStore, cache: LocalCache, key: str, value: bytes) -> None:
    await cache.wait_for_revision(await store.put(key, value), 5)


async def revoke_token(store: EmbeddedStore, cache: LocalCache, jti: str, exp: int | None) -> None:
    await put(store, cache, keys.security_revoked_token(jti), RevokedToken(exp, int(NOW)).to_json())


async def revoke_subject(store: EmbeddedStore, cache: LocalCache, principal: str, before: int) -> None:
    value = RevokedSubject(before, int(NOW)).to_json()
    await put(store, cache, keys.security_revoked_subject(principal), value)


def test_a_revoked_jti_is_refused_and_others_are_not(tmp_path: Path) -> None:
    async def test(store: EmbeddedStore, cache: LocalCache, deny: DenyList, clock: Clock) -> None:
        assert deny.refusal(token()) is None
        await revoke_token(store, cache, "t-1", int(NOW + 600))
        refusal = deny.refusal(token())
        assert refusal is not None and "revoked" in refusal and "jti" in refusal
        assert deny.refusal(token(jti="t-2")) is None
        assert deny.refusal(token(jti=None)) is None
        assert deny.refusal(token(jti="a/b")) is None  # cannot be a key, so cannot have been revoked by id
        await store.delete(keys.security_revoked_token("t-1"))
        await cache.wait_for_revision(await store.current_revision(), 5)
        assert deny.refusal(token()) is None
    on_cache(tmp_path, test)


def test_an_entry_past_its_tokens_expiry_is_ignored(tmp_path: Path) -> None:
    async def test(store: EmbeddedStore, cache: LocalCache, deny: DenyList, clock: Clock) -> None:
        exp = int(NOW + 10)
        await revoke_token(store, cache, "t-1", exp)
        await revoke_token(store, cache, "forever", None)
        clock.now = exp + MAX_LEEWAY_S  # the last moment any broker could still accept the token
        assert deny.refusal(token()) is not None
        clock.now = exp + MAX_LEEWAY_S + 1
        assert deny.refusal(token()) is None
        assert deny.refusal(token(jti="forever")) is not None  # no exp given: kept, whatever the time
    on_cache(tmp_path, test)


def test_a_revoked_subject_refuses_tokens_issued_before_and_without_iat(tmp_path: Path) -> None:
    async def test(store: EmbeddedStore, cache: LocalCache, deny: DenyList, clock: Clock) -> None:
        before = int(NOW)
        await revoke_subject(store, cache, "bob", before)
        older = deny.refusal(token(jti=None, iat=before - 1))
        assert older is not None and "bob's tokens issued before" in older and "2027-01-15T08:00:00Z" in older
        assert deny.refusal(token(iat=before - 0.5)) is not None
        assert deny.refusal(token(iat=before)) is None  # issued at the cut: accepted
        assert deny.refusal(token(iat=before + 100)) is None
        no_iat = deny.refusal(token(iat=None))
        assert no_iat is not None and "no iat" in no_iat
        assert deny.refusal(token(iat=before - 1, principal="carol")) is None
        # A later revocation of the same subject replaces the first (a new value at a new mod revision).
        await revoke_subject(store, cache, "bob", before + 200)
        assert deny.refusal(token(iat=before + 100)) is not None
    on_cache(tmp_path, test)


def test_an_unreadable_entry_refuses_what_it_covers(tmp_path: Path) -> None:
    async def test(store: EmbeddedStore, cache: LocalCache, deny: DenyList, clock: Clock) -> None:
        await put(store, cache, keys.security_revoked_token("t-1"), b'{"exp": "soon"}')
        await put(store, cache, keys.security_revoked_subject("bob"), b"not json")
        assert deny.refusal(token()) is not None
        refusal = deny.refusal(token(jti=None, iat=NOW + 1000))
        assert refusal is not None and "unreadable" in refusal
    on_cache(tmp_path, test)


# -- the admin calls, in process --------------------------------------------------------------------------

def on_service(tmp_path: Path, test: Callable[[SecurityAdminService, EmbeddedStore, Clock], Awaitable[None]]
               ) -> None:
    async def scenario() -> None:
        async with cached_store(tmp_path) as (store, cache):
            clock = Clock()
            await test(SecurityAdminService(store, cache, clock), store, clock)
    run_async(scenario())


async def refused(call: Awaitable[Any]) -> Aborted:
    with pytest.raises(Aborted) as info:
        await call
    return info.value


def test_entries_of_expired_tokens_are_dropped_by_the_next_list_or_revoke(tmp_path: Path) -> None:
    async def test(svc: SecurityAdminService, store: EmbeddedStore, clock: Clock) -> None:
        ctx: Any = Context()
        soon, later = int(NOW + 60), int(NOW + 3600)
        answer = await svc.RevokeToken(pb.RevokeTokenRequest(jti="soon", exp=soon, sub="bob"), ctx)
        assert (answer.jti, answer.sub, answer.exp, answer.revoked_at) == ("soon", "bob", soon, int(NOW))
        await svc.RevokeToken(pb.RevokeTokenRequest(jti="later", exp=later), ctx)
        await svc.RevokeToken(pb.RevokeTokenRequest(jti="unknown"), ctx)  # no exp: kept until removed
        await svc.RevokeSubject(pb.RevokeSubjectRequest(sub="carol", before=int(NOW)), ctx)
        listed = await svc.ListRevocations(pb.ListRevocationsRequest(), ctx)
        assert [t.jti for t in listed.tokens] == ["later", "soon", "unknown"]
        assert [(s.sub, s.before) for s in listed.subjects] == [("carol", int(NOW))]

        clock.now = soon + MAX_LEEWAY_S + 1
        listed = await svc.ListRevocations(pb.ListRevocationsRequest(), ctx)
        assert [t.jti for t in listed.tokens] == ["later", "unknown"]
        assert await store.get(keys.security_revoked_token("soon")) is None  # deleted, not just hidden
        clock.now = later + MAX_LEEWAY_S + 1
        await svc.RevokeToken(pb.RevokeTokenRequest(jti="new", exp=int(clock.now + 60)), ctx)
        assert await store.get(keys.security_revoked_token("later")) is None
        assert await store.get(keys.security_revoked_token("unknown")) is not None
        assert (await svc.Unrevoke(pb.UnrevokeRequest(jti="unknown"), ctx)).existed
        assert (await svc.Unrevoke(pb.UnrevokeRequest(sub="carol"), ctx)).existed
        assert not (await svc.Unrevoke(pb.UnrevokeRequest(sub="carol"), ctx)).existed
        listed = await svc.ListRevocations(pb.ListRevocationsRequest(), ctx)
        assert [t.jti for t in listed.tokens] == ["new"] and not listed.subjects
    on_service(tmp_path, test)


@pytest.mark.parametrize(("method", "request_", "words"), [
    ("RevokeToken", pb.RevokeTokenRequest(jti=""), "jti must not be empty"),
    ("RevokeToken", pb.RevokeTokenRequest(jti="a/b"), "must not contain '/'"),
    ("RevokeToken", pb.RevokeTokenRequest(jti="x" * 257), "at most 256"),
    ("RevokeToken", pb.RevokeTokenRequest(jti="t", exp=int(NOW) - MAX_LEEWAY_S - 1), "expired at"),
    ("RevokeToken", pb.RevokeTokenRequest(jti="t", sub="a/b"), "sub"),
    ("RevokeSubject", pb.RevokeSubjectRequest(sub="", before=int(NOW)), "principal must not be empty"),
    ("RevokeSubject", pb.RevokeSubjectRequest(sub="bob"), "before"),
    ("RevokeSubject", pb.RevokeSubjectRequest(sub="bob", before=int(NOW) + 3600), "in the future"),
    ("RevokeSubject", pb.RevokeSubjectRequest(sub="cert:alice", before=int(NOW)), "certificate principal"),
    ("Unrevoke", pb.UnrevokeRequest(), "exactly one"),
    ("Unrevoke", pb.UnrevokeRequest(jti="t", sub="bob"), "exactly one"),
])
def test_bad_revocations_are_invalid_arguments(tmp_path: Path, method: str, request_: Any,
                                               words: str) -> None:
    async def test(svc: SecurityAdminService, store: EmbeddedStore, clock: Clock) -> None:
        error = await refused(getattr(svc, method)(request_, Context()))
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT and words in error.details, error
        assert await store.get_prefix(keys.security_revoked_prefix()) == []
    on_service(tmp_path, test)


# -- the claims revocation needs --------------------------------------------------------------------------

def test_signed_tokens_carry_a_jti_and_iat_and_the_verifier_keeps_them(pki: Pki) -> None:
    before = time.time()
    signed = sign_token(key=pki.secret, algorithm="HS256", subject="svc", issuer=ISSUER, audience=AUDIENCE,
                        ttl_s=60)
    other = sign_token(key=pki.secret, algorithm="HS256", subject="svc", issuer=ISSUER, audience=AUDIENCE,
                       ttl_s=60)
    claims, others = (jwt.decode(t, options={"verify_signature": False}) for t in (signed, other))
    assert len(claims["jti"]) == 36 and claims["jti"] != others["jti"]  # a uuid4 each
    assert int(before) <= claims["iat"] <= time.time()
    verified = TokenVerifier(hs256(pki)).claims(signed)
    assert (verified.principal, verified.jti, verified.issued_at) == ("svc", claims["jti"], claims["iat"])
    bare = TokenVerifier(hs256(pki)).claims(pki.token("svc", iat=None))
    assert bare.jti is None and bare.issued_at is None

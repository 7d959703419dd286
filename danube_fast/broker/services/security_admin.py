"""SecurityAdmin on the admin port: roles, bindings and the deny list of tokens in the metadata store under
`/security/` (docs/SECURITY.md, docs/METADATA.md#security-keys). A change is answered once this broker's
cache holds it, so the caller's next call here already sees it; other brokers see it when their cache gets
the event.

The deny list's entries by token id are dropped here once their token has expired everywhere
(revocation.lapsed): every call that adds, lists or removes revocations first deletes the lapsed ones, each
compared on its mod revision so that a token revoked again meanwhile stays.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TypeVar

from danube_fast.broker.services.status import Context, unary
from danube_fast.errors import ApiError, invalid, not_found, precondition
from danube_fast.meta import keys
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import BadValue, Resource, RevokedSubject, RevokedToken
from danube_fast.meta.store import Compare, Delete, Get, InvalidKey, KeyValue, MetadataStore, Put
from danube_fast.proto import SecurityAdmin_pb2 as pb
from danube_fast.security.config import MAX_LEEWAY_S
from danube_fast.security.rbac import check_scope, parse_permissions, role_value
from danube_fast.security.revocation import iso, lapsed
from danube_fast.security.tokens import CERT_PREFIX

CACHE_WAIT = 5.0  # seconds a change may take to come back through this broker's watch

E = TypeVar("E", bound=Resource)


def _role_key(name: str) -> str:
    try:
        return keys.security_role(name)
    except InvalidKey as e:
        raise invalid(f"role name: {e}") from None


def _binding_key(binding: pb.Binding) -> str:
    try:
        check_scope(binding.scope)
        return keys.security_binding(binding.principal, binding.role, binding.scope)
    except InvalidKey as e:
        raise invalid(f"binding: {e}") from None


def _bindings(found: list[KeyValue]) -> list[pb.Binding]:
    out = []
    for kv in found:
        principal, role, scope = keys.parse_security_binding(kv.key)
        out.append(pb.Binding(principal=principal, role=role, scope=scope))
    return out


def _role(name: str, value: bytes) -> pb.Role:
    return pb.Role(name=name, permissions=json.loads(value)["permissions"])


def _revoked_token_key(jti: str) -> str:
    try:
        return keys.security_revoked_token(jti)
    except InvalidKey as e:
        hint = " (a token whose jti cannot be a key is revoked by its subject)" if jti else ""
        raise invalid(f"{e}{hint}") from None


def _revoked_subject_key(principal: str) -> str:
    try:
        key = keys.security_revoked_subject(principal)
    except InvalidKey as e:
        raise invalid(f"sub: {e}") from None
    if principal.startswith(CERT_PREFIX):
        raise invalid(f"{principal} is a certificate principal: it has no tokens to revoke (remove its "
                      "bindings instead)")
    return key


def _token_view(jti: str, entry: RevokedToken | None) -> pb.Revocation:
    if entry is None:  # unreadable: listed, so that it can be seen and removed
        return pb.Revocation(jti=jti)
    return pb.Revocation(jti=jti, sub=entry.sub or "", exp=entry.exp or 0, revoked_at=entry.revoked_at)


def _subject_view(principal: str, entry: RevokedSubject | None) -> pb.Revocation:
    if entry is None:
        return pb.Revocation(sub=principal)
    return pb.Revocation(sub=principal, before=entry.before, revoked_at=entry.revoked_at)


class SecurityAdminService:
    def __init__(self, store: MetadataStore, cache: LocalCache,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._cache = cache
        self._clock = clock

    async def _applied(self, revision: int) -> None:
        await self._cache.wait_for_revision(revision, CACHE_WAIT)

    @unary
    async def PutRole(self, request: pb.Role, context: Context) -> pb.Role:
        key = _role_key(request.name)
        try:
            permissions = parse_permissions(request.permissions)
        except ValueError as e:
            raise invalid(f"role {request.name}: {e}") from None
        if not permissions:
            raise invalid(f"role {request.name}: give it at least one permission")
        await self._applied(await self._store.put(key, role_value(permissions)))
        return pb.Role(name=request.name, permissions=sorted(p.value for p in permissions))

    @unary
    async def GetRole(self, request: pb.RoleRequest, context: Context) -> pb.Role:
        kv = await self._store.get(_role_key(request.name))
        if kv is None:
            raise not_found(f"no role {request.name!r}")
        return _role(request.name, kv.value)

    @unary
    async def ListRoles(self, request: pb.ListRolesRequest, context: Context) -> pb.RoleList:
        kvs = await self._store.get_prefix(keys.security_roles_prefix())
        return pb.RoleList(roles=[_role(keys.parse_security_role(kv.key), kv.value) for kv in kvs])

    @unary
    async def DeleteRole(self, request: pb.RoleRequest, context: Context) -> pb.Deleted:
        key = _role_key(request.name)
        prefix = keys.security_bindings_prefix()
        read = await self._store.transaction([], [Get(prefix, prefix=True)], [])
        found = read.responses[0]
        assert isinstance(found, list)
        bound = [b for b in _bindings(found) if b.role == request.name]
        if bound:
            raise precondition(f"role {request.name!r} is still bound ({len(bound)} bindings, e.g. "
                               f"{bound[0].principal} at {bound[0].scope}): unbind it first")
        # Deleted only if no binding was written since that read: a Bind of this role meanwhile (which
        # compares that its role exists) would otherwise be left naming a role that is gone.
        txn = await self._store.transaction(
            [Compare(prefix, "mod_revision", "<", read.revision + 1, prefix=True)], [Delete(key)], [])
        if not txn.succeeded:
            raise ApiError("ABORTED", f"bindings changed while role {request.name!r} was being deleted: "
                                      "try again")
        existed = bool(txn.responses[0])
        if existed:
            await self._applied(txn.revision)
        return pb.Deleted(existed=existed)

    @unary
    async def Bind(self, request: pb.Binding, context: Context) -> pb.Binding:
        key = _binding_key(request)
        txn = await self._store.transaction([Compare(_role_key(request.role), "version", ">", 0)],
                                            [Put(key, b"{}")], [])
        if not txn.succeeded:
            raise not_found(f"no role {request.role!r}: create it first")
        await self._applied(txn.revision)
        return request

    @unary
    async def Unbind(self, request: pb.Binding, context: Context) -> pb.Deleted:
        existed = await self._store.delete(_binding_key(request))
        if existed:
            await self._applied(await self._store.current_revision())
        return pb.Deleted(existed=existed)

    @unary
    async def ListBindings(self, request: pb.ListBindingsRequest, context: Context) -> pb.BindingList:
        return pb.BindingList(bindings=[
            b for b in await self._bindings()
            if (not request.principal or b.principal == request.principal)
            and (not request.scope or b.scope == request.scope)])

    async def _bindings(self) -> list[pb.Binding]:
        return _bindings(await self._store.get_prefix(keys.security_bindings_prefix()))

    @unary
    async def RevokeToken(self, request: pb.RevokeTokenRequest, context: Context) -> pb.Revocation:
        key = _revoked_token_key(request.jti)
        if request.sub:
            _revoked_subject_key(request.sub)  # the same rules as a subject's
        now = int(self._clock())
        entry = RevokedToken(exp=request.exp or None, revoked_at=now, sub=request.sub or None)
        if lapsed(entry, now):
            raise invalid(f"the token expired at {iso(request.exp)}: every broker refuses it already")
        await self._revoked_tokens(now)
        await self._applied(await self._store.put(key, entry.to_json()))
        return _token_view(request.jti, entry)

    @unary
    async def RevokeSubject(self, request: pb.RevokeSubjectRequest, context: Context) -> pb.Revocation:
        key = _revoked_subject_key(request.sub)
        now = int(self._clock())
        if request.before == 0:
            raise invalid("before: give the time before which the subject's tokens are refused (seconds "
                          "since the epoch; the CLI takes ISO 8601 or 'now')")
        if request.before > now + MAX_LEEWAY_S:
            raise invalid(f"before {iso(request.before)} is in the future: only tokens already issued can be "
                          "revoked (to keep a principal out, remove its bindings)")
        entry = RevokedSubject(before=request.before, revoked_at=now)
        await self._revoked_tokens(now)
        await self._applied(await self._store.put(key, entry.to_json()))
        return _subject_view(request.sub, entry)

    @unary
    async def ListRevocations(self, request: pb.ListRevocationsRequest, context: Context
                              ) -> pb.RevocationList:
        tokens = await self._revoked_tokens(int(self._clock()))
        subjects = [_subject_view(principal, entry) for principal, entry, _ in await self._entries(
            keys.security_revoked_subjects_prefix(), keys.parse_security_revoked_subject, RevokedSubject)]
        return pb.RevocationList(tokens=[_token_view(jti, entry) for jti, entry in tokens], subjects=subjects)

    @unary
    async def Unrevoke(self, request: pb.UnrevokeRequest, context: Context) -> pb.Deleted:
        if bool(request.jti) == bool(request.sub):
            raise invalid("give exactly one of jti and sub")
        key = _revoked_token_key(request.jti) if request.jti else _revoked_subject_key(request.sub)
        await self._revoked_tokens(int(self._clock()))
        existed = await self._store.delete(key)
        if existed:
            await self._applied(await self._store.current_revision())
        return pb.Deleted(existed=existed)

    async def _revoked_tokens(self, now: int) -> list[tuple[str, RevokedToken | None]]:
        """The deny list's entries by token id, after deleting those whose token has expired everywhere;
        None for an unreadable value (kept: the gate refuses what it covers)."""
        kept: list[tuple[str, RevokedToken | None]] = []
        for jti, entry, kv in await self._entries(keys.security_revoked_tokens_prefix(),
                                                  keys.parse_security_revoked_token, RevokedToken):
            if entry is not None and lapsed(entry, now):
                await self._store.transaction([Compare(kv.key, "mod_revision", "==", kv.mod_revision)],
                                              [Delete(kv.key)])
                continue
            kept.append((jti, entry))
        return kept

    async def _entries(self, prefix: str, parse: Callable[[str], str], kind: type[E]
                       ) -> list[tuple[str, E | None, KeyValue]]:
        """The deny list's entries under `prefix`: (name, value or None when unreadable, key-value); keys
        that are not entries are passed over."""
        found: list[tuple[str, E | None, KeyValue]] = []
        for kv in await self._store.get_prefix(prefix):
            try:
                name = parse(kv.key)
            except InvalidKey:
                continue
            try:
                entry: E | None = kind.from_json(kv.value, key=kv.key)
            except BadValue:
                entry = None
            found.append((name, entry, kv))
        return found

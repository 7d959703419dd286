"""SecurityAdmin on the admin port: roles and bindings in the metadata store under `/security/`
(docs/SECURITY.md, docs/METADATA.md#security-keys). A change is answered once this broker's cache holds it,
so the caller's next call here already sees it; other brokers see it when their cache gets the event.
"""

from __future__ import annotations

import json

from danube_fast.broker.services.status import Context, unary
from danube_fast.errors import invalid, not_found, precondition
from danube_fast.meta import keys
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.store import InvalidKey, MetadataStore
from danube_fast.proto import SecurityAdmin_pb2 as pb
from danube_fast.security.rbac import check_scope, parse_permissions, role_value

CACHE_WAIT = 5.0  # seconds a change may take to come back through this broker's watch


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


def _role(name: str, value: bytes) -> pb.Role:
    return pb.Role(name=name, permissions=json.loads(value)["permissions"])


class SecurityAdminService:
    def __init__(self, store: MetadataStore, cache: LocalCache) -> None:
        self._store = store
        self._cache = cache

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
        bound = [b for b in await self._bindings() if b.role == request.name]
        if bound:
            raise precondition(f"role {request.name!r} is still bound ({len(bound)} bindings, e.g. "
                               f"{bound[0].principal} at {bound[0].scope}): unbind it first")
        existed = await self._store.delete(key)
        if existed:
            await self._applied(await self._store.current_revision())
        return pb.Deleted(existed=existed)

    @unary
    async def Bind(self, request: pb.Binding, context: Context) -> pb.Binding:
        key = _binding_key(request)
        if await self._store.get(_role_key(request.role)) is None:
            raise not_found(f"no role {request.role!r}: create it first")
        await self._applied(await self._store.put(key, b"{}"))
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
        out = []
        for kv in await self._store.get_prefix(keys.security_bindings_prefix()):
            principal, role, scope = keys.parse_security_binding(kv.key)
            out.append(pb.Binding(principal=principal, role=role, scope=scope))
        return out

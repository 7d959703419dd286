"""Role-based access control: roles (sets of permissions) bound to principals at cluster, namespace or topic
scope, resolved up the hierarchy, deny by default (docs/SECURITY.md).

Roles and bindings live in the metadata store under `/security/` (meta/keys.py) and are read from the
broker's watch-fed LocalCache, so a change made through any broker applies on every broker as soon as its
cache has the event (well under a second on etcd). The grants are rebuilt when the cache's revision moves.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from enum import StrEnum

from danube_fast.meta import keys
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.store import InvalidKey
from danube_fast.names import partition_base

log = logging.getLogger("danube_fast.security")

CLUSTER = "cluster"


class Permission(StrEnum):
    LOOKUP = "Lookup"
    PRODUCE = "Produce"
    CONSUME = "Consume"
    MANAGE_NAMESPACE = "ManageNamespace"
    MANAGE_TOPIC = "ManageTopic"
    MANAGE_SCHEMA = "ManageSchema"
    MANAGE_BROKER = "ManageBroker"
    MANAGE_CLUSTER = "ManageCluster"


PERMISSIONS = {p.value: p for p in Permission}


def parse_permissions(names: Iterable[str]) -> frozenset[Permission]:
    unknown = [n for n in names if n not in PERMISSIONS]
    if unknown:
        raise ValueError(f"unknown permissions {unknown}; known: {', '.join(PERMISSIONS)}")
    return frozenset(PERMISSIONS[n] for n in names)


def check_scope(scope: str) -> str:
    """'cluster', '/namespace' or '/namespace/topic' (InvalidKey otherwise)."""
    keys.security_binding("p", "r", scope)
    return scope


def scopes_up(scope: str) -> list[str]:
    """The scope and every scope above it: a topic, the topic its partition belongs to, its namespace, the
    cluster."""
    if scope == CLUSTER:
        return [CLUSTER]
    parts = scope[1:].split("/")
    out = [scope]
    if len(parts) == 2:
        base = partition_base(parts[1])
        if base is not None:
            out.append(f"/{parts[0]}/{base}")
    out += [f"/{parts[0]}", CLUSTER]
    return out


def role_value(permissions: Iterable[Permission]) -> bytes:
    return json.dumps({"permissions": sorted(p.value for p in permissions)}).encode()


class Authorizer:
    """Answers "may this principal do this here?" from the cache; `privileged` principals may do anything."""

    def __init__(self, cache: LocalCache, privileged: Iterable[str]) -> None:
        self._cache = cache
        self._privileged = frozenset(privileged)
        self._revision = -1
        self._grants: dict[str, dict[str, frozenset[Permission]]] = {}

    def allowed(self, principal: str, permission: Permission, scope: str) -> bool:
        if principal in self._privileged:
            return True
        self._refresh()
        grants = self._grants.get(principal)
        if not grants:
            return False
        return any(permission in grants.get(s, ()) for s in scopes_up(scope))

    def _refresh(self) -> None:
        revision = self._cache.revision
        if revision == self._revision:
            return
        roles: dict[str, frozenset[Permission]] = {}
        for kv in self._cache.get_prefix(keys.security_roles_prefix()):
            try:
                permissions = json.loads(kv.value)["permissions"]
                roles[keys.parse_security_role(kv.key)] = parse_permissions(permissions)
            except (InvalidKey, ValueError, KeyError, TypeError) as e:
                log.warning("ignoring the malformed role %s: %s", kv.key, e)
        grants: dict[str, dict[str, frozenset[Permission]]] = {}
        for kv in self._cache.get_prefix(keys.security_bindings_prefix()):
            try:
                principal, role, scope = keys.parse_security_binding(kv.key)
            except InvalidKey as e:
                log.warning("ignoring the malformed binding %s: %s", kv.key, e)
                continue
            at = grants.setdefault(principal, {})
            at[scope] = at.get(scope, frozenset()) | roles.get(role, frozenset())
        self._grants = grants
        self._revision = revision

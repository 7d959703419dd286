"""SecurityAdmin's DeleteRole and Bind at once (broker/services/security_admin.py), in process on the
embedded store: a binding written between DeleteRole's read of the bindings and its delete fails the
delete (ABORTED, try again) instead of being left naming a role that is gone; Bind's check that its role
exists is a compare in its write. The interleaving is the fault: a store that makes the other call's write
right after DeleteRole's read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from danube_fast.broker.services.security_admin import SecurityAdminService
from danube_fast.meta import keys
from danube_fast.meta.store import Compare, Get, Put
from danube_fast.proto import SecurityAdmin_pb2 as pb
from tests.compat.compat_support import run_async
from tests.security.test_revocation import Aborted, Context, cached_store


class BindMeanwhile:
    """The store, except that right after the first read of the bindings a Bind of `role` lands, as a
    concurrent Bind would (its role still exists then)."""

    def __init__(self, inner: Any, role: str) -> None:
        self._inner = inner
        self._role = role
        self.done = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def transaction(self, compare: Any, success: Any, failure: Any) -> Any:
        got = await self._inner.transaction(compare, success, failure)
        if not self.done and any(isinstance(op, Get) and op.key == keys.security_bindings_prefix()
                                 for op in success):
            self.done = True
            bound = await self._inner.transaction(
                [Compare(keys.security_role(self._role), "version", ">", 0)],
                [Put(keys.security_binding("carol", self._role, "/default"), b"{}")], [])
            assert bound.succeeded
        return got


def test_a_binding_made_while_its_role_is_deleted_fails_the_delete(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with cached_store(tmp_path) as (store, cache):
            service = SecurityAdminService(store, cache)
            await service.PutRole(pb.Role(name="writer", permissions=["Produce"]), Context())
            racing = SecurityAdminService(BindMeanwhile(store, "writer"), cache)  # type: ignore[arg-type]
            with pytest.raises(Aborted) as refused:
                await racing.DeleteRole(pb.RoleRequest(name="writer"), Context())
            assert refused.value.code == grpc.StatusCode.ABORTED and "try again" in refused.value.details
            assert await store.get(keys.security_role("writer")) is not None  # kept, as its binding is
            assert await store.get(keys.security_binding("carol", "writer", "/default")) is not None
            # Asked again, the delete sees the binding.
            with pytest.raises(Aborted) as bound:
                await service.DeleteRole(pb.RoleRequest(name="writer"), Context())
            assert bound.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "still bound" in bound.value.details
            await service.Unbind(pb.Binding(principal="carol", role="writer", scope="/default"), Context())
            assert (await service.DeleteRole(pb.RoleRequest(name="writer"), Context())).existed
            with pytest.raises(Aborted) as missing:
                await service.Bind(pb.Binding(principal="carol", role="writer", scope="/default"), Context())
            assert missing.value.code == grpc.StatusCode.NOT_FOUND
            assert await store.get(keys.security_binding("carol", "writer", "/default")) is None
    run_async(scenario())

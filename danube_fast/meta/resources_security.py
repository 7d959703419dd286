"""Values under /security/revoked/ (docs/METADATA.md#security-keys): the deny list of bearer tokens.

Times are JWT NumericDates: whole seconds since the Unix epoch (UTC), as a token's `iat` and `exp` are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

from danube_fast.meta.resources_base import JSON, Fields, JSONObject, Resource, present, with_extra


@dataclass(frozen=True)
class RevokedToken(Resource):
    """`/security/revoked/jti/{jti}`: the token with this id is refused. `exp` is the token's own expiry,
    after which the entry is useless (the token is refused as expired anyway) and may be dropped; null when
    the revoker did not know it, and then the entry stays until it is removed. `sub`, when known, is the
    principal the token names (for listings only: the jti alone decides)."""

    RESOURCE = "revoked token"

    exp: int | None
    revoked_at: int
    sub: str | None = None
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        return cls(exp=f.nullable_uint("exp"), revoked_at=f.uint("revoked_at"), sub=f.optional_str("sub"),
                   extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra(present({"exp": self.exp, "revoked_at": self.revoked_at}, sub=self.sub), self.extra)


@dataclass(frozen=True)
class RevokedSubject(Resource):
    """`/security/revoked/sub/{principal}`: every token of the principal issued before `before` (its `iat`
    is smaller), and every token of it without `iat`, is refused. Kept until it is removed: nothing says
    when the last such token expires."""

    RESOURCE = "revoked subject"

    before: int
    revoked_at: int
    extra: JSONObject = field(default_factory=dict, hash=False)

    @classmethod
    def from_obj(cls, value: JSON, where: str) -> Self:
        f = Fields(value, where)
        return cls(before=f.uint("before"), revoked_at=f.uint("revoked_at"), extra=f.extra())

    def to_obj(self) -> JSON:
        return with_extra({"before": self.before, "revoked_at": self.revoked_at}, self.extra)

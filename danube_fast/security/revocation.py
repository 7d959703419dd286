"""The deny list of bearer tokens (docs/SECURITY.md#revoking-tokens): tokens refused before their `exp`.

Two kinds of entries, in the metadata store under `/security/revoked/` (meta/keys.py, values in
meta/resources_security.py):

- by token id, `/security/revoked/jti/{jti}` (RevokedToken): the token with that `jti` is refused;
- by subject, `/security/revoked/sub/{principal}` (RevokedSubject): the principal's tokens whose `iat` is
  before `before`, and all of its tokens without `iat`, are refused. A token issued later is accepted.

The gate asks `DenyList.refusal` after a token verified, on every call, from the broker's watch-fed LocalCache
(the `/security/` prefix is cached): two key builds and two dictionary lookups when nothing is revoked (about
2 µs), and a revocation written through any broker applies on every broker as soon as its cache has the event
(tests/security/test_secure_cluster.py measures it: about 30 ms between two brokers on one etcd).

An entry by id is useless once its token has expired: past `exp` + MAX_LEEWAY_S the verifier refuses the token
on every broker whatever its leeway. Such an entry is ignored here (`lapsed`), and deleted by the next
SecurityAdmin call that adds, lists or removes revocations (services/security_admin.py); until then it costs
only its bytes. Entries by subject stay until they are removed: nothing says when the last token they
cover expires.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from danube_fast.meta import keys
from danube_fast.meta.local_cache import LocalCache
from danube_fast.meta.resources import BadValue, RevokedSubject, RevokedToken
from danube_fast.meta.store import InvalidKey, KeyValue
from danube_fast.security.config import MAX_LEEWAY_S
from danube_fast.security.tokens import VerifiedToken

log = logging.getLogger("danube_fast.security")

MEMO_ENTRIES = 4096  # parsed entries kept, by key; a revoked token's every call would parse its entry again


def lapsed(entry: RevokedToken, now: float) -> bool:
    """Whether the revoked token has expired on every broker (so the entry can go)."""
    return entry.exp is not None and now > entry.exp + MAX_LEEWAY_S


def iso(seconds: float) -> str:
    """A NumericDate as the UTC time it names, for messages and listings."""
    try:
        return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{seconds:g} s after the epoch"


def _key(build: Callable[[str], str], value: str) -> str | None:
    """The deny-list key of a jti or principal; None for one that cannot be a key (so cannot be listed)."""
    try:
        return build(value)
    except InvalidKey:
        return None


class DenyList:
    """Answers "was this token revoked?" from the broker's LocalCache. The cache owns the entries; this keeps
    only the parsed form of the ones it met, keyed by their mod revision."""

    def __init__(self, cache: LocalCache, clock: Callable[[], float] = time.time) -> None:
        self._cache = cache
        self._clock = clock
        self._parsed: dict[str, tuple[int, RevokedToken | RevokedSubject | None]] = {}

    def refusal(self, token: VerifiedToken) -> str | None:
        """Why the token is refused ("the token was revoked ..."), None when it is not revoked."""
        if token.jti is not None and (key := _key(keys.security_revoked_token, token.jti)) is not None:
            kv = self._cache.get(key)
            if kv is not None:
                entry = self._entry(kv, RevokedToken)
                if not (isinstance(entry, RevokedToken) and lapsed(entry, self._clock())):
                    return "the token was revoked (its jti is on the deny list)"
        key = _key(keys.security_revoked_subject, token.principal)
        kv = self._cache.get(key) if key is not None else None
        if kv is None:
            return None
        subject = self._entry(kv, RevokedSubject)
        if not isinstance(subject, RevokedSubject):
            return f"the token was revoked (the deny-list entry of {token.principal} is unreadable: all of " \
                   f"its tokens are refused)"
        if token.issued_at is None:
            return f"the token was revoked: it has no iat, and {token.principal}'s tokens issued before " \
                   f"{iso(subject.before)} are refused"
        if token.issued_at < subject.before:
            return f"the token was revoked: {token.principal}'s tokens issued before {iso(subject.before)} " \
                   f"are refused"
        return None

    def _entry(self, kv: KeyValue, kind: type[RevokedToken] | type[RevokedSubject]
               ) -> RevokedToken | RevokedSubject | None:
        """The parsed value (None if malformed: the entry then refuses, rather than let a token through)."""
        memo = self._parsed.get(kv.key)
        if memo is not None and memo[0] == kv.mod_revision:
            return memo[1]
        entry: RevokedToken | RevokedSubject | None
        try:
            entry = kind.from_json(kv.value, key=kv.key)
        except BadValue as e:
            log.warning("deny list: %s (refusing what it covers)", e)
            entry = None
        if len(self._parsed) >= MEMO_ENTRIES:
            self._parsed.clear()
        self._parsed[kv.key] = (kv.mod_revision, entry)
        return entry

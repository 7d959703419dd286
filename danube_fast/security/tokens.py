"""JWT bearer tokens: verification for the broker, signing for the CLI, with PyJWT (never a JWT parser of our
own). What is checked is in docs/SECURITY.md; the short form:

- the algorithm comes from `[security] jwt_algorithms`, never from the token's header (PyJWT refuses any
  other, `none` included, and refuses an asymmetric key used as an HMAC secret);
- signature, `exp` (required), `nbf` (when present), `iss` and `aud` (required, equal to the config's), with
  `jwt_leeway_s` of clock skew;
- `sub` names the principal: a non-empty string without `/` that does not start with `cert:` (the prefix of
  certificate principals, which a token must not be able to claim).

`jti` and `iat`, when present, are kept for the deny list (security/revocation.py), which the gate asks after
this check; the tokens `sign_token` makes carry both.

A verified token is cached until it expires, so a stream or a run of unary calls with one token pays for one
signature check (about 20-60 µs), not one per message.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import jwt

from danube_fast.security.config import HMAC_ALGORITHMS, SecurityConfig

CERT_PREFIX = "cert:"
CACHE_ENTRIES = 4096


class TokenRefused(Exception):
    """The token is not valid; the message says why, without echoing the token."""


@dataclass(frozen=True)
class VerifiedToken:
    """A token whose signature and claims checked out: the principal it names, and what the deny list looks
    at (its `jti`, its `iat`; None when the token has none)."""

    principal: str
    not_before: float
    expires: float
    jti: str | None = None
    issued_at: float | None = None


def check_principal(principal: str, what: str = "sub") -> str:
    if not isinstance(principal, str) or not principal or "/" in principal or len(principal) > 256:
        raise TokenRefused(f"the token's {what} must be a non-empty string of at most 256 characters "
                           "without '/'")
    return principal


class TokenVerifier:
    def __init__(self, config: SecurityConfig) -> None:
        self._algorithms = list(config.jwt_algorithms)
        self._issuer = config.jwt_issuer
        self._audience = config.jwt_audience
        self._leeway = config.jwt_leeway_s
        self._key: Any = None
        self._jwks: jwt.PyJWKSet | None = None
        if self._algorithms[0] in HMAC_ALGORITHMS:
            self._key = read_secret(config.jwt_secret_file)
        elif config.jwt_jwks_file:
            with open(config.jwt_jwks_file, encoding="utf-8") as f:
                self._jwks = jwt.PyJWKSet.from_dict(json.load(f))
        else:
            with open(config.jwt_public_key_file, "rb") as f:
                self._key = f.read()
        self._cache: dict[str, VerifiedToken] = {}

    def verify(self, token: str) -> str:
        """The principal the token names, or TokenRefused."""
        return self.claims(token).principal

    def claims(self, token: str) -> VerifiedToken:
        """The verified token, or TokenRefused."""
        now = time.time()
        hit = self._cache.get(token)
        if hit is not None:
            if hit.not_before - self._leeway <= now <= hit.expires + self._leeway:
                return hit
            del self._cache[token]
            raise TokenRefused("the token has expired" if now > hit.expires else "the token is not valid yet")
        claims = self._decode(token)
        principal = check_principal(claims.get("sub"))  # type: ignore[arg-type]
        if principal.startswith(CERT_PREFIX):
            raise TokenRefused(f"a token's sub may not start with {CERT_PREFIX!r} (certificate principals)")
        if len(self._cache) >= CACHE_ENTRIES:
            self._cache.clear()
        iat = claims.get("iat")  # PyJWT checked that jti is a string and iat a number, when present
        verified = VerifiedToken(principal, float(claims.get("nbf", 0)), float(claims["exp"]),
                                 claims.get("jti"), None if iat is None else float(iat))
        self._cache[token] = verified
        return verified

    def _decode(self, token: str) -> dict[str, Any]:
        try:
            key = self._key
            if self._jwks is not None:
                kid = jwt.get_unverified_header(token).get("kid")
                if kid is None:
                    raise TokenRefused("the token has no kid, and the broker's keys are a JWKS")
                try:
                    key = self._jwks[kid].key
                except KeyError:
                    raise TokenRefused(f"no key {str(kid)[:64]!r} in the broker's JWKS") from None
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=self._algorithms, issuer=self._issuer, audience=self._audience,
                leeway=self._leeway, options={"require": ["exp", "iss", "aud", "sub"]})
            return claims
        except jwt.ExpiredSignatureError:
            raise TokenRefused("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise TokenRefused("the token is not valid yet (nbf)") from None
        except jwt.InvalidIssuerError:
            raise TokenRefused("the token's issuer (iss) is not the one this broker accepts") from None
        except jwt.InvalidAudienceError:
            raise TokenRefused("the token's audience (aud) is not this broker's") from None
        except jwt.InvalidAlgorithmError:
            raise TokenRefused(f"the token's algorithm is not one of {', '.join(self._algorithms)}") from None
        except jwt.InvalidSignatureError:
            raise TokenRefused("the token's signature does not verify") from None
        except jwt.MissingRequiredClaimError as e:
            raise TokenRefused(f"the token has no {e.claim} claim") from None
        except jwt.PyJWTError as e:
            raise TokenRefused(f"the token is malformed or unusable: {type(e).__name__}") from None


def read_secret(path: str) -> bytes:
    with open(path, "rb") as f:
        secret = f.read().rstrip(b"\r\n")
    if len(secret) < 32:
        raise ValueError(f"the HMAC secret in {path} is {len(secret)} bytes: use at least 32 random bytes")
    return secret


def sign_token(*, key: bytes, algorithm: str, subject: str, issuer: str, audience: str, ttl_s: int,
               kid: str | None = None, now: float | None = None) -> str:
    """A token for `subject` valid for ttl_s seconds (the CLI's `security tokens create`). `key` is the HMAC
    secret or the PEM private key. It carries a fresh `jti` (a uuid4) and `iat`, so that it can be revoked
    on its own or with every token of its subject issued before a time (docs/SECURITY.md)."""
    check_principal(subject)
    if subject.startswith(CERT_PREFIX):
        raise TokenRefused(f"a token's sub may not start with {CERT_PREFIX!r}")
    if ttl_s <= 0:
        raise ValueError("ttl must be positive")
    issued = int(now if now is not None else time.time())
    claims = {"sub": subject, "iss": issuer, "aud": audience, "iat": issued, "nbf": issued,
              "exp": issued + ttl_s, "jti": str(uuid.uuid4())}
    headers = {"kid": kid} if kid else None
    return jwt.encode(claims, key, algorithm=algorithm, headers=headers)

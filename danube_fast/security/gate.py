"""Who is calling, and may they: the check every RPC of both ports passes before its servicer sees the request
(services/wire_guard.py calls `admit` with the first decoded request of each call).

The principal comes from a verified bearer token (`authorization: Bearer <jwt>`) that is not on the deny
list (security/revocation.py) or, on mTLS, from the client certificate's subject as grpc verified it
(`context.auth_context()`), as `cert:<CN>`. Nothing else a client sends names anyone: upstream's
`x-danube-internal-broker` header, for one, is ignored.
"""

from __future__ import annotations

from typing import Any

from danube_fast.errors import denied, unauthenticated
from danube_fast.security.config import SecurityConfig
from danube_fast.security.rbac import Authorizer, Permission
from danube_fast.security.revocation import DenyList
from danube_fast.security.rules import RULES, ConsumerTopic
from danube_fast.security.tokens import CERT_PREFIX, TokenRefused, TokenVerifier

BEARER = "bearer "


def bearer_token(metadata: Any) -> str | None:
    """The token of the call's `authorization: Bearer ...` header; None without one."""
    for key, value in metadata or ():
        if key == "authorization":
            if not isinstance(value, str) or not value[:len(BEARER)].lower() == BEARER:
                raise unauthenticated("the authorization header must be 'Bearer <token>'")
            return value[len(BEARER):].strip()
    return None


def certificate_principal(context: Any) -> str | None:
    """`cert:<CN>` of the client certificate grpc verified against the CA, None without one."""
    names = (context.auth_context() or {}).get("x509_common_name") or []
    if not names:
        return None
    name = names[0].decode("utf-8", "replace") if isinstance(names[0], bytes) else str(names[0])
    return cert_principal(name)


def cert_principal(common_name: str | None) -> str | None:
    """`cert:<CN>` for a verified certificate's common name; None for none, or one a principal cannot be."""
    return CERT_PREFIX + common_name if common_name and "/" not in common_name else None


class Gate:
    def __init__(self, config: SecurityConfig, authorizer: Authorizer, consumer_topic: ConsumerTopic,
                 deny_list: DenyList) -> None:
        self._config = config
        self._verifier = TokenVerifier(config) if config.jwt else None
        self._authorizer = authorizer
        self._deny_list = deny_list
        self._consumer_topic = consumer_topic
        self._privileged = frozenset(config.super_admins) | frozenset(config.broker_principals)

    def principal(self, context: Any) -> str:
        """The caller, or UNAUTHENTICATED saying what is missing or wrong."""
        token = bearer_token(context.invocation_metadata()) if self._verifier is not None else None
        if token is not None:
            return self._authenticated(token)
        if self._config.verify_client:
            principal = certificate_principal(context)
            if principal is not None:
                return principal
        if self._verifier is not None:
            raise unauthenticated("authentication required: send 'authorization: Bearer <token>' (a JWT from "
                                  "'danube-fast admin security tokens create')")
        raise unauthenticated("authentication required: a client certificate signed by the broker's CA")

    def _authenticated(self, token: str) -> str:
        """The principal of a token that verifies and was not revoked; UNAUTHENTICATED saying why not."""
        assert self._verifier is not None
        try:
            verified = self._verifier.claims(token)
        except TokenRefused as e:
            raise unauthenticated(f"authentication failed: {e}") from None
        revoked = self._deny_list.refusal(verified)
        if revoked is not None:
            raise unauthenticated(f"authentication failed: {revoked}")
        return verified.principal

    def admit_metrics(self, token: str | None, common_name: str | None = None) -> None:
        """The Prometheus endpoint: a principal with Lookup cluster-wide, from a bearer token or, on mTLS,
        from the client certificate the TLS handshake verified (`common_name`: its CN)."""
        if token is not None and self._verifier is not None:
            principal = self._authenticated(token)
        elif self._config.verify_client and (certified := cert_principal(common_name)) is not None:
            principal = certified
        elif self._verifier is not None:
            raise unauthenticated("metrics need 'Authorization: Bearer <token>'")
        else:
            raise unauthenticated("metrics need a client certificate signed by the broker's CA")
        if principal not in self._privileged and not self._authorizer.allowed(principal, Permission.LOOKUP,
                                                                             "cluster"):
            raise denied(f"{principal} may not read metrics: it needs Lookup on the cluster")

    def connection_principal(self, token: str | None, common_name: str | None) -> str:
        """The caller of a connection that is not a gRPC call (the native transport): the token's
        principal, else on mTLS the verified certificate's (`common_name`: its CN); UNAUTHENTICATED saying
        what is missing or wrong."""
        if token and self._verifier is not None:
            return self._authenticated(token)
        if self._config.verify_client and (certified := cert_principal(common_name)) is not None:
            return certified
        if self._verifier is not None:
            raise unauthenticated("authentication required: a token in HELLO (a JWT from 'danube-fast admin "
                                  "security tokens create')")
        raise unauthenticated("authentication required: a client certificate signed by the broker's CA")

    def admit(self, method: str, request: Any, context: Any) -> str | None:
        """The principal allowed to make this call, or UNAUTHENTICATED / PERMISSION_DENIED; None when the
        broker checks no identities (mode none, or tls without client certificates)."""
        if not self._config.authenticates:
            return None
        principal = self.principal(context)
        self.authorize(principal, method, request)
        return principal

    def authorize(self, principal: str, method: str, request: Any) -> None:
        """PERMISSION_DENIED unless `principal` may call `method` (security/rules.py) with `request`."""
        rule = RULES.get(method)
        if rule is None:  # deny by default: only the privileged may call what has no rule
            if principal in self._privileged:
                return
            raise denied(f"{method} is not open to {principal}")
        if rule.permission is None:
            return
        scope = rule.scope(request, self._consumer_topic)
        if scope is None or self._authorizer.allowed(principal, rule.permission, scope):
            return
        raise denied(f"{principal} may not call {method.rpartition('/')[2]} on {scope}: it needs the "
                     f"{rule.permission.value} permission there (or above it)")

"""The `[security]` settings of a broker (docs/SECURITY.md) and their checks.

```toml
[security]
mode = "none"                   # none | tls | tls_jwt
cert_file = ""                  # PEM: this broker's certificate chain (client, admin and metrics ports)
key_file = ""                   # PEM: its private key
ca_file = ""                    # PEM: the CA that signs client certificates (mTLS) and other brokers'
verify_client = false           # mTLS: a connection without a certificate signed by ca_file is refused
jwt_algorithms = ["HS256"]      # the only algorithms a token may use (never the token's own choice)
jwt_secret_file = ""            # HS*: the shared secret (the file's bytes, trailing newline dropped)
jwt_public_key_file = ""        # RS*/PS*/ES*/EdDSA: the PEM public key
jwt_jwks_file = ""              # or a JSON Web Key Set; a token's `kid` picks the key
jwt_issuer = ""                 # required in tls_jwt: `iss` must equal it
jwt_audience = ""               # required in tls_jwt: `aud` must contain it
jwt_leeway_s = 30               # clock skew allowed on exp and nbf
super_admins = []               # principals with every permission (e.g. "admin", "cert:ops")
broker_principals = []          # certificate principals of this cluster's brokers ("cert:<CN>"): every
                                # permission, for forwarding between brokers; needs verify_client
metrics_open = false            # tls modes: serve /metrics over plain HTTP without a token
```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["none", "tls", "tls_jwt"]
MODES = ("none", "tls", "tls_jwt")
HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
KEY_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
# The most clock skew any broker may allow on exp and nbf: a revoked token's entry is useless once its exp is
# this far behind (security/revocation.py), whatever leeway each broker of the cluster has.
MAX_LEEWAY_S = 300


class SecurityConfigError(ValueError):
    pass


@dataclass(frozen=True)
class SecurityConfig:
    mode: str = "none"
    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    verify_client: bool = False
    jwt_algorithms: list[str] = field(default_factory=lambda: ["HS256"])
    jwt_secret_file: str = ""
    jwt_public_key_file: str = ""
    jwt_jwks_file: str = ""
    jwt_issuer: str = ""
    jwt_audience: str = ""
    jwt_leeway_s: int = 30
    super_admins: list[str] = field(default_factory=list)
    broker_principals: list[str] = field(default_factory=list)
    metrics_open: bool = False

    @property
    def tls(self) -> bool:
        return self.mode != "none"

    @property
    def jwt(self) -> bool:
        return self.mode == "tls_jwt"

    @property
    def authenticates(self) -> bool:
        """Whether calls carry an identity that RBAC then checks: tokens, or client certificates (mTLS)."""
        return self.jwt or (self.tls and self.verify_client)

    def check(self) -> None:
        """Refuse settings that cannot work or would leave a hole, naming the setting."""
        if self.mode not in MODES:
            raise SecurityConfigError(f"[security] mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if not self.tls:
            return
        for name in ("cert_file", "key_file"):
            if not getattr(self, name):
                raise SecurityConfigError(f"[security] mode = {self.mode!r} needs {name}")
        if self.verify_client and not self.ca_file:
            raise SecurityConfigError("[security] verify_client needs ca_file (the CA of client "
                                      "certificates)")
        if self.broker_principals and not self.verify_client:
            raise SecurityConfigError("[security] broker_principals are certificate identities: they need "
                                      "verify_client = true")
        for principal in [*self.super_admins, *self.broker_principals]:
            if not isinstance(principal, str) or not principal or "/" in principal:
                raise SecurityConfigError(f"[security] principal {principal!r} must be a non-empty string "
                                          "without '/'")
        if not self.jwt:
            return
        unknown = [a for a in self.jwt_algorithms if a not in HMAC_ALGORITHMS + KEY_ALGORITHMS]
        if not self.jwt_algorithms or unknown:
            raise SecurityConfigError(f"[security] jwt_algorithms must be a non-empty list of "
                                      f"{', '.join(HMAC_ALGORITHMS + KEY_ALGORITHMS)}; unknown: {unknown}")
        hmac = [a for a in self.jwt_algorithms if a in HMAC_ALGORITHMS]
        if hmac and len(hmac) != len(self.jwt_algorithms):
            # One key for both kinds is how algorithm confusion starts (an HS256 token "signed" with the
            # RSA public key as its secret): refuse the mix outright.
            raise SecurityConfigError("[security] jwt_algorithms mixes HMAC (HS*) and public-key algorithms: "
                                      "choose one kind")
        if hmac and not self.jwt_secret_file:
            raise SecurityConfigError("[security] HS* algorithms need jwt_secret_file")
        if not hmac and not (self.jwt_public_key_file or self.jwt_jwks_file):
            raise SecurityConfigError("[security] public-key algorithms need jwt_public_key_file or "
                                      "jwt_jwks_file")
        if not self.jwt_issuer or not self.jwt_audience:
            raise SecurityConfigError("[security] tls_jwt needs jwt_issuer and jwt_audience: every token's "
                                      "iss and aud are checked")
        if self.jwt_leeway_s < 0 or self.jwt_leeway_s > MAX_LEEWAY_S:
            raise SecurityConfigError(f"[security] jwt_leeway_s must be in 0..{MAX_LEEWAY_S}")

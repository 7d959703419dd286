"""The pieces of danube_fast/security on their own: config checks, token verification, the rule table,
scopes and the metadata keys of roles and bindings."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from danube_fast.meta import keys
from danube_fast.meta.store import InvalidKey
from danube_fast.proto import (
    BrokerStats_pb2,
    DanubeAdmin_pb2,
    DanubeApi_pb2,
    FastApi_pb2,
    PolicyAdmin_pb2,
    Replication_pb2,
    SchemaRegistry_pb2,
    SecurityAdmin_pb2,
    SubscriptionAdmin_pb2,
    TableAdmin_pb2,
)
from danube_fast.security.config import SecurityConfig, SecurityConfigError
from danube_fast.security.rbac import scopes_up
from danube_fast.security.rules import RULES, topic_scope
from danube_fast.security.tokens import TokenRefused, TokenVerifier, sign_token
from tests.security.conftest import AUDIENCE, ISSUER, Pki


def hs256(pki: Pki, **changes: object) -> SecurityConfig:
    base = dict(mode="tls_jwt", cert_file="c", key_file="k", jwt_secret_file=str(pki.secret_file),
                jwt_issuer=ISSUER, jwt_audience=AUDIENCE)
    return SecurityConfig(**{**base, **changes})  # type: ignore[arg-type]


def test_every_served_method_has_a_rule() -> None:
    """Deny by default: a method missing here is open to super admins only; none may be missing."""
    served = {f"{service.full_name}/{method.name}"
              for module in (DanubeAdmin_pb2, DanubeApi_pb2, FastApi_pb2, SchemaRegistry_pb2,
                             SecurityAdmin_pb2, PolicyAdmin_pb2, TableAdmin_pb2, SubscriptionAdmin_pb2,
                             BrokerStats_pb2, Replication_pb2)
              for service in module.DESCRIPTOR.services_by_name.values() for method in service.methods}
    assert served - set(RULES) == set()
    assert set(RULES) - served == set()


@pytest.mark.parametrize(("changes", "words"), [
    ({"mode": "open"}, "mode"),
    ({"cert_file": ""}, "cert_file"),
    ({"verify_client": True}, "ca_file"),
    ({"broker_principals": ["cert:b"]}, "verify_client"),
    ({"super_admins": ["a/b"]}, "principal"),
    ({"jwt_algorithms": ["HS256", "RS256"]}, "mixes"),
    ({"jwt_algorithms": ["none"]}, "jwt_algorithms"),
    ({"jwt_algorithms": []}, "jwt_algorithms"),
    ({"jwt_issuer": ""}, "jwt_issuer"),
    ({"jwt_audience": ""}, "jwt_audience"),
    ({"jwt_secret_file": ""}, "jwt_secret_file"),
    ({"jwt_algorithms": ["RS256"]}, "jwt_public_key_file"),
    ({"jwt_leeway_s": -1}, "leeway"),
])
def test_unworkable_security_settings_are_refused(pki: Pki, changes: dict[str, object], words: str) -> None:
    with pytest.raises(SecurityConfigError, match=words):
        hs256(pki, **changes).check()


def test_a_short_hmac_secret_is_refused(pki: Pki, tmp_path: Path) -> None:
    (tmp_path / "short").write_bytes(b"secret")
    with pytest.raises(ValueError, match="at least 32"):
        TokenVerifier(hs256(pki, jwt_secret_file=str(tmp_path / "short")))


def test_tokens_verify_and_name_their_principal(pki: Pki) -> None:
    verifier = TokenVerifier(hs256(pki))
    assert verifier.verify(pki.token("alice")) == "alice"
    signed = sign_token(key=pki.secret, algorithm="HS256", subject="svc-1", issuer=ISSUER, audience=AUDIENCE,
                        ttl_s=60)
    assert verifier.verify(signed) == "svc-1"
    with pytest.raises(TokenRefused, match="sub"):
        verifier.verify(pki.token("a/b"))
    with pytest.raises(TokenRefused, match="sub"):
        verifier.verify(pki.token(""))


def test_a_cached_token_still_expires(pki: Pki) -> None:
    verifier = TokenVerifier(hs256(pki, jwt_leeway_s=0))
    token = pki.token("alice", ttl=1.2)
    assert verifier.verify(token) == "alice"
    assert verifier.verify(token) == "alice"  # from the cache
    time.sleep(1.5)
    with pytest.raises(TokenRefused, match="expired"):
        verifier.verify(token)


def test_public_key_algorithms_and_jwks(pki: Pki, tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "pub.pem").write_bytes(public)
    verifier = TokenVerifier(hs256(pki, jwt_algorithms=["ES256"],
                                   jwt_public_key_file=str(tmp_path / "pub.pem")))
    assert verifier.verify(pki.token("carol", key=key, algorithm="ES256")) == "carol"
    with pytest.raises(TokenRefused, match=r"algorithm|signature"):
        verifier.verify(pki.token("carol"))  # HS256 with the shared secret: not an accepted algorithm
    jwk = jwt.algorithms.ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
    (tmp_path / "keys.json").write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "alg": "ES256"}]}))
    verifier = TokenVerifier(hs256(pki, jwt_algorithms=["ES256"], jwt_jwks_file=str(tmp_path / "keys.json")))
    token = jwt.encode({"sub": "dave", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 60}, key,
                       algorithm="ES256", headers={"kid": "k1"})
    assert verifier.verify(token) == "dave"
    with pytest.raises(TokenRefused, match="no key"):
        claims = {"sub": "dave", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 60}
        verifier.verify(jwt.encode(claims, key, algorithm="ES256", headers={"kid": "k2"}))


def test_scopes_resolve_up_the_hierarchy() -> None:
    assert scopes_up("/ns/orders-part-3") == ["/ns/orders-part-3", "/ns/orders", "/ns", "cluster"]
    assert scopes_up("/ns/orders") == ["/ns/orders", "/ns", "cluster"]
    assert scopes_up("cluster") == ["cluster"]
    assert topic_scope("not a topic") == "cluster"  # only cluster-wide grants match a malformed name


def test_binding_keys_round_trip_and_refuse_ambiguity() -> None:
    for scope in ("cluster", "/ns", "/ns/t"):
        key = keys.security_binding("bob", "writer", scope)
        assert keys.parse_security_binding(key) == ("bob", "writer", scope)
    assert keys.parse_security_role(keys.security_role("writer")) == "writer"
    for bad in ("ns", "/a/b/c", "/", "//x"):
        with pytest.raises(InvalidKey):
            keys.security_binding("bob", "writer", bad)
    with pytest.raises(InvalidKey):
        keys.security_binding("a/b", "writer", "cluster")

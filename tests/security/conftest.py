"""A throw-away PKI, tokens, and brokers started with security on (real subprocesses, real TLS)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pytest

from danube_fast.testing.broker import Broker
from danube_fast.testing.certs import Issued, authority

ISSUER = "danube-test"
AUDIENCE = "danube"


@dataclass
class Pki:
    ca: Path
    broker: Issued
    alice: Issued  # a client certificate from the broker's CA: principal cert:alice
    bob: Issued  # another one, whose principal cert:bob has no role
    rogue_ca: Path
    mallory: Issued  # a client certificate from another CA
    secret_file: Path
    secret: bytes

    def token(self, sub: str, *, ttl: float = 600, key: Any = None, algorithm: str = "HS256",
              **claims: Any) -> str:
        now = int(time.time())
        body = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "nbf": now, "exp": now + ttl,
                **claims}
        return jwt.encode({k: v for k, v in body.items() if v is not None}, key or self.secret,
                          algorithm=algorithm)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca = authority(root / "ca")
    rogue = authority(root / "rogue", "rogue-ca")
    secret = secrets.token_hex(32).encode()
    secret_file = root / "jwt.secret"
    secret_file.write_bytes(secret + b"\n")
    return Pki(ca.cert, ca.issue(root / "ca", "broker"), ca.issue(root / "ca", "alice"),
               ca.issue(root / "ca", "bob"), rogue.cert, rogue.issue(root / "rogue", "mallory"), secret_file,
               secret)


def security_toml(pki: Pki, *, mode: str = "tls_jwt", verify_client: bool = False,
                  super_admins: tuple[str, ...] = ("admin",), extra: str = "") -> str:
    lines = [
        "[security]", f'mode = "{mode}"', f'cert_file = "{pki.broker.cert}"',
        f'key_file = "{pki.broker.key}"',
        f'ca_file = "{pki.ca}"', f"verify_client = {'true' if verify_client else 'false'}",
        f"super_admins = {list(super_admins)!r}".replace("'", '"'),
    ]
    if mode == "tls_jwt":
        lines += [f'jwt_secret_file = "{pki.secret_file}"', f'jwt_issuer = "{ISSUER}"',
                  f'jwt_audience = "{AUDIENCE}"']
    return "\n".join(lines) + "\n" + extra


def started(workdir: Path, config: str, *, native: bool = False) -> Iterator[Broker]:
    broker = Broker(workdir, config, native=native)
    try:
        broker.start()
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="module")
def jwt_broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """mode = tls_jwt, HS256 tokens, no client certificates; `admin` is a super admin."""
    yield from started(tmp_path_factory.mktemp("jwt-broker"), security_toml(pki))


@pytest.fixture(scope="module")
def mtls_broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """mode = tls with verify_client: identities from client certificates; cert:alice is a super admin."""
    yield from started(tmp_path_factory.mktemp("mtls-broker"),
                       security_toml(pki, mode="tls", verify_client=True, super_admins=("cert:alice",)))

"""How our clients reach a secured broker (docs/SECURITY.md): TLS with the broker's CA, a client certificate
for mTLS, and a JWT sent as `authorization: Bearer <token>` on every call (grpc's own call credentials)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from danube_fast.security.tls import channel_credentials


@dataclass(frozen=True)
class Credentials:
    ca_file: str | None = None  # None: the system's root CAs
    cert_file: str | None = None  # with key_file: mTLS
    key_file: str | None = None
    token: str | None = None


def open_channel(target: str, options: Sequence[tuple[str, int]] = (),
                 credentials: Credentials | None = None) -> grpc.aio.Channel:
    """A channel to `target` (host:port): plaintext without credentials, TLS (and a token) with them."""
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=list(options))
    tls = channel_credentials(credentials.ca_file, credentials.cert_file, credentials.key_file)
    if credentials.token:
        tls = grpc.composite_channel_credentials(tls, grpc.access_token_call_credentials(credentials.token))
    return grpc.aio.secure_channel(target, tls, options=list(options))

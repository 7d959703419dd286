"""How our clients reach a secured broker (docs/SECURITY.md): TLS with the broker's CA, a client certificate
for mTLS, and a JWT sent as `authorization: Bearer <token>` on every call (grpc's own call credentials):
a fixed token, or a supplier asked on every call, for tokens that are refreshed while the client runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from danube_fast.security.tls import channel_credentials


@dataclass(frozen=True)
class Credentials:
    ca_file: str | None = None  # None: the system's root CAs
    cert_file: str | None = None  # with key_file: mTLS
    key_file: str | None = None
    token: str | None = None
    token_supplier: Callable[[], str] | None = None  # asked on every call; wins over `token`


class _Supplied:
    """grpc's metadata plugin protocol: called with (context, callback) before every call."""

    def __init__(self, supplier: Callable[[], str]) -> None:
        self._supplier = supplier

    def __call__(self, context: Any, callback: Any) -> None:
        try:
            callback((("authorization", f"Bearer {self._supplier()}"),), None)
        except Exception as e:  # the call fails with UNAVAILABLE naming the supplier's error
            callback(None, e)


def open_channel(target: str, options: Sequence[tuple[str, int]] = (),
                 credentials: Credentials | None = None) -> grpc.aio.Channel:
    """A channel to `target` (host:port): plaintext without credentials, TLS (and a token) with them."""
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=list(options))
    tls = channel_credentials(credentials.ca_file, credentials.cert_file, credentials.key_file)
    if credentials.token_supplier is not None:
        tls = grpc.composite_channel_credentials(
            tls, grpc.metadata_call_credentials(_Supplied(credentials.token_supplier)))
    elif credentials.token:
        tls = grpc.composite_channel_credentials(tls, grpc.access_token_call_credentials(credentials.token))
    return grpc.aio.secure_channel(target, tls, options=list(options))

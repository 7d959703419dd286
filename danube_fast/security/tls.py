"""TLS material for the broker's ports and for clients, from PEM files (docs/SECURITY.md)."""

from __future__ import annotations

import ssl
from typing import Any

import grpc

from danube_fast.security.config import SecurityConfig


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def server_credentials(config: SecurityConfig) -> grpc.ServerCredentials:
    """The client and admin ports' TLS; with verify_client, a connection without a certificate signed by
    ca_file is refused during the handshake."""
    return grpc.ssl_server_credentials(
        [(_read(config.key_file), _read(config.cert_file))],
        root_certificates=_read(config.ca_file) if config.ca_file else None,
        require_client_auth=config.verify_client)


def channel_credentials(ca_file: str | None = None, cert_file: str | None = None,
                        key_file: str | None = None) -> grpc.ChannelCredentials:
    """A client's TLS: the CA that signs the broker's certificate (None: the system's roots), and for mTLS
    a certificate and key of its own."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca_file) if ca_file else None,
        private_key=_read(key_file) if key_file else None,
        certificate_chain=_read(cert_file) if cert_file else None)


def server_ssl_context(config: SecurityConfig) -> ssl.SSLContext:
    """The TLS of the ports gRPC does not serve (Prometheus' HTTPS, the native transport), with the same
    certificate and, on mTLS, the same client check."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.cert_file, config.key_file)
    if config.verify_client:
        context.load_verify_locations(config.ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_ssl_context(ca_file: str | None = None, cert_file: str | None = None,
                       key_file: str | None = None) -> ssl.SSLContext:
    """channel_credentials for a client that is not gRPC's (the native transport)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file:
        context.load_cert_chain(cert_file, key_file)
    return context


def common_name(peercert: Any) -> str | None:
    """The subject CN of a certificate as ssl's getpeercert() gives it (None without one)."""
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None

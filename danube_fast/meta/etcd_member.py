"""One etcd endpoint as EtcdStore uses it: a gRPC channel (plaintext, or TLS with the CA and client
certificate of an EtcdAccess), aetcd's generated stubs on it, and the auth token etcd gave the user; and the
words for etcd's refusals, so that a wrong certificate or password says so instead of timing out.

aetcd's own Client opens only plaintext channels, hence the channel here. etcd's authentication (measured on
etcd 3.4.23): `Authenticate(user, password)` returns a token that every call carries as `token` metadata;
a wrong password answers INVALID_ARGUMENT "authentication failed", a call without a token PERMISSION_DENIED,
an expired token (a simple token lives 5 minutes after its last use) UNAUTHENTICATED "invalid auth token",
after which the member logs in again, as etcd's own client does. A watch created without a valid token is not
failed but canceled, with the same texts in `cancel_reason`.

The TLS failures as grpc reports them (the same etcd, grpcio's BoringSSL):
- this client does not trust etcd's certificate: "Tls handshake failed ... CERTIFICATE_VERIFY_FAILED";
- etcd (`--client-cert-auth`) does not accept this client's certificate, or got none: TLS 1.3 completes the
  handshake before etcd checks it, so the client sees etcd's alert as "Unwrap failed (TSI_DATA_CORRUPTED)";
- a plaintext client on etcd's TLS port: "Socket closed", as for an etcd going down; speaks_tls() tells
  them apart;
- a TLS client on a plaintext port: "Handshake read failed (Socket closed)".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from typing import Any

import grpc
from aetcd import rpc

from danube_fast.meta.etcd_access import HTTPS, EtcdAccess, EtcdAccessError
from danube_fast.meta.store import MetadataRefused, MetadataUnavailable

log = logging.getLogger("danube_fast.meta.etcd")

CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 100,  # gRPC's defaults (1 s, growing to 120 s) would keep a
    "grpc.min_reconnect_backoff_ms": 100,      # restarted etcd unused for minutes
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.use_local_subchannel_pool": 1,  # a store's connections are its own: another store's backoff
                                          # after a refused connect must not fail this one's first call
    "grpc.keepalive_time_ms": 10_000,  # detects a silent partition; etcd allows pings every 5 s or more
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.max_receive_message_length": -1,  # a large get_prefix
}
# etcd's ErrGRPCInvalidAuthToken and ErrGRPCAuthOldRevision (api/v3rpc/rpctypes/error.go): the token is no
# longer good (expired, or the user's roles changed); a new login gives one that is.
STALE_TOKEN = ("invalid auth token", "revision of auth store is old")
AUTH_FAILED = "authentication failed"
AUTH_OFF = "authentication is not enabled"
PERMISSION_DENIED = "permission denied"
CLIENT_CERT_REFUSED = ("TSI_DATA_CORRUPTED", "ALERT_BAD_CERTIFICATE", "ALERT_CERTIFICATE_REQUIRED",
                       "ALERT_UNKNOWN_CA")
SERVER_CERT_UNTRUSTED = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed")
PEER_CLOSED_HANDSHAKE = ("Handshake read failed", "Handshake write failed")
PROBE_SECONDS = 2.0
Metadata = tuple[tuple[str, str], ...]


class HandshakeFailed(MetadataUnavailable):
    """The TLS handshake with etcd failed. `certain`: a certificate was refused, which only a change of
    settings fixes (EtcdStore.connect then gives up at once). Later, as when etcd's certificate is renewed,
    calls keep retrying it like an unreachable etcd."""

    def __init__(self, message: str, certain: bool) -> None:
        super().__init__(message)
        self.certain = certain


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise EtcdAccessError(f"cannot read the etcd {what} {path}: {e.strerror or e}") from e


def cause(details: str) -> str:
    """grpc's details without the address prefix: "failed to connect to all addresses; last error:
    UNKNOWN: ipv4:127.0.0.1:2379: Tls handshake failed ..." -> "Tls handshake failed ..."."""
    text = details.rpartition("last error: ")[2]
    return re.sub(r"^[A-Z_]+: (ipv4|ipv6|unix)\S*: ", "", text).removesuffix(": OK")


def stale_token(code: grpc.StatusCode, details: str) -> bool:
    return code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT) and \
        any(t in details for t in STALE_TOKEN)


class Member:
    """One endpoint of the store. open() makes the channel (on the running loop); close() closes it."""

    def __init__(self, endpoint: str, access: EtcdAccess, tls: bool, password: str) -> None:
        self.target = endpoint.removeprefix(HTTPS)
        self.name = HTTPS + self.target if tls else self.target  # how messages call it
        self.access = access
        self.tls = tls
        self._password = password
        self._credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(access.ca_file, "CA file") if access.ca_file else None,
            private_key=_read(access.key_file, "client key file") if access.key_file else None,
            certificate_chain=_read(access.cert_file, "client certificate file") if access.cert_file
            else None) if tls else None
        self.channel: Any = None
        self.kvstub: Any = None
        self.leasestub: Any = None
        self._token: str | None = None if access.user else ""  # "" = calls carry none
        self._login: asyncio.Lock | None = None

    def open(self) -> None:
        options = list(CHANNEL_OPTIONS.items())
        self.channel = (grpc.aio.secure_channel(self.target, self._credentials, options)
                        if self._credentials is not None else grpc.aio.insecure_channel(self.target, options))
        self.kvstub = rpc.KVStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()

    async def metadata(self, base: Metadata, timeout: float) -> Metadata:
        """`base` and the auth token, logging in first if there is none yet. MetadataRefused if etcd refuses
        the user; an AioRpcError from the login goes to the caller, like one of the call it is for."""
        if self._token is None:
            self._login = self._login or asyncio.Lock()
            async with self._login:
                if self._token is None:
                    self._token = await self._authenticate(timeout)
        return (*base, ("token", self._token)) if self._token else base

    def forget_token(self) -> None:
        """The token is stale: the next call logs in again."""
        if self.access.user:
            self._token = None

    async def _authenticate(self, timeout: float) -> str:
        request = rpc.AuthenticateRequest(name=self.access.user, password=self._password)
        try:
            response = await rpc.AuthStub(self.channel).Authenticate(request, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            details = e.details() or ""
            if AUTH_FAILED in details:
                raise MetadataRefused(f"etcd at {self.name} refused user {self.access.user!r}: wrong "
                                      f"password or no such user ({details})") from e
            if AUTH_OFF in details:
                log.warning("etcd at %s has authentication off: user %r is not needed there", self.name,
                            self.access.user)
                return ""
            raise
        return str(response.token)

    def refusal(self, code: grpc.StatusCode, details: str) -> MetadataRefused | HandshakeFailed | None:
        """The error a refusal by etcd is, in words naming this endpoint and what was refused; None for
        anything else."""
        if code == grpc.StatusCode.PERMISSION_DENIED:
            if not self.access.user:
                return MetadataRefused(f"etcd at {self.name} refused a call without a user: its "
                                       f"authentication is on ({details}); give a user and its password")
            return MetadataRefused(f"etcd at {self.name} refused user {self.access.user!r} ({details}): it "
                                   f"needs a role that may read and write every key (root, or readwrite on "
                                   f"the range from /)")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return MetadataRefused(f"etcd at {self.name} refused the token of user {self.access.user!r} "
                                   f"({details})")
        if code != grpc.StatusCode.UNAVAILABLE:
            return None
        why = cause(details)
        if any(t in details for t in SERVER_CERT_UNTRUSTED):
            trusted = f"the CA in {self.access.ca_file}" if self.access.ca_file else "the system's CAs"
            return HandshakeFailed(f"the TLS handshake with etcd at {self.name} failed: this client does not "
                                   f"trust etcd's certificate, which {trusted} did not sign ({why})", True)
        if self.tls and any(t in details for t in CLIENT_CERT_REFUSED):
            given = (f"did not accept the client certificate {self.access.cert_file} (signed by a CA that "
                     f"is not in its --trusted-ca-file?)" if self.access.cert_file else
                     "requires a client certificate (--client-cert-auth) and this client gave none")
            return HandshakeFailed(f"etcd at {self.name} refused the TLS connection: it {given} ({why})",
                                   True)
        if self.tls and any(t in details for t in PEER_CLOSED_HANDSHAKE):
            return HandshakeFailed(f"the TLS handshake with etcd at {self.name} failed: etcd closed the "
                                   f"connection ({why}); if it serves plaintext, write its endpoint without "
                                   f"https:// and give no CA or client certificate", False)
        if self.tls and "handshake failed" in details.lower():
            return HandshakeFailed(f"the TLS handshake with etcd at {self.name} failed ({why})", True)
        return None

    async def speaks_tls(self) -> bool:
        """Whether the endpoint answers a TLS handshake (told without checking its certificate): a plaintext
        client's "Socket closed" is then not an etcd going down but a TLS port."""
        host, _, port = self.target.rpartition(":")
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host.strip("[]"), int(port), ssl=context), PROBE_SECONDS)
        except ssl.SSLError as e:
            return "ALERT" in (e.reason or "")  # etcd's TLS alert: a TLS server, refusing the probe
        except (TimeoutError, OSError):
            return False
        writer.close()
        with contextlib.suppress(OSError):  # ssl.SSLError is one
            await writer.wait_closed()
        return True

    def plaintext_on_tls(self) -> MetadataRefused:
        return MetadataRefused(f"etcd at {self.target} serves TLS and this client connected in plaintext: "
                               f"write the endpoint https://{self.target} and give the CA that signed etcd's "
                               f"certificate (and a client certificate if etcd asks for one)")

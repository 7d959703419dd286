"""Open a MetadataStore from a URL, as the command line and the broker configuration name it:

    embedded:/path/to/meta.db            the SQLite store of standalone mode (a relative path is allowed)
    etcd://host:port[,host:port...]      an etcd cluster; IPv6 hosts in brackets: etcd://[::1]:2379
    etcd://https://host:port[,...]       an etcd cluster that serves TLS (every endpoint https://)

An embedded store has one owner: open it only while no broker holds it (EmbeddedStore keeps the revision
and the lease deadlines in memory). An etcd store's TLS and authentication settings are an EtcdAccess
(meta/etcd_access.py); a CA or client certificate there turns TLS on even for endpoints written without
https://.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from danube_fast.meta.etcd_access import HTTPS, NO_ACCESS, EtcdAccess
from danube_fast.meta.store import MetadataError, MetadataStore

EMBEDDED_SCHEME = "embedded:"
ETCD_SCHEME = "etcd://"
URL_FORMS = "embedded:/path/to/meta.db or etcd://host:port[,host:port] (etcd://https://host:port for TLS)"


class StoreUrlError(MetadataError, ValueError):
    """The text is not a metadata store URL."""

    grpc_code = "INVALID_ARGUMENT"


class StoreNotFound(MetadataError):
    """An embedded store was to be opened, not created, and its file does not exist."""

    grpc_code = "NOT_FOUND"


@dataclass(frozen=True)
class StoreUrl:
    kind: Literal["embedded", "etcd"]
    path: str = ""  # embedded
    endpoints: tuple[str, ...] = ()  # etcd, as host:port, or https://host:port when etcd serves TLS

    @property
    def tls(self) -> bool:
        """The URL says etcd serves TLS (an EtcdAccess with a CA or certificate says it too)."""
        return any(e.startswith(HTTPS) for e in self.endpoints)

    def __str__(self) -> str:
        if self.kind == "embedded":
            return EMBEDDED_SCHEME + self.path
        return ETCD_SCHEME + ",".join(self.endpoints)


def parse_store_url(url: str) -> StoreUrl:
    """Raises StoreUrlError, naming what is wrong."""
    if url.startswith(EMBEDDED_SCHEME):
        path = url.removeprefix(EMBEDDED_SCHEME)
        if not path:
            raise StoreUrlError(f"{url!r} names no file: write embedded:/path/to/meta.db")
        if path.startswith("//"):
            raise StoreUrlError(f"{url!r}: an embedded store URL is embedded: and a file path, as in "
                                f"embedded:/var/lib/danube/meta.db, without //")
        return StoreUrl("embedded", path=path)
    if url.startswith(ETCD_SCHEME):
        rest = url.removeprefix(ETCD_SCHEME).rstrip("/")
        if not rest:
            raise StoreUrlError(f"{url!r} names no etcd endpoint: write etcd://host:port[,host:port]")
        endpoints = tuple(_endpoint(e.strip(), url) for e in rest.split(","))
        if len({e.startswith(HTTPS) for e in endpoints}) > 1:
            raise StoreUrlError(f"{url!r} mixes https:// and plaintext etcd endpoints: the members of one "
                                "etcd cluster serve clients alike")
        return StoreUrl("etcd", endpoints=endpoints)
    raise StoreUrlError(f"{url!r} is not a metadata store URL: write {URL_FORMS}")


def _endpoint(text: str, url: str) -> str:
    scheme = HTTPS if text.startswith(HTTPS) else ""
    host, colon, port = text.removeprefix(scheme).rpartition(":")
    if not colon or not host or not port:
        raise StoreUrlError(f"etcd endpoint {text!r} in {url!r} is not host:port")
    if "/" in host or "@" in host:
        raise StoreUrlError(f"etcd endpoint {text!r} in {url!r} is not host:port or https://host:port (no "
                            "other scheme, no path or user)")
    if host.startswith("[") != host.endswith("]") or (":" in host and not host.startswith("[")):
        raise StoreUrlError(f"etcd endpoint {text!r} in {url!r}: write an IPv6 host in brackets, [::1]:2379")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise StoreUrlError(f"etcd endpoint {text!r} in {url!r}: port {port!r} is not a number in 1..65535")
    return f"{scheme}{host}:{int(port)}"


def check_access(url: StoreUrl, access: EtcdAccess) -> None:
    """StoreUrlError when etcd settings are given for an embedded store (they would be ignored)."""
    if url.kind == "embedded" and access.given:
        raise StoreUrlError(f"{url} is an embedded store: the etcd TLS and user settings are for etcd:// "
                            "stores")


async def open_store(url: str | StoreUrl, *, access: EtcdAccess = NO_ACCESS, create: bool = True,
                     timeout: float = 5.0) -> MetadataStore:
    """The store `url` names, open; the caller closes it. `create=False` refuses an embedded store whose file
    does not exist (StoreNotFound) instead of creating an empty one: a backup of a mistyped path must fail,
    not save an empty store. An etcd store is reached with `access` (TLS, a user); it raises
    MetadataUnavailable if no call succeeds within `timeout` seconds, MetadataRefused at once when etcd
    refuses the TLS handshake or the user (EtcdStore.connect); StoreUrlError for a malformed URL."""
    parsed = parse_store_url(url) if isinstance(url, str) else url
    check_access(parsed, access)
    if parsed.kind == "embedded":
        from danube_fast.meta.embedded import EmbeddedStore

        if not create and not os.path.isfile(parsed.path):
            raise StoreNotFound(f"there is no embedded metadata store at {parsed.path}")
        return await EmbeddedStore.open(parsed.path)
    from danube_fast.meta.etcd import EtcdStore  # imported here: standalone mode needs no gRPC

    return await EtcdStore.connect(parsed.endpoints, access=access, timeout=timeout)

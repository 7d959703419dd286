"""The console of a broker, built from its parts for broker/assemble.py: the admin channel it calls as its
users, over loopback to this broker's own admin port with the port's TLS (docs/CONSOLE.md, "Security")."""

from __future__ import annotations

import ssl

from danube_fast.broker.config import BrokerConfig
from danube_fast.client.credentials import Credentials, open_channel
from danube_fast.console.api import Api
from danube_fast.console.calls import AdminCalls
from danube_fast.console.server import ConsoleServer
from danube_fast.console.sessions import Sessions
from danube_fast.errors import DanubeError
from danube_fast.schema.registry import SchemaRegistry
from danube_fast.security.tls import server_ssl_context

_ANY = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1", "[::]": "[::1]"}


class ConsoleConfigError(DanubeError):
    """A console that could not act as its users under these security settings."""


def build_console(config: BrokerConfig, admin_port: int, registry: SchemaRegistry) -> ConsoleServer:
    security = config.security
    if security.verify_client and not security.jwt:
        # Its users would need their own certificates on its calls, which it cannot present for them:
        # with the broker's own it would act as the broker.
        raise ConsoleConfigError("the web console needs [security] mode tls_jwt (users sign in with a token) "
                                 "when clients are identified by certificates only; set --console-addr '' "
                                 "to run without it")
    host = config.admin_addr.rpartition(":")[0]
    target = f"{_ANY.get(host, host)}:{admin_port}"
    credentials = None
    if security.tls:
        mtls = security.verify_client
        credentials = Credentials(ca_file=security.ca_file or None,
                                  cert_file=security.cert_file if mtls else None,
                                  key_file=security.key_file if mtls else None)
    calls = AdminCalls(open_channel(target, credentials=credentials))
    api = Api(calls, registry)
    tls = server_ssl_context(security) if security.tls else None
    if tls is not None and security.verify_client:
        tls.verify_mode = ssl.CERT_NONE  # browsers sign in with a token here (above)
    return ConsoleServer(calls, api, Sessions(), authenticates=security.authenticates, tls=tls)

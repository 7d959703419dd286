"""How a client reaches a secured etcd: client TLS (the CA that signed etcd's certificate; a certificate and
key of its own for etcd's `--client-cert-auth`) and etcd's authentication (a user and its password).

One value for every opener of the store, each with its own names for the settings (`names` of check()): the
broker's `[cluster] etcd_*` settings, `admin metadata backup|restore`'s `--etcd-*` options and the Spark
source's `etcd*` options (docs/SECURITY.md#the-metadata-store-etcd-over-tls-with-authentication).

The password is resolved where the store is opened, not where the settings were read (a Spark task opens it
on an executor): `password`, else the file `password_file` names, else the environment variable
`password_env` names (DANUBE_ETCD_PASSWORD unless told), so that it need not be written in a config file.
No gRPC here: standalone mode imports this through meta/connect.py.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from danube_fast.meta.store import MetadataError

ETCD_PASSWORD_ENV = "DANUBE_ETCD_PASSWORD"
HTTPS = "https://"


class EtcdAccessError(MetadataError, ValueError):
    """The TLS or authentication settings cannot work: a certificate without its key, a user without a
    password (or the reverse), a file that cannot be read."""

    grpc_code = "INVALID_ARGUMENT"


@dataclass(frozen=True)
class EtcdAccess:
    """TLS is on when `ca_file` or `cert_file` is set, or an endpoint is written https://; an empty
    `ca_file` then trusts the system's roots. Authentication is on when `user` is set."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    user: str = ""
    password: str = field(default="", repr=False)
    password_file: str = ""
    password_env: str = ETCD_PASSWORD_ENV

    @property
    def tls(self) -> bool:
        return bool(self.ca_file or self.cert_file)

    @property
    def given(self) -> bool:
        """Some setting is made (the environment variable alone is not a setting)."""
        return any(getattr(self, f.name) for f in fields(self) if f.name != "password_env")

    def check(self, names: Mapping[str, str] | None = None) -> None:
        """Refuse settings that cannot work, calling each by `names[field]` (the field's name if absent):
        EtcdAccessError. The files are not read here; resolve_password() reads the password's."""
        name = _names(names)
        if bool(self.cert_file) != bool(self.key_file):
            raise EtcdAccessError(f"{name['cert_file']} and {name['key_file']} go together (a client "
                                  "certificate for etcd and its key)")
        if self.password and self.password_file:
            raise EtcdAccessError(f"give {name['password']} or {name['password_file']}, not both")
        if (self.password or self.password_file) and not self.user:
            raise EtcdAccessError(f"an etcd password needs {name['user']}, the user it belongs to")

    def resolve_password(self, environ: Mapping[str, str] = os.environ,
                         names: Mapping[str, str] | None = None) -> str:
        """The password to log in with ("" without a user): EtcdAccessError if a user has none (`names` as
        for check()), or the file cannot be read."""
        if not self.user:
            return ""
        if self.password:
            return self.password
        if self.password_file:
            try:
                with open(self.password_file, encoding="utf-8") as f:
                    password = f.read().rstrip("\r\n")  # the newline an editor or `echo` adds
            except (OSError, UnicodeDecodeError) as e:
                raise EtcdAccessError(f"cannot read the etcd password file {self.password_file}: {e}") from e
            if not password:
                raise EtcdAccessError(f"the etcd password file {self.password_file} is empty")
            return password
        password = environ.get(self.password_env, "")
        if not password:
            raise EtcdAccessError(f"etcd user {self.user!r} has no password: give "
                                  f"{_names(names)['password_file']}, or the environment variable "
                                  f"{self.password_env}")
        return password


def _names(names: Mapping[str, str] | None) -> dict[str, str]:
    return {f.name: (names or {}).get(f.name, f.name) for f in fields(EtcdAccess)}


NO_ACCESS = EtcdAccess()  # plaintext, no user: etcd's defaults

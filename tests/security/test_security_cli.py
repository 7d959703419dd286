"""`danube-fast admin security ...` and the admin CLI's TLS and token options, against a tls_jwt broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from danube_fast.testing.broker import Broker
from tests.security.conftest import AUDIENCE, ISSUER, Pki


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "danube_fast.cli.main", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})


def test_a_token_from_the_cli_administers_the_broker(jwt_broker: Broker, pki: Pki) -> None:
    made = cli("admin", "security", "tokens", "create", "--sub", "admin", "--ttl", "600", "--key-file",
               str(pki.secret_file), "--issuer", ISSUER, "--audience", AUDIENCE)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.count(".") == 2 and "\n" not in token
    secure = ["--admin-addr", f"127.0.0.1:{jwt_broker.admin_port}", "--tls-ca", str(pki.ca)]

    put = cli("admin", "security", "roles", "put", "ops", "--permission", "Lookup", "--permission",
              "ManageTopic", *secure, "--token", token, "--output", "json")
    assert put.returncode == 0, put.stderr
    assert json.loads(put.stdout) == {"role": "ops", "permissions": ["Lookup", "ManageTopic"]}
    added = cli("admin", "security", "bindings", "add", "--principal", "carol", "--role", "ops", "--scope",
                "/default", *secure, env={"DANUBE_TOKEN": token})
    assert added.returncode == 0, added.stderr
    listed = cli("admin", "security", "bindings", "list", "--principal", "carol", *secure, "--token", token,
                 "--output", "json")
    assert json.loads(listed.stdout) == {"bindings": [{"principal": "carol", "role": "ops",
                                                        "scope": "/default"}]}
    brokers = cli("admin", "brokers", "list", *secure, "--token", token, "--output", "json")
    assert brokers.returncode == 0 and len(json.loads(brokers.stdout)["brokers"]) == 1, brokers.stderr

    # Refusals are one line and exit 1: no token; a token of a principal without the permission.
    for extra in ([], ["--token", pki.token("carol")]):
        refused = cli("admin", "security", "roles", "list", *secure, *extra)
        assert refused.returncode == 1
        assert refused.stderr.count("\n") == 1
        assert ("UNAUTHENTICATED" if not extra else "PERMISSION_DENIED") in refused.stderr


def test_tokens_create_refuses_a_short_secret(tmp_path: Path) -> None:
    secret = tmp_path / "short"
    secret.write_text("tooshort")
    made = cli("admin", "security", "tokens", "create", "--sub", "a", "--ttl", "60",
               "--key-file", str(secret), "--issuer", "i", "--audience", "a")
    assert made.returncode == 1 and "at least 32" in made.stderr

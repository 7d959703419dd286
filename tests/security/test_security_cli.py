"""`danube-fast admin security ...` and the admin CLI's TLS and token options, against a tls_jwt broker;
revoking tokens through the CLI and the broker's refusals after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest

from danube_fast.testing.broker import Broker
from tests.compat.compat_support import run_async
from tests.security.conftest import AUDIENCE, ISSUER, Pki
from tests.security.test_secure_broker import health_error, seconds_until_refused


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


# -- revoking tokens (docs/SECURITY.md#revoking-tokens) ---------------------------------------------------

def secure(broker: Broker, pki: Pki) -> list[str]:
    """The connection options of an admin command run by the super admin."""
    return ["--admin-addr", f"127.0.0.1:{broker.admin_port}", "--tls-ca", str(pki.ca), "--token",
            pki.token("admin")]


def revoke(broker: Broker, pki: Pki, *what: str) -> dict[str, Any]:
    done = cli("admin", "security", "tokens", "revoke", *what, *secure(broker, pki), "--output", "json")
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def revocations(broker: Broker, pki: Pki) -> list[dict[str, Any]]:
    listed = cli("admin", "security", "tokens", "revocations", "list", *secure(broker, pki), "--output",
                 "json")
    assert listed.returncode == 0, listed.stderr
    rows: list[dict[str, Any]] = json.loads(listed.stdout)["revocations"]
    return rows


def test_a_token_revoked_by_jti_is_refused_at_once_and_its_siblings_are_not(jwt_broker: Broker,
                                                                             pki: Pki) -> None:
    made = cli("admin", "security", "tokens", "create", "--sub", "leaky", "--ttl", "600", "--key-file",
               str(pki.secret_file), "--issuer", ISSUER, "--audience", AUDIENCE, "--output", "json")
    assert made.returncode == 0, made.stderr
    leaked, jti = json.loads(made.stdout)["token"], json.loads(made.stdout)["jti"]
    claims = jwt.decode(leaked, options={"verify_signature": False})
    assert claims["jti"] == jti and claims["iat"] <= time.time() < claims["exp"]  # tokens create sets both
    sibling = pki.token("leaky", jti=str(uuid.uuid4()))  # the same principal, another token
    by_id = pki.token("leaky", jti=str(uuid.uuid4()))

    async def accepted(token: str) -> bool:
        return await health_error(jwt_broker, pki, token) is None

    assert run_async(accepted(leaked)) and run_async(accepted(sibling))
    answer = revoke(jwt_broker, pki, "--from-token", leaked)
    revoked_at = time.monotonic()  # the CLI returned: the write is in the store and this broker's cache
    assert answer["revoked"] == "token" and answer["jti"] == jti and answer["sub"] == "leaky"
    assert answer["exp"] == datetime.fromtimestamp(claims["exp"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    async def after() -> None:
        seconds, error = await seconds_until_refused(jwt_broker, pki, leaked, revoked_at)
        print(f"refused {seconds * 1000:.0f} ms after the CLI returned")
        assert seconds <= 2.0
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED and "revoked" in (error.details() or "")
        assert leaked not in (error.details() or "")
        assert await accepted(sibling)
    run_async(after())

    # By --jti, with an expiry given by hand; listed, then removed again.
    exp = jwt.decode(by_id, options={"verify_signature": False})["exp"]
    expiry = datetime.fromtimestamp(exp, UTC).isoformat()
    jti_of = jwt.decode(by_id, options={"verify_signature": False})["jti"]
    assert revoke(jwt_broker, pki, "--jti", jti_of, "--exp", expiry)["jti"] == jti_of
    error = run_async(health_error(jwt_broker, pki, by_id))
    assert error is not None and error.code() == grpc.StatusCode.UNAUTHENTICATED
    listed = {row["jti"]: row for row in revocations(jwt_broker, pki) if row["kind"] == "token"}
    assert listed[jti]["sub"] == "leaky" and listed[jti_of]["exp"].startswith(expiry[:19])
    removed = cli("admin", "security", "tokens", "unrevoke", "--jti", jti_of, *secure(jwt_broker, pki),
                  "--output", "json")
    assert json.loads(removed.stdout) == {"jti": jti_of, "removed": True}, removed.stderr
    assert run_async(accepted(by_id)) and not run_async(accepted(leaked))


def test_revoking_a_subject_refuses_its_older_tokens_and_accepts_newer_ones(jwt_broker: Broker,
                                                                            pki: Pki) -> None:
    older = pki.token("rotating")
    without_iat = pki.token("rotating", iat=None)
    answer = revoke(jwt_broker, pki, "--sub", "rotating", "--before", "now")
    assert answer["revoked"] == "subject" and answer["sub"] == "rotating"
    before = datetime.strptime(answer["before"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    while time.time() < before:  # `now` is rounded up to the next second: a token of this second is refused
        time.sleep(0.05)
    newer = pki.token("rotating")
    for token, refused in ((older, True), (without_iat, True), (newer, False),
                           (pki.token("someone-else", iat=int(before) - 100), False)):
        error = run_async(health_error(jwt_broker, pki, token))
        if refused:
            assert error is not None and error.code() == grpc.StatusCode.UNAUTHENTICATED, error
            assert "revoked" in (error.details() or "") and "rotating" in (error.details() or "")
        else:
            assert error is None, error
    subjects = [row for row in revocations(jwt_broker, pki) if row["kind"] == "subject"]
    assert [(row["sub"], row["before"]) for row in subjects] == [("rotating", answer["before"])]
    removed = cli("admin", "security", "tokens", "unrevoke", "--sub", "rotating", *secure(jwt_broker, pki))
    assert removed.returncode == 0, removed.stderr
    assert run_async(health_error(jwt_broker, pki, older)) is None


@pytest.mark.parametrize(("what", "code", "words"), [
    (["--jti", ""], 1, "INVALID_ARGUMENT: jti must not be empty"),
    (["--sub", "cert:alice"], 1, "INVALID_ARGUMENT"),
    (["--sub", "bob", "--before", "yesterday"], 2, "'yesterday' is not 'now'"),
    (["--sub", "bob", "--before", "2026-01-31T12:00:00"], 2, "has no time zone"),
    (["--sub", "bob", "--before", "2999-01-01T00:00:00Z"], 1, "in the future"),
    (["--jti", "x", "--exp", "2001-01-01T00:00:00Z"], 1, "expired at 2001-01-01T00:00:00Z"),
    (["--sub", "bob", "--exp", "now"], 1, "--exp goes with --jti"),
    (["--from-token", "not-a-token"], 1, "not a readable JWT"),
    (["--jti", "x", "--sub", "bob"], 2, "not allowed with argument"),
])
def test_bad_revocations_are_refused_clearly(jwt_broker: Broker, pki: Pki, what: list[str], code: int,
                                             words: str) -> None:
    done = cli("admin", "security", "tokens", "revoke", *what, *secure(jwt_broker, pki))
    assert done.returncode == code and words in done.stderr, done.stderr


def test_a_token_without_jti_can_only_be_revoked_by_subject(jwt_broker: Broker, pki: Pki) -> None:
    done = cli("admin", "security", "tokens", "revoke", "--from-token", pki.token("old-style"),
               *secure(jwt_broker, pki))
    assert done.returncode == 1 and "has no jti" in done.stderr and "--sub old-style" in done.stderr

"""The metadata store on an etcd that serves TLS, requires client certificates (`--client-cert-auth`) and has
its authentication on (user root): opened with the right CA, certificate, user and password it works, for
the store, a cluster broker, `admin metadata backup` and the Spark source's options; with a certificate or
a password missing or wrong, opening fails at once with a line that names etcd, its endpoint and what it
refused (docs/SECURITY.md#the-metadata-store-etcd-over-tls-with-authentication).

One etcd for the module. Its auth tokens live 1 s (`--auth-token-ttl=1`, etcd's default is 300 s after the
last use), so that every test here also runs through logging in again after a token expired.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from danube_fast.meta import keys
from danube_fast.meta.connect import open_store
from danube_fast.meta.etcd_access import ETCD_PASSWORD_ENV, EtcdAccess, EtcdAccessError
from danube_fast.meta.reader import open_reader
from danube_fast.meta.store import MetadataRefused
from danube_fast.testing.broker import ClusterBroker
from danube_fast.testing.certs import Authority, Issued, authority
from danube_fast.testing.cluster import Cluster
from danube_fast.testing.etcd import EtcdServer, enable_auth, start_etcd
from danube_fast.testing.process import repo_env

pytestmark = [pytest.mark.timeout(120), pytest.mark.etcd, pytest.mark.cluster]
on_asyncio = pytest.mark.parametrize("run", ["asyncio"], indirect=True)  # the loop is not what is tested

PASSWORD = "s3cret-root"
TOKEN_TTL_S = 1
CANNOT_START = "danube-fast broker: cannot start: "
WRONG_PASSWORD = "refused user 'root': wrong password or no such user (etcdserver: authentication failed, " \
                 "invalid user ID or password)"
NO_CERTIFICATE = "refused the TLS connection: it requires a client certificate (--client-cert-auth) and " \
                 "this client gave none"


@dataclasses.dataclass
class Secured:
    etcd: EtcdServer
    ca: Authority
    stranger: Issued  # a client certificate of another CA

    @property
    def access(self) -> EtcdAccess:
        """Everything right; the password given directly."""
        return self.etcd.access("root", PASSWORD)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("etcd-tls")
    ca = authority(root / "pki")
    other = authority(root / "other", "other-ca")
    etcd = start_etcd(root / "etcd" / "data", tls=ca, extra_args=[f"--auth-token-ttl={TOKEN_TTL_S}"])
    try:
        asyncio.run(enable_auth(etcd, PASSWORD))
        yield Secured(etcd, ca, other.issue(root / "other", "stranger"))
    finally:
        etcd.stop()


def test_the_right_ca_certificate_and_password_open_a_store_that_works(secured: Secured, run: Any) -> None:
    async def scenario() -> None:
        store = await open_store(secured.etcd.url, access=secured.access)
        try:
            events = store.watch_prefix("/tls/")
            first = asyncio.ensure_future(anext(events))
            revision = await store.put("/tls/a", b"one")
            assert (await store.get("/tls/a")).value == b"one"  # type: ignore[union-attr]
            event = await asyncio.wait_for(first, 5)
            assert (event.key, event.value, event.revision) == ("/tls/a", b"one", revision)
            lease = await store.grant_lease(5)
            assert await store.keep_alive(lease) > 0
            await asyncio.sleep(TOKEN_TTL_S + 1.5)  # the token expires; the next call logs in again
            await store.put("/tls/b", b"two", lease=lease)
            assert [kv.key for kv in await store.get_prefix("/tls/")] == ["/tls/a", "/tls/b"]
            second = await asyncio.wait_for(anext(events), 5)
            assert (second.key, second.value) == ("/tls/b", b"two")
            await events.aclose()  # type: ignore[attr-defined]
            await store.delete_prefix("/tls/")
        finally:
            await store.close()

    run(scenario())


@on_asyncio
def test_the_password_may_come_from_the_environment(secured: Secured, run: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ETCD_PASSWORD_ENV, PASSWORD)
    access = dataclasses.replace(secured.access, password="")

    async def scenario() -> None:
        reader = await open_reader(secured.etcd.url, access=access)
        try:
            assert await reader.get("/tls/none") is None
        finally:
            await reader.close()

    run(scenario())
    monkeypatch.delenv(ETCD_PASSWORD_ENV)
    with pytest.raises(EtcdAccessError, match=f"etcd user 'root' has no password: give password_file, or "
                                              f"the environment variable {ETCD_PASSWORD_ENV}"):
        access.resolve_password()


def refusals(secured: Secured) -> dict[str, tuple[str, EtcdAccess]]:
    """What etcd refuses, as the store opened with these settings says it."""
    at = f"etcd at {secured.etcd.endpoint} "
    good = secured.access
    plain = secured.etcd.endpoint.removeprefix("https://")
    stranger = secured.stranger
    return {
        "no client certificate": (at + NO_CERTIFICATE,
                                  dataclasses.replace(good, cert_file="", key_file="")),
        "a certificate of another CA": (
            at + f"refused the TLS connection: it did not accept the client certificate {stranger.cert}",
            dataclasses.replace(good, cert_file=str(stranger.cert), key_file=str(stranger.key))),
        "etcd's certificate not trusted": (
            f"the TLS handshake with etcd at {secured.etcd.endpoint} failed: this client does not trust "
            "etcd's certificate, which the system's CAs did not sign (Tls handshake failed",
            dataclasses.replace(good, ca_file="")),
        "a wrong password": (at + WRONG_PASSWORD, dataclasses.replace(good, password="not-it")),
        "no user": (at + "refused a call without a user: its authentication is on (etcdserver: permission "
                    "denied)", dataclasses.replace(good, user="", password="")),
        "plaintext": (f"etcd at {plain} serves TLS and this client connected in plaintext: write the "
                      f"endpoint https://{plain}", EtcdAccess()),
    }


@pytest.mark.parametrize("case", ["no client certificate", "a certificate of another CA",
                                  "etcd's certificate not trusted", "a wrong password", "no user",
                                  "plaintext"])
def test_a_refusal_fails_at_once_and_says_what_etcd_refused(secured: Secured, run: Any, case: str) -> None:
    expected, access = refusals(secured)[case]
    url = secured.etcd.url.replace("https://", "") if case == "plaintext" else secured.etcd.url

    async def scenario() -> None:
        started = time.monotonic()
        with pytest.raises(MetadataRefused) as caught:
            await open_store(url, access=access, timeout=8)
        assert str(caught.value).startswith(expected), str(caught.value)
        assert time.monotonic() - started < 3, "a refusal is not a timeout"

    run(scenario())


def broker(cluster: Cluster, secured: Secured, **settings: str) -> ClusterBroker:
    """A broker of `cluster` with the etcd settings `settings` over the right ones (password from the
    environment)."""
    right = {"etcd_ca_file": str(secured.ca.cert), "etcd_cert_file": secured.access.cert_file,
             "etcd_key_file": secured.access.key_file, "etcd_user": "root"}
    b = cluster.add(**{**right, **settings})
    b.env[ETCD_PASSWORD_ENV] = PASSWORD
    return b


def start_error(b: ClusterBroker) -> str:
    b.launch()
    assert b.process is not None
    assert b.process.wait(30) == 1, b.log_tail()
    lines = [line for line in b.log_text().splitlines() if line.startswith(CANNOT_START)]
    assert len(lines) == 1, b.log_tail()
    return lines[0]


def test_a_broker_runs_on_the_secured_etcd_and_one_refused_says_why(secured: Secured, tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, secured.etcd.url, str(tmp_path / "objects"))
    try:
        good = broker(cluster, secured)
        good.start()
        assert good.broker_id is not None

        async def reports() -> int:
            store = await open_store(secured.etcd.url, access=secured.access)
            try:
                assert await store.get(keys.broker_register(good.broker_id)) is not None  # type: ignore[arg-type]
                kv = await store.get(keys.load_report(good.broker_id))  # type: ignore[arg-type]
                return 0 if kv is None else kv.mod_revision
            finally:
                await store.close()

        first = asyncio.run(reports())
        time.sleep(TOKEN_TTL_S + 1.5)  # load reports every second, through expiring tokens
        assert asyncio.run(reports()) > first
        assert good.running, good.log_tail()

        at = f"etcd at {secured.etcd.endpoint} "
        wrong = tmp_path / "wrong-password"
        wrong.write_text("not-it\n")
        assert start_error(broker(cluster, secured, etcd_password_file=str(wrong))) == \
            CANNOT_START + at + WRONG_PASSWORD
        assert start_error(broker(cluster, secured, etcd_cert_file="", etcd_key_file="")).startswith(
            CANNOT_START + at + NO_CERTIFICATE)
    finally:
        cluster.close()


def test_a_broker_refuses_etcd_settings_that_cannot_work(secured: Secured, tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, secured.etcd.url, str(tmp_path / "objects"))
    try:
        b = broker(cluster, secured, etcd_key_file="")
        b.launch()
        assert b.process is not None
        assert b.process.wait(30) == 2
        assert "danube-fast broker: [cluster] etcd_cert_file and [cluster] etcd_key_file go together" in \
            b.log_text()
    finally:
        cluster.close()


def cli(*args: str, password: str | None = PASSWORD) -> subprocess.CompletedProcess[str]:
    env = repo_env()
    env.pop(ETCD_PASSWORD_ENV, None)
    if password is not None:
        env[ETCD_PASSWORD_ENV] = password
    return subprocess.run([sys.executable, "-m", "danube_fast.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


@on_asyncio
def test_admin_metadata_backup_with_the_etcd_options(secured: Secured, tmp_path: Path, run: Any) -> None:
    async def put() -> None:
        store = await open_store(secured.etcd.url, access=secured.access)
        try:
            await store.put("/tls/backed-up", b"yes")
        finally:
            await store.close()

    run(put())
    access = secured.access
    options = ["--store", secured.etcd.url, "--etcd-ca", access.ca_file, "--etcd-cert", access.cert_file,
               "--etcd-key", access.key_file, "--etcd-user", "root", "--output", "json"]
    out = tmp_path / "meta.jsonl"
    done = cli("admin", "metadata", "backup", str(out), *options)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["key_count"] >= 1
    assert '"/tls/backed-up"' in out.read_text()

    wrong = tmp_path / "password"
    wrong.write_text("not-it\n")
    done = cli("admin", "metadata", "backup", str(tmp_path / "other.jsonl"), *options,
               "--etcd-password-file", str(wrong), password=None)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == \
        f"danube-fast: metadata backup failed: etcd at {secured.etcd.endpoint} {WRONG_PASSWORD}"
    done = cli("admin", "metadata", "backup", str(tmp_path / "other.jsonl"), *options, password=None)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == \
        "danube-fast: metadata backup failed: etcd user 'root' has no password: give --etcd-password-file, " \
        f"or the environment variable {ETCD_PASSWORD_ENV}"


@on_asyncio
def test_the_spark_source_options_reach_the_secured_etcd(secured: Secured, tmp_path: Path, run: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark_danube import options

    access = secured.access
    given = {"metadataStore": secured.etcd.url, "objectStore": str(tmp_path), "topic": "/default/t",
             "etcdCaFile": access.ca_file, "etcdCertFile": access.cert_file, "etcdKeyFile": access.key_file,
             "etcdUser": "root", "etcdPasswordEnv": "MY_ETCD_PASSWORD"}
    with pytest.raises(options.OptionError, match="etcd user 'root' has no password: give etcdPasswordFile, "
                                                  "or the environment variable MY_ETCD_PASSWORD"):
        options.parse(given)
    monkeypatch.setenv("MY_ETCD_PASSWORD", PASSWORD)
    parsed = options.parse(given)
    assert parsed.etcd == dataclasses.replace(access, password="", password_env="MY_ETCD_PASSWORD")
    assert "s3cret" not in repr(parsed)

    async def read() -> None:
        reader = await open_reader(parsed.metadata_store, access=parsed.etcd)
        try:
            assert await reader.get("/tls/none") is None
        finally:
            await reader.close()

    run(read())
    with pytest.raises(options.OptionError, match="etcdCertFile and etcdKeyFile go together"):
        options.parse({**given, "etcdKeyFile": ""})
    with pytest.raises(options.OptionError, match="are for an etcd:// metadataStore"):
        options.parse({**given, "metadataStore": f"embedded:{tmp_path / 'meta.db'}"})

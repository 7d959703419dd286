"""A single real etcd server on free loopback ports, as a child process, for the tests and the benchmarks:
no cluster, no tuning, plaintext unless given a CA (then TLS with client certificates required), and a data
dir that survives stop() and start(). enable_auth() turns etcd's authentication on.

The process belongs to whoever created the EtcdServer, which must call stop().
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from aetcd import rpc

from danube_fast.meta.etcd_access import HTTPS, EtcdAccess
from danube_fast.meta.etcd_member import Member
from danube_fast.meta.store import MetadataStore, MetadataUnavailable
from danube_fast.testing.certs import Authority, Issued
from danube_fast.testing.ports import LOOPBACK, free_ports

ETCD_START_SECONDS = 15.0
START_ATTEMPTS = 3  # a free port may be taken by someone else between free_ports() and etcd binding it


class EtcdServer:
    """One etcd process on loopback. stop() and start() keep its data dir and ports: the same server
    comes back, as after a crash or a restart in production. The log goes to `etcd.log` next to the data
    dir. The process belongs to whoever created this object: it must call stop(). `extra_args` go to etcd
    as they are (like `--quota-backend-bytes=N`). With `tls`, the client port serves TLS with a certificate
    of that CA for localhost and 127.0.0.1 and requires client certificates of it (`--client-cert-auth`);
    `client` is one, which the health check uses."""

    def __init__(self, data_dir: Path, name: str = "contract", extra_args: Sequence[str] = (),
                 tls: Authority | None = None) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("the etcd binary is missing: run scripts/system-deps.sh (Debian: etcd-server)")
        self.binary = binary
        self.data_dir = data_dir
        self.name = name
        self.extra_args = list(extra_args)
        self.client_port, self.peer_port = free_ports(2)
        self.tls = tls
        self.client: Issued | None = None
        self.tls_args: list[str] = []
        if tls is not None:
            pki = data_dir.parent / "etcd-pki"
            pki.mkdir(parents=True, exist_ok=True)
            server, self.client = tls.issue(pki, "etcd-server"), tls.issue(pki, "etcd-client")
            self.tls_args = ["--cert-file", str(server.cert), "--key-file", str(server.key),
                             "--trusted-ca-file", str(tls.cert), "--client-cert-auth"]
        # host:port, or https://host:port with TLS: as a metadata store URL writes it
        self.endpoint = f"{HTTPS if tls else ''}{LOOPBACK}:{self.client_port}"
        self.log_path = data_dir.parent / "etcd.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The metadata store URL of this server."""
        return f"etcd://{self.endpoint}"

    def access(self, user: str = "", password: str = "") -> EtcdAccess:
        """Settings that reach this server: its CA and client certificate (with TLS), and `user`."""
        if self.tls is None or self.client is None:
            return EtcdAccess(user=user, password=password)
        return EtcdAccess(str(self.tls.cert), str(self.client.cert), str(self.client.key), user, password)

    def start(self) -> None:
        scheme = "https" if self.tls else "http"
        client = f"{scheme}://{self.endpoint.removeprefix(HTTPS)}"
        peer = f"http://{LOOPBACK}:{self.peer_port}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [self.binary, "--name", self.name, "--data-dir", str(self.data_dir),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"{self.name}={peer}", "--logger", "zap", "--log-level", "warn",
                 *self.tls_args, *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + ETCD_START_SECONDS
        while not self.healthy():
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise RuntimeError(f"etcd exited with {code}; see {self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"etcd was not healthy within {ETCD_START_SECONDS} s; see {self.log_path}")
            time.sleep(0.05)

    def healthy(self) -> bool:
        context = None
        if self.tls is not None and self.client is not None:
            context = ssl.create_default_context(cafile=str(self.tls.cert))
            context.load_cert_chain(str(self.client.cert), str(self.client.key))
        url = f"{'https' if self.tls else 'http'}://{self.endpoint.removeprefix(HTTPS)}/health"
        try:
            with urllib.request.urlopen(url, timeout=1, context=context) as response:
                return b'"health":"true"' in response.read()
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    def version(self) -> str:
        """Like `3.4.23`, from `etcd --version`; "unknown" if it cannot be read."""
        try:
            out = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=10,
                                 check=False).stdout
        except (OSError, subprocess.SubprocessError):
            return "unknown"
        for line in out.splitlines():
            if line.startswith("etcd Version:"):
                return line.partition(":")[2].strip()
        return "unknown"


def start_etcd(data_dir: Path, name: str = "contract", extra_args: Sequence[str] = (),
               tls: Authority | None = None) -> EtcdServer:
    """A started server with its data in `data_dir` (created by etcd), trying fresh ports up to
    START_ATTEMPTS times. A failed attempt's data dir is removed: it records the ports of that attempt."""
    for attempt in range(START_ATTEMPTS):
        server = EtcdServer(data_dir, name, extra_args, tls)
        try:
            server.start()
            return server
        except RuntimeError:
            if attempt == START_ATTEMPTS - 1:
                raise
            shutil.rmtree(data_dir, ignore_errors=True)
    raise AssertionError("unreachable")


async def enable_auth(server: EtcdServer, root_password: str) -> None:
    """etcd's authentication on, with the user root (role root: every key) and `root_password`, as
    `etcdctl user add root; etcdctl user grant-role root root; etcdctl auth enable` would do."""
    member = Member(server.endpoint, server.access(), server.tls is not None, "")
    member.open()
    try:
        auth = rpc.AuthStub(member.channel)
        await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password=root_password), timeout=5)
        await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout=5)
        await auth.AuthEnable(rpc.AuthEnableRequest(), timeout=5)
    finally:
        await member.close()


async def until_reachable(s: MetadataStore, timeout: float = 8.0) -> None:
    """Return once `s` answers again (after its etcd was stopped and started)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await s.current_revision()
            return
        except MetadataUnavailable:
            assert time.monotonic() < deadline, f"etcd not reachable again within {timeout} s"
            await asyncio.sleep(0.05)

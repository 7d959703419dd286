"""A server subprocess (a broker, moto, the benchmarks' peers): its output appended to one log file across
restarts, ready once a given text shows up in this run's output, stopped with SIGTERM (then SIGKILL) or
killed.

The process belongs to whoever created the ServerProcess, which must stop() or kill() it. With
`die_with_parent` the kernel also kills it when the thread that started it exits (PR_SET_PDEATHSIG), so an
interrupted benchmark leaves no server behind; tests leave it off, since they restart servers from worker
threads (`asyncio.to_thread`) that end before the server should. The signal is set by util-linux's `setpriv`,
which then execs the server: no Python runs between fork and exec (a `preexec_fn` in a process with gRPC's
threads crashed the child with SIGSEGV before exec, one restart in a few, in the chaos campaign).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from danube_fast.testing.ports import LOOPBACK

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 30.0  # seconds a server gets to log its ready text
STOP_TIMEOUT = 15.0  # seconds a server gets to exit after SIGTERM
LOG_TAIL_CHARS = 16_000


class ServerFailed(RuntimeError):
    """A server exited before it was ready, was not ready in time, or did not stop as asked; the message ends
    with the end of its log."""


def die_with_parent(argv: list[str]) -> list[str]:
    """`argv` run so that it gets SIGKILL when the thread that starts it exits, however that exits."""
    return ["setpriv", "--pdeathsig", "KILL", "--", *argv]


def repo_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with this checkout first on PYTHONPATH (a server started from anywhere runs this
    checkout's code), unbuffered Python output (the log shows a line when it is printed), and `extra`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **(extra or {})}


class ServerProcess:
    """One server subprocess listening on LOOPBACK:`port`. `env` holds variables added to the environment of
    the next start; `clean_exits` the exit codes after SIGTERM that are not a failure."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, *, ready_text: str, port: int = 0,
                 cwd: Path = REPO, clean_exits: tuple[int, ...] = (0,),
                 die_with_parent: bool = False) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.ready_text = ready_text
        self.host = LOOPBACK
        self.port = port
        self.cwd = cwd
        self.clean_exits = clean_exits
        self.die_with_parent = die_with_parent
        self.env: dict[str, str] = {}
        self.process: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self._run_offset = 0  # where this run's output starts in the log

    @property
    def target(self) -> str:
        """host:port, for gRPC channels."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.target}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None, f"the {self.name} was never started"
        return self.process.pid

    def command(self) -> list[str]:
        """The command line of the next start."""
        return self.argv

    def launch(self) -> None:
        """Start the process without waiting for it to be ready (see wait_ready)."""
        assert not self.running, f"the {self.name} is already running"
        self.runs += 1
        argv = self.command()
        spawned = die_with_parent(argv) if self.die_with_parent else argv
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"===== run {self.runs}: {shlex.join(argv)}\n".encode())
            log.flush()
            self._run_offset = log.tell()
            self.process = subprocess.Popen(
                spawned, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=repo_env(self.env))

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Return once this run logged `ready_text`; ServerFailed (the process killed) if it exits or the time
        runs out first."""
        process = self.process
        assert process is not None, f"the {self.name} was never started"
        deadline = time.monotonic() + timeout
        while self.ready_text not in self.log_text(self._run_offset):
            rc = process.poll()
            if rc is not None:
                raise ServerFailed(f"the {self.name} exited with code {rc} before logging "
                                   f"{self.ready_text!r}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise ServerFailed(f"the {self.name} did not log {self.ready_text!r} within {timeout} s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.02)

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        """launch() and wait_ready()."""
        self.launch()
        self.wait_ready(timeout)

    def terminate(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM; the server must exit by itself, with a clean exit code, within `timeout`."""
        process = self.process
        if process is None or process.poll() is not None:
            raise ServerFailed(f"the {self.name} is not running (exit code "
                               f"{None if process is None else process.returncode}):\n{self.log_tail()}")
        process.send_signal(signal.SIGTERM)
        try:
            rc = process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ServerFailed(f"the {self.name} was still running {timeout} s after SIGTERM:\n"
                               f"{self.log_tail()}") from None
        if rc not in self.clean_exits:
            raise ServerFailed(f"the {self.name} exited with code {rc} after SIGTERM, expected "
                               f"{' or '.join(map(str, self.clean_exits))}:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: no chance to flush or close anything."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time; an unclean exit is reported on stderr, not
        raised (the benchmarks' teardown)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.process.returncode not in self.clean_exits:
            print(f"WARNING: the {self.name} exited with {self.process.returncode}; the end of its log:\n"
                  f"{self.log_tail(4000)}", file=sys.stderr, flush=True)

    def log_text(self, offset: int = 0) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        text = self.log_text()
        return "[...]\n" + text[-chars:] if len(text) > chars else text

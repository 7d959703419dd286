"""`danube-fast broker` as a subprocess on free loopback ports: standalone (Broker) or a cluster node
(ClusterBroker), its data dir, config file and log under one work dir. restart() reuses ports and data dir.

The process belongs to whoever created the Broker: close() kills it (the tests), stop() terminates it (the
benchmarks).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from danube_fast.testing.ports import LOOPBACK, free_ports
from danube_fast.testing.process import READY_TIMEOUT, ServerFailed, ServerProcess

READY_LINE = "broker ready"  # what `danube-fast broker` logs once every listener is bound
PORT_ATTEMPTS = 3  # first starts that found a port taken (ports.py says how) try fresh ports this often


class Broker(ServerProcess):
    """One `danube-fast broker --mode standalone`. `config` is the TOML of its config file; with `metrics`
    off it serves no Prometheus endpoint; with `native` it serves the native transport on `fast_port`."""

    def __init__(self, workdir: Path, config: str | None = None, *, metrics: bool = True,
                 die_with_parent: bool = False, native: bool = False, console: bool = False) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        # DANUBE_FAST_TEST_NATIVE=1: every broker serves the native transport, so the fast clients of every
        # test take it (a run of the whole suite over it).
        self._native = native or os.environ.get("DANUBE_FAST_TEST_NATIVE") == "1"
        self._console = console
        self._pick_ports()
        self._served = False  # ready once: later starts keep the ports its clients know
        super().__init__("broker", [], workdir / "broker.log", ready_text=READY_LINE, port=self.broker_port,
                         die_with_parent=die_with_parent)
        self.data_dir = workdir / "data"
        self.metrics = metrics
        self.flags: list[str] = []  # added to the command line of the next start
        self.config_file: Path | None = None
        if config is not None:
            self.config_file = workdir / "broker.toml"
            self.config_file.write_text(config)

    def _pick_ports(self) -> None:
        self.broker_port, self.admin_port, self.prom_port = free_ports(3)
        self.fast_port = free_ports(1)[0] if self._native else None
        self.console_port = free_ports(1)[0] if self._console else None
        self.port = self.broker_port

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        """launch() and wait_ready(). A first start that found one of its ports taken is tried again on fresh
        ones: a port is free only "a moment ago" (ports.py), and another test worker's client connection
        can take it meanwhile (a full run on a busy machine failed that way)."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                super().start(timeout)
            except ServerFailed as e:
                if self._served or attempt == PORT_ATTEMPTS or "address already in use" not in str(e):
                    raise
                self._pick_ports()
                continue
            self._served = True
            return

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "danube_fast.cli.main", "broker", "--mode", "standalone",
            "--data-dir", str(self.data_dir),
            "--broker-addr", f"{LOOPBACK}:{self.broker_port}",
            "--admin-addr", f"{LOOPBACK}:{self.admin_port}",
            "--prom-exporter", f"{LOOPBACK}:{self.prom_port}" if self.metrics else "",
        ]
        # Off unless asked for: the default port would be shared by every broker of a test run.
        cmd += ["--fast-addr", f"{LOOPBACK}:{self.fast_port}" if self.fast_port is not None else ""]
        cmd += ["--console-addr", f"{LOOPBACK}:{self.console_port}" if self.console_port is not None else ""]
        if self.config_file is not None:
            cmd += ["--config-file", str(self.config_file)]
        return [*cmd, *self.flags]

    @property
    def fast_target(self) -> str:
        """host:port of its native transport listener."""
        assert self.fast_port is not None, "a broker started without native=True"
        return f"{LOOPBACK}:{self.fast_port}"

    def console_url(self, scheme: str = "http") -> str:
        """The web console's address, as a browser opens it (https when the broker runs a tls mode)."""
        assert self.console_port is not None, "a broker started without console=True"
        return f"{scheme}://{LOOPBACK}:{self.console_port}"

    def restart(self) -> None:
        """Stop the broker if it runs (SIGTERM, must exit 0), then start it on the same ports and data dir."""
        if self.running:
            self.terminate()
        self.start()

    def close(self) -> None:
        self.kill()


class ClusterBroker(Broker):
    """One `danube-fast broker --mode cluster` on the etcd at `etcd_url` (etcd://host:port) and the shared
    `object_store`; `broker_id` is the id it registered, read once it is ready."""

    def __init__(self, workdir: Path, etcd_url: str, object_store: str, config: str, *, metrics: bool = True,
                 die_with_parent: bool = False, native: bool = False, console: bool = False) -> None:
        super().__init__(workdir, config, metrics=metrics, die_with_parent=die_with_parent, native=native,
                         console=console)
        self.etcd_url = etcd_url
        self.object_store = object_store
        self.broker_id: int | None = None

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("standalone")] = "cluster"
        return [*cmd, "--metadata-store", self.etcd_url, "--object-store", self.object_store]

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        super().wait_ready(timeout)
        self.broker_id = int((self.data_dir / "broker_id").read_text())


class BrokerFactory:
    """Standalone brokers of one test, each in its own directory under `root`; close() kills them all."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.brokers: list[Broker] = []

    def add(self, config: str | None = None, *, native: bool = False, console: bool = False) -> Broker:
        """A broker of this factory, not started yet."""
        broker = Broker(self.root / f"broker{len(self.brokers)}", config, native=native, console=console)
        self.brokers.append(broker)
        return broker

    def start(self, config: str | None = None, *, native: bool = False, console: bool = False) -> Broker:
        broker = self.add(config, native=native, console=console)
        broker.start()
        return broker

    def close(self) -> None:
        for broker in self.brokers:
            broker.close()

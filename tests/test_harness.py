"""The harness (danube_fast/testing): only its pytest plugin imports pytest, so that bench can use the rest;
and its fault-injecting proxy against an echo server on loopback: each fault does what it says, and the proxy
passes bytes again after it."""

from __future__ import annotations

import ast
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

from danube_fast.testing.broker import Broker
from danube_fast.testing.ports import LOOPBACK, free_port, free_ports
from danube_fast.testing.proxy import Proxy

HARNESS = Path(__file__).resolve().parents[1] / "danube_fast" / "testing"


def test_only_the_plugin_imports_pytest() -> None:
    importers = []
    for path in sorted(HARNESS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "pytest" or n.startswith(("pytest.", "_pytest")) for n in names):
                importers.append(path.name)
    assert sorted(set(importers)) == ["plugin.py"]


def test_a_port_is_never_handed_out_twice() -> None:
    """Bound and released one at a time, 2,000 loopback ports repeated about 130 times here; two brokers of
    one CI cluster once got the same admin port that way."""
    ports = [free_port() for _ in range(2000)] + free_ports(50)
    assert len(set(ports)) == len(ports)


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    with socketserver.ThreadingTCPServer((LOOPBACK, 0), Echo) as server:
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            with Proxy(f"{LOOPBACK}:{server.server_address[1]}") as p:
                yield p
        finally:
            server.shutdown()


def connect(proxy: Proxy) -> socket.socket:
    s = socket.create_connection((LOOPBACK, proxy.port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def echo(s: socket.socket, data: bytes = b"ping") -> bytes:
    s.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


@pytest.mark.broker_process
def test_a_broker_whose_port_was_taken_meanwhile_starts_on_fresh_ones(tmp_path: Path) -> None:
    """Another process binds the metrics port a broker was given before the broker starts (a full run once
    failed that way): its first start tries fresh ports; a restart keeps the ports it served on."""
    broker = Broker(tmp_path / "b")
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        taken.bind((LOOPBACK, broker.prom_port))
        taken.listen()
        given = broker.prom_port
        broker.start()
        assert broker.prom_port != given and broker.runs == 2 and broker.port == broker.broker_port
        ports = (broker.broker_port, broker.admin_port, broker.prom_port)
        broker.restart()
        assert (broker.broker_port, broker.admin_port, broker.prom_port) == ports
    finally:
        taken.close()
        broker.close()


def test_bytes_pass_through_both_ways(proxy: Proxy) -> None:
    with connect(proxy) as s:
        assert echo(s, b"x" * 100_000) == b"x" * 100_000
    assert proxy.accepted == 1


def test_delay_holds_every_chunk(proxy: Proxy) -> None:
    proxy.delay(0.2)
    with connect(proxy) as s:
        start = time.monotonic()
        assert echo(s) == b"ping"
        assert time.monotonic() - start >= 0.4  # held on the way there and on the way back


def test_blackhole_drops_bytes_and_keeps_the_connection(proxy: Proxy) -> None:
    with connect(proxy) as s:
        proxy.blackhole()
        s.settimeout(0.3)
        with pytest.raises(TimeoutError):
            echo(s)
        assert proxy.open_connections == 1
        proxy.pass_through()
        s.settimeout(5)
        assert echo(s, b"again") == b"again"


def test_reset_breaks_open_connections_and_new_ones_pass(proxy: Proxy) -> None:
    with connect(proxy) as s:
        assert echo(s) == b"ping"
        assert proxy.reset() == 1
        with pytest.raises(ConnectionError):
            echo(s)
    with connect(proxy) as s:
        assert echo(s) == b"ping"


def test_refuse_resets_new_connections_until_pass_through(proxy: Proxy) -> None:
    proxy.refuse()
    with pytest.raises(ConnectionError), connect(proxy) as s:  # at connect() or at the first exchange
        echo(s)
    proxy.pass_through()
    with connect(proxy) as s:
        assert echo(s) == b"ping"
    assert proxy.resets == 1


class Recording(socketserver.BaseRequestHandler):
    """Echoes, and keeps what it received in its server's `received`."""

    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.server.received += data  # type: ignore[attr-defined]
            self.request.sendall(data)


@pytest.mark.parametrize("direction", ["to_server", "to_client"])
def test_one_way_holds_one_direction_until_healed(direction: Literal["to_server", "to_client"]) -> None:
    with socketserver.ThreadingTCPServer((LOOPBACK, 0), Recording) as server:
        server.daemon_threads = True
        server.received = b""  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            with Proxy(f"{LOOPBACK}:{server.server_address[1]}") as p, connect(p) as s:
                p.one_way(direction)
                s.settimeout(0.3)
                with pytest.raises(TimeoutError):
                    echo(s, b"held")
                # the server saw the bytes only if the answer is what is held
                assert server.received == (b"held" if direction == "to_client" else b"")  # type: ignore
                p.pass_through()
                s.settimeout(5)
                assert echo(s, b"again") == b"heldagain"  # nothing lost, nothing reordered
        finally:
            server.shutdown()


def test_stall_holds_both_directions_and_loses_nothing(proxy: Proxy) -> None:
    with connect(proxy) as s:
        proxy.stall()
        s.settimeout(0.3)
        with pytest.raises(TimeoutError):
            echo(s, b"x" * 200_000)
        assert proxy.open_connections == 1
        proxy.pass_through()
        s.settimeout(5)
        s.sendall(b"again")
        expected = b"x" * 200_000 + b"again"
        got = b""
        while len(got) < len(expected) and (chunk := s.recv(65536)):
            got += chunk
        assert got == expected


def test_a_reset_upstream_resets_the_client(proxy: Proxy) -> None:
    """A server that dies with a RST must not leave the client's connection open and silent."""
    class Resetting(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.recv(4096)
            self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.request.close()

    with socketserver.ThreadingTCPServer((LOOPBACK, 0), Resetting) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            with Proxy(f"{LOOPBACK}:{server.server_address[1]}") as p, connect(p) as s:
                s.sendall(b"die")
                s.settimeout(5)
                with pytest.raises(ConnectionError):
                    while s.recv(4096):
                        pass
        finally:
            server.shutdown()

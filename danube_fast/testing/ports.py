"""Free loopback ports for the servers the harness starts.

A port is free only "a moment ago": it is bound and released, so another process may take it before the
server binds it. Launchers that can retry do (etcd.start_etcd, Broker.start); the others fail with the
server's log.

Ports come from below the kernel's ephemeral range (ip_local_port_range) where there is room, never from it:
a port in it can become the source port of any process's outgoing connection, and a broker restarted on its
port after a kill -9 could not bind it while another test worker's client connection held it (a full run
failed so). This process never hands out the same port twice (CI once gave two brokers of one cluster the
same admin port, allocated a moment apart before either bound it).
"""

from __future__ import annotations

import random
import socket
import threading

LOOPBACK = "127.0.0.1"
LOWEST = 10_000  # ports below this are left to the system's own servers
EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"

_given: set[int] = set()  # every port handed out by this process
_lock = threading.Lock()
_random = random.Random()  # seeded from the OS: two test workers do not walk the same sequence


def _listen_range() -> range:
    """Ports no outgoing connection takes as its source: below the ephemeral range (empty when it starts
    too low to leave room, and then the kernel picks)."""
    try:
        with open(EPHEMERAL, encoding="ascii") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    return range(LOWEST, low) if low - LOWEST >= 4096 else range(0)


def free_port() -> int:
    """One loopback port that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports that were free a moment ago and were never handed out before by this
    process (all held bound while they are picked, so never the same one twice)."""
    socks = []
    ports: list[int] = []
    candidates = _listen_range()
    try:
        with _lock:
            tries = 0
            while len(ports) < n:
                tries += 1
                if tries > n + 1000:
                    raise RuntimeError(f"no fresh loopback port after {tries} tries")
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)  # held bound until the end, so nothing takes it meanwhile
                try:
                    s.bind((LOOPBACK, _random.choice(candidates) if candidates else 0))
                except OSError:  # in use
                    continue
                port = int(s.getsockname()[1])
                if port not in _given:
                    ports.append(port)
            _given.update(ports)
        return ports
    finally:
        for s in socks:
            s.close()

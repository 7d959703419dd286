"""Free loopback ports for the servers the harness starts.

A port is free only "a moment ago": it is bound to port 0 and released, so another process may take it before
the server binds it. Launchers that can retry do (etcd.start_etcd); the others fail with the server's log.

The kernel hands out a released port again soon (CI once gave two brokers of one cluster the same admin port,
allocated a moment apart before either bound it), so this process never hands out the same port twice.
"""

from __future__ import annotations

import socket
import threading

LOOPBACK = "127.0.0.1"

_given: set[int] = set()  # every port handed out by this process
_lock = threading.Lock()


def free_port() -> int:
    """One loopback port that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports that were free a moment ago and were never handed out before by this
    process (all held bound while they are picked, so never the same one twice)."""
    socks = []
    ports: list[int] = []
    try:
        with _lock:
            while len(ports) < n:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind((LOOPBACK, 0))
                socks.append(s)  # held until the end, so the kernel cannot hand it out again meanwhile
                port = int(s.getsockname()[1])
                if port not in _given:
                    ports.append(port)
                if len(socks) > n + 1000:
                    raise RuntimeError(f"no fresh loopback port after {len(socks)} tries")
            _given.update(ports)
        return ports
    finally:
        for s in socks:
            s.close()

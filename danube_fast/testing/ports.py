"""Free loopback ports for the servers the harness starts.

A port is free only "a moment ago": it is bound to port 0 and released, so another process may take it before
the server binds it. Launchers that can retry do (etcd.start_etcd); the others fail with the server's log.
"""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """One loopback port that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports that were free a moment ago (bound together, so never the same one)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()

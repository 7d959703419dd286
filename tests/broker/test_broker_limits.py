"""Process limits the broker sets for itself at start (broker/server.py)."""

from __future__ import annotations

import resource
import subprocess
import sys


def test_the_soft_open_files_limit_is_lifted_to_the_hard_limit() -> None:
    """Each Reliable topic holds a descriptor per segment: a broker left at the usual soft limit of 1024 would
    fail topic creation with EMFILE near a thousand topics."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, hard)

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))

    script = ("import resource\nfrom danube_fast.broker.server import raise_open_files_limit\n"
              "before = resource.getrlimit(resource.RLIMIT_NOFILE)[0]\n"
              "print(before, raise_open_files_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n")
    out = subprocess.run([sys.executable, "-c", script], preexec_fn=lower, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert [int(v) for v in out] == [low, hard, hard]

"""A real S3 endpoint on loopback: moto's server. MotoServer runs it in threads of this process and can take
it down and bring it back on the same port (moto keeps its buckets in the process); moto_process() runs it as
a child process (`python -m danube_fast.testing.moto PORT`), for the benchmarks, where threads here would
share the GIL with the code being timed.

MotoServer belongs to whoever created it, which must stop() it; moto_process() stops its child when the `with`
block ends. Credentials are moto's: any key works, "testing" by convention.
"""

from __future__ import annotations

import logging
import signal
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from danube_fast.testing.ports import LOOPBACK, free_port
from danube_fast.testing.process import ServerProcess

REGION = "us-east-1"
ACCESS_KEY = SECRET_KEY = "testing"
READY = "moto S3 ready"


def _threaded_server(port: int) -> Any:
    from moto.server import ThreadedMotoServer  # a test and bench dependency, not the broker's

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    return ThreadedMotoServer(ip_address=LOOPBACK, port=port, verbose=False)


class MotoServer:
    """A moto S3 server on a free loopback port that can be taken down and brought back on that port."""

    def __init__(self) -> None:
        self._server = _threaded_server(0)
        self._server.start()
        self.port: int = self._server.get_host_and_port()[1]
        self.running = True

    @property
    def endpoint(self) -> str:
        return endpoint(self.port)

    def stop(self) -> None:
        if self.running:
            self._server.stop()
            assert self._server._server is not None
            self._server._server.server_close()  # stop() leaves the socket listening: close the port
            self.running = False

    def start(self) -> None:
        if not self.running:
            self._server = _threaded_server(self.port)
            self._server.start()
            self.running = True

    def create_bucket(self) -> str:
        """A new bucket with a unique name."""
        name = f"tier-{uuid.uuid4().hex[:16]}"
        create_bucket(self.endpoint, name)
        return name


def endpoint(port: int) -> str:
    return f"http://{LOOPBACK}:{port}"


def create_bucket(endpoint: str, bucket: str) -> None:
    import boto3  # type: ignore[import-untyped]  # moto's dependency (test and bench), not the broker's

    client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                          aws_secret_access_key=SECRET_KEY)
    try:
        client.create_bucket(Bucket=bucket)
    finally:
        client.close()


@contextmanager
def moto_process(log_path: Path, *, die_with_parent: bool = True) -> Iterator[str]:
    """A moto S3 server subprocess on a free loopback port; yields its endpoint URL."""
    port = free_port()
    argv = [sys.executable, "-m", "danube_fast.testing.moto", str(port)]
    server = ServerProcess("moto S3 server", argv, log_path, ready_text=READY, port=port,
                           die_with_parent=die_with_parent)
    try:
        server.start()
        yield endpoint(port)
    finally:
        server.stop()


def _serve(port: int) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # for sigwait, every thread
    server = _threaded_server(port)
    server.start()
    print(f"{READY} on {LOOPBACK}:{port}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.stop()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m danube_fast.testing.moto PORT")
    _serve(int(sys.argv[1]))

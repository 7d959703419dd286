"""A real S3 endpoint on loopback for the tests: moto's ThreadedMotoServer, which the object-tier tests also
take down and bring back on the same port. Credentials are moto's: any key works, "testing" by convention."""

from __future__ import annotations

import logging
import uuid

import boto3
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
ACCESS_KEY = SECRET_KEY = "testing"


class MotoServer:
    """A moto S3 server on a free loopback port that can be taken down and brought back on that port."""

    def __init__(self) -> None:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        self.port = self._server.get_host_and_port()[1]
        self.running = True

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.running:
            self._server.stop()
            assert self._server._server is not None
            self._server._server.server_close()  # stop() leaves the socket listening: close the port
            self.running = False

    def start(self) -> None:
        if not self.running:
            self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
            self._server.start()
            self.running = True

    def create_bucket(self) -> str:
        name = f"tier-{uuid.uuid4().hex[:16]}"
        client = boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket=name)
        client.close()
        return name

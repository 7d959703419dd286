"""The cluster suite's servers: one etcd, one moto S3 server and N `danube-fast broker --mode cluster`
processes on free loopback ports, their data in a scratch directory, stopped when the `with` block ends
(error, Ctrl-C or SIGTERM included). Brokers and moto are children that get SIGKILL from the kernel if this
process dies without cleaning up (PR_SET_PDEATHSIG); etcd is danube_fast.meta.etcd_process's.

moto's ThreadedMotoServer runs in a child process of its own (`python -m bench.cluster_servers moto PORT`)
rather than in a thread here: in this process it would share the GIL with the producer and the uploader
being timed.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.peers.servers import _die_with_parent
from bench.process import BROKER_READY, REPO, ServerProcess, free_port, repo_env
from danube_fast.meta.etcd_process import EtcdServer, start_etcd

S3_REGION = "us-east-1"
S3_KEY = "testing"  # moto accepts any credentials
MOTO_READY = "moto S3 ready"
READY_TIMEOUT = 60.0  # a broker starting while two others run on two cores takes a few seconds

# The brokers' [cluster] settings besides the S3 ones: the unload drains what the uploader has not yet
# uploaded, so the upload interval bounds that work; automatic rebalancing is off (moves are ours alone).
CLUSTER_SETTINGS: dict[str, int | str] = {"upload_interval_ms": 1000, "rebalance_cooldown_ms": 86_400_000}


@dataclass
class Broker:
    process: ServerProcess
    port: int
    data_dir: Path
    broker_id: int = -1

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.target}"


@dataclass
class Cluster:
    etcd: EtcdServer
    s3_endpoint: str
    bucket: str
    brokers: list[Broker]

    def by_id(self, broker_id: int) -> Broker:
        return next(b for b in self.brokers if b.broker_id == broker_id)

    def log_tails(self) -> str:
        return "\n".join(f"----- broker {b.broker_id} ({b.process.log_path})\n{b.process.log_tail()}"
                         for b in self.brokers)


def cluster_toml(s3_endpoint: str) -> str:
    settings = {**CLUSTER_SETTINGS, "s3_endpoint": s3_endpoint, "s3_region": S3_REGION,
                "s3_access_key": S3_KEY, "s3_secret_key": S3_KEY}
    return "[cluster]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())


@contextmanager
def moto_server(scratch: Path) -> Iterator[str]:
    """A moto S3 server subprocess; yields its endpoint URL."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.cluster_servers", "moto", str(port)]
    server = ServerProcess("moto S3 server", argv, scratch / "moto.log", cwd=REPO, env=repo_env(),
                           preexec_fn=_die_with_parent)
    try:
        server.wait_ready(MOTO_READY)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def create_bucket(endpoint: str, bucket: str) -> None:
    import boto3  # type: ignore[import-untyped]  # moto's dependency (test and bench), not the broker's

    client = boto3.client("s3", endpoint_url=endpoint, region_name=S3_REGION, aws_access_key_id=S3_KEY,
                          aws_secret_access_key=S3_KEY)
    try:
        client.create_bucket(Bucket=bucket)
    finally:
        client.close()


@contextmanager
def running_cluster(scratch: Path, brokers: int = 3) -> Iterator[Cluster]:
    """etcd, moto with a bucket, and `brokers` brokers sharing both (object store s3://bucket/cluster)."""
    with ExitStack() as stack:
        etcd = start_etcd(scratch / "etcd" / "data", name="bench")
        stack.callback(etcd.stop)
        endpoint = stack.enter_context(moto_server(scratch))
        bucket = "bench-cluster"
        create_bucket(endpoint, bucket)
        config = scratch / "broker.toml"
        config.write_text(cluster_toml(endpoint))
        started: list[Broker] = []
        for i in range(brokers):
            broker = _start_broker(scratch / f"broker{i}", etcd.endpoint, f"s3://{bucket}/cluster", config)
            stack.callback(broker.process.stop)
            started.append(broker)
        for broker in started:
            broker.process.wait_ready(BROKER_READY, READY_TIMEOUT)
            broker.broker_id = int((broker.data_dir / "broker_id").read_text())
        yield Cluster(etcd, endpoint, bucket, started)


def _start_broker(workdir: Path, etcd_endpoint: str, object_store: str, config: Path) -> Broker:
    workdir.mkdir(parents=True)
    data_dir = workdir / "data"
    port, admin = free_port(), free_port()
    argv = [sys.executable, "-m", "danube_fast.cli.main", "broker", "--mode", "cluster",
            "--data-dir", str(data_dir), "--broker-addr", f"127.0.0.1:{port}",
            "--admin-addr", f"127.0.0.1:{admin}", "--prom-exporter", "",
            "--metadata-store", f"etcd://{etcd_endpoint}", "--object-store", object_store,
            "--config-file", str(config)]
    process = ServerProcess(f"broker in {workdir.name}", argv, workdir / "broker.log", cwd=REPO,
                            env=repo_env(), preexec_fn=_die_with_parent)
    return Broker(process, port, data_dir)


def _serve_moto(port: int) -> None:
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    print(f"{MOTO_READY} on 127.0.0.1:{port}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.stop()


if __name__ == "__main__":
    if sys.argv[1:2] != ["moto"] or len(sys.argv) != 3:
        sys.exit("usage: python -m bench.cluster_servers moto PORT")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # for sigwait, every thread
    _serve_moto(int(sys.argv[2]))

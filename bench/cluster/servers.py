"""The cluster suite's servers, from the harness (danube_fast/testing): one etcd, one moto S3 server and N
`danube-fast broker --mode cluster` processes on free loopback ports, their data in a scratch directory, all
stopped when the `with` block ends (error, Ctrl-C or SIGTERM included). Brokers and moto are children that get
SIGKILL from the kernel if this process dies without cleaning up (PR_SET_PDEATHSIG).

moto runs in a child process of its own rather than in a thread here: in this process it would share the GIL
with the producer and the uploader being timed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from danube_fast.testing import moto
from danube_fast.testing.broker import ClusterBroker
from danube_fast.testing.cluster import Cluster
from danube_fast.testing.etcd import EtcdServer, start_etcd

S3_REGION = moto.REGION
S3_KEY = moto.ACCESS_KEY  # moto accepts any credentials
READY_TIMEOUT = 60.0  # a broker starting while two others run on two cores takes a few seconds
BUCKET = "bench-cluster"

# The brokers' [cluster] settings besides the S3 ones: the unload drains what the uploader has not yet
# uploaded, so the upload interval bounds that work; automatic rebalancing is off (moves are ours alone).
CLUSTER_SETTINGS: dict[str, int | str] = {"upload_interval_ms": 1000, "rebalance_cooldown_ms": 86_400_000}


@dataclass
class RunningCluster:
    etcd: EtcdServer
    s3_endpoint: str
    bucket: str
    nodes: Cluster

    @property
    def brokers(self) -> list[ClusterBroker]:
        return self.nodes.brokers

    def log_tails(self) -> str:
        return self.nodes.logs()


@contextmanager
def running_cluster(scratch: Path, brokers: int = 3, settings: dict[str, int | str] | None = None,
                    native: bool = False) -> Iterator[RunningCluster]:
    """etcd, moto with a bucket, and `brokers` brokers sharing both (object store s3://bucket/cluster);
    `settings`: [cluster] settings over CLUSTER_SETTINGS; `native`: the brokers serve the native transport
    too (the fast clients then use it, and so do replicated topics' followers)."""
    with ExitStack() as stack:
        etcd = start_etcd(scratch / "etcd" / "data", name="bench")
        stack.callback(etcd.stop)
        endpoint = stack.enter_context(moto.moto_process(scratch / "moto.log"))
        moto.create_bucket(endpoint, BUCKET)
        chosen = {**CLUSTER_SETTINGS, **(settings or {}), "s3_endpoint": endpoint, "s3_region": S3_REGION,
                  "s3_access_key": S3_KEY, "s3_secret_key": S3_KEY}
        nodes = Cluster(scratch, f"etcd://{etcd.endpoint}", f"s3://{BUCKET}/cluster", chosen, metrics=False,
                        die_with_parent=True)
        nodes.native = native
        started = [nodes.add() for _ in range(brokers)]
        for broker in started:  # all start at once; then each must be ready
            stack.callback(broker.stop)
            broker.launch()
        for broker in started:
            broker.wait_ready(READY_TIMEOUT)
        yield RunningCluster(etcd, endpoint, BUCKET, nodes)

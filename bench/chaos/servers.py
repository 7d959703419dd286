"""The campaign's cluster: one etcd, one moto S3 server and three `danube-fast broker --mode cluster`
processes on loopback, with a fault-injecting proxy (danube_fast/testing/proxy.py) in front of each, and
one in front of each broker's native transport listener.

Everything reaches everything through the proxies: the brokers reach etcd and S3 through theirs, and each
broker advertises its proxies' addresses (client API and native transport), so clients (which find a
topic's broker by lookup; our fast clients then its native listener) reach brokers through them too. The
nemesis (nemesis.py) and the final read go around them where they must (the admin API, the checker's own
metadata reads).

ChaosCluster owns every process and proxy: the `with` block of chaos_cluster() stops them all.
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
from danube_fast.testing.proxy import Proxy

BUCKET = "chaos"
READY_TIMEOUT = 60.0  # a broker (re)starting while two others serve traffic on two cores takes seconds
LEASE_TTL_S = 3  # short, so that a paused or cut-off broker loses its topics within the campaign
STALL_DUMP_MS = 1500  # a broker loop stalled half the lease logs where (broker/stall_dump.py)

# Frequent uploads (so moves and restarts read from S3), short leases and reports; no automatic rebalancing
# (moves are the nemesis's alone); a follower that stops copying leaves the in-sync set within 2 s.
SETTINGS: dict[str, int | str] = {"lease_ttl_s": LEASE_TTL_S, "load_report_ms": 1000,
                                  "upload_interval_ms": 1000, "rebalance_cooldown_ms": 86_400_000,
                                  "assign_wait_ms": 5000, "replica_lag_ms": 2000, "replica_check_ms": 1000}


@dataclass
class Node:
    broker: ClusterBroker
    proxy: Proxy  # in front of its client API; its address is the one the broker advertises
    native_proxy: Proxy  # in front of its native transport listener (--fast-advertised-addr)

    @property
    def name(self) -> str:
        return f"broker{self.broker.broker_id}"


@dataclass
class ChaosCluster:
    etcd: EtcdServer
    etcd_proxy: Proxy
    s3_proxy: Proxy
    nodes: list[Node]
    cluster: Cluster

    @property
    def service_url(self) -> str:
        """Where clients start: the first broker, through its proxy."""
        return f"http://{self.nodes[0].proxy.target}"

    def proxies(self) -> dict[str, Proxy]:
        return {"etcd": self.etcd_proxy, "s3": self.s3_proxy, **{n.name: n.proxy for n in self.nodes},
                **{f"{n.name}-native": n.native_proxy for n in self.nodes}}

    def logs(self) -> str:
        return self.cluster.logs()


@contextmanager
def chaos_cluster(scratch: Path, brokers: int = 3) -> Iterator[ChaosCluster]:
    with ExitStack() as stack:
        etcd = start_etcd(scratch / "etcd" / "data", name="chaos")
        stack.callback(etcd.stop)
        etcd_proxy = stack.enter_context(Proxy(etcd.endpoint))
        s3_endpoint = stack.enter_context(moto.moto_process(scratch / "moto.log"))
        moto.create_bucket(s3_endpoint, BUCKET)
        s3_proxy = stack.enter_context(Proxy(s3_endpoint.removeprefix("http://")))
        settings = {**SETTINGS, "s3_endpoint": f"http://{s3_proxy.target}", "s3_region": moto.REGION,
                    "s3_access_key": moto.ACCESS_KEY, "s3_secret_key": moto.SECRET_KEY}
        cluster = Cluster(scratch, f"etcd://{etcd_proxy.target}", f"s3://{BUCKET}/chaos", settings,
                          die_with_parent=True)
        cluster.extra_config = f"[broker]\nstall_dump_ms = {STALL_DUMP_MS}\n"
        cluster.native = True  # the fast clients' traffic goes over the native transport (docs/TRANSPORT.md)
        nodes = []
        for _ in range(brokers):
            broker = cluster.add()
            proxy = stack.enter_context(Proxy(broker.target))
            native_proxy = stack.enter_context(Proxy(broker.fast_target))
            broker.flags += ["--advertised-addr", proxy.target, "--fast-advertised-addr", native_proxy.target]
            broker.env["PYTHONFAULTHANDLER"] = "1"  # a native crash leaves its Python stack in the log
            stack.callback(broker.stop)
            nodes.append(Node(broker, proxy, native_proxy))
        for node in nodes:  # all start at once; then each must be ready
            node.broker.launch()
        for node in nodes:
            node.broker.wait_ready(READY_TIMEOUT)
        yield ChaosCluster(etcd, etcd_proxy, s3_proxy, nodes, cluster)

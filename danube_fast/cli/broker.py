"""`danube-fast broker`: run the broker in the foreground until SIGTERM or SIGINT (exit 0 then)."""

from __future__ import annotations

import argparse
import logging
import sys

import uvloop

from danube_fast.allocator import keep_freed_memory
from danube_fast.broker import config as broker_config
from danube_fast.errors import DanubeError

DEFAULTS = broker_config.BrokerConfig()


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "broker", help="run the broker",
        description="Run the broker in the foreground. Flags override the config file, which overrides the "
                    "defaults. It logs one 'broker ready' line when it serves; SIGTERM stops it cleanly.")
    p.set_defaults(run=None, what="broker")
    p.add_argument("--mode", choices=("standalone", "cluster"), default=None,
                   help="standalone: embedded metadata store and WAL under the data dir (the default); "
                        "cluster: brokers sharing etcd (--metadata-store) and an object store")
    p.add_argument("--metadata-store", metavar="URL",
                   help="cluster mode: etcd://host:port[,host:port]; etcd://https://host:port for TLS "
                        "(the [cluster] etcd_* settings give its CA, certificate and user)")
    p.add_argument("--object-store", metavar="URL",
                   help="s3://bucket/prefix or a folder (default DATA_DIR/objects)")
    p.add_argument("--cluster-name", metavar="NAME", help="default danube")
    p.add_argument("--config-file", metavar="FILE", help="TOML settings (see danube_fast/broker/config.py)")
    p.add_argument("--data-dir", metavar="DIR", help=f"default {DEFAULTS.data_dir}")
    p.add_argument("--broker-addr", metavar="HOST:PORT", help=f"client API, default {DEFAULTS.broker_addr}")
    p.add_argument("--admin-addr", metavar="HOST:PORT", help=f"admin API, default {DEFAULTS.admin_addr}")
    p.add_argument("--prom-exporter", metavar="HOST:PORT",
                   help=f"Prometheus endpoint, default {DEFAULTS.prom_exporter}; '' turns it off")
    p.add_argument("--fast-addr", metavar="HOST:PORT",
                   help="the native transport's listener (docs/TRANSPORT.md); default: 127.0.0.1:6653 in "
                        "standalone mode (broker_addr's host), none in a cluster; '' turns it off")
    p.add_argument("--console-addr", metavar="HOST:PORT",
                   help="the web console (docs/CONSOLE.md); default: 127.0.0.1:9080 in standalone mode, none "
                        "in a cluster; '' turns it off")
    p.add_argument("--advertised-addr", metavar="HOST:PORT",
                   help="the address lookups return to clients (default: --broker-addr)")
    p.add_argument("--fast-advertised-addr", metavar="HOST:PORT",
                   help="the native transport's address told to clients (default: --advertised-addr's host "
                        "and --fast-addr's port)")
    p.add_argument("--admin-advertised-addr", metavar="HOST:PORT",
                   help="the admin port's address the other brokers of a cluster are told (default: "
                        "--admin-addr's host and bound port)")
    p.add_argument("--security-mode", choices=("none", "tls", "tls_jwt"), default=None,
                   help="[security] mode (default none; docs/SECURITY.md)")
    p.add_argument("--tls-cert", metavar="PEM", help="[security] cert_file: this broker's certificate chain")
    p.add_argument("--tls-key", metavar="PEM", help="[security] key_file")
    p.add_argument("--tls-ca", metavar="PEM", help="[security] ca_file: the CA of client certificates")
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = broker_config.load(args.config_file, {
            "mode": args.mode, "data_dir": args.data_dir, "broker_addr": args.broker_addr,
            "admin_addr": args.admin_addr, "prom_exporter": args.prom_exporter, "fast_addr": args.fast_addr,
            "console_addr": args.console_addr,
            "advertised_addr": args.advertised_addr, "fast_advertised_addr": args.fast_advertised_addr,
            "admin_advertised_addr": args.admin_advertised_addr,
            "cluster.metadata_store": args.metadata_store,
            "cluster.object_store": args.object_store, "cluster.name": args.cluster_name,
            "security.mode": args.security_mode, "security.cert_file": args.tls_cert,
            "security.key_file": args.tls_key, "security.ca_file": args.tls_ca})
    except broker_config.ConfigError as e:
        print(f"danube-fast broker: {e}", file=sys.stderr)
        return 2
    keep_freed_memory(config.malloc_keep_bytes)  # before the servers allocate their first buffers
    # Here, not at the top: every other `danube-fast` command would pay for importing the whole broker.
    from danube_fast.broker.server import StartError, serve

    try:
        uvloop.run(serve(config))
    except (StartError, DanubeError, OSError) as e:
        print(f"danube-fast broker: cannot start: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0

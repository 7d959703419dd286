"""`python -m bench.peers [--json] [--records N] [--size S ...] [--quick] ...`: the end-to-end workload
against NATS JetStream, Redis Streams and RabbitMQ Streams (see bench/README.md, "Peers").

Results go to stdout (a table, or one JSON object per figure with --json, the keys of every bench suite);
progress, versions and the durability of each configuration go to stderr."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from types import FrameType

from bench.common import Options, print_json_lines, print_table, progress
from bench.peers import suite
from bench.peers.workload import Workload


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    defaults = Workload()
    p = argparse.ArgumentParser(prog="python -m bench.peers",
                                description="the end-to-end workload against NATS JetStream, Redis and "
                                            "RabbitMQ Streams")
    p.add_argument("--json", action="store_true", help="one JSON object per figure on stdout")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke run: {suite.QUICK_RECORDS:,} records and {suite.QUICK_RUNS} run unless "
                        f"--records / --runs say otherwise")
    p.add_argument("--records", type=_positive_int,
                   help=f"records per phase (default {suite.RECORDS:,}; quick {suite.QUICK_RECORDS:,})")
    p.add_argument("--size", type=_positive_int, nargs="+", default=[defaults.size],
                   help=f"record size(s) in bytes (default {defaults.size})")
    p.add_argument("--producers", type=_positive_int, default=defaults.producers)
    p.add_argument("--consumers", type=_positive_int, default=defaults.consumers)
    p.add_argument("--window", type=_positive_int, default=defaults.window,
                   help=f"records a producer may have unacknowledged (default {defaults.window})")
    p.add_argument("--batch", type=_positive_int, default=defaults.batch,
                   help=f"records per pipeline, read and cumulative ack (default {defaults.batch})")
    p.add_argument("--e2e-rate", type=_positive_float,
                   help="records/s the producers offer in the e2e phase (default: half the produce rate)")
    p.add_argument("--runs", type=_positive_int,
                   help=f"runs per figure; figures are medians (default {suite.RUNS}; "
                        f"quick {suite.QUICK_RUNS})")
    p.add_argument("--peers", nargs="+", choices=suite.CONFIG_NAMES, default=list(suite.CONFIG_NAMES),
                   help="the configurations to run (default: all)")
    p.add_argument("--dir", default="/tmp",
                   help="where to create the scratch directory for the servers' data (removed after)")
    return p


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the `with` blocks that stop the servers


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if not os.path.isdir(args.dir):
        _parser().error(f"--dir {args.dir!r} is not a directory")
    records = args.records or (suite.QUICK_RECORDS if args.quick else suite.RECORDS)
    runs = args.runs or (suite.QUICK_RUNS if args.quick else suite.RUNS)
    workloads = [Workload(size=size, records=records, producers=args.producers, consumers=args.consumers,
                          window=args.window, batch=args.batch, e2e_rate=args.e2e_rate) for size in args.size]
    if args.consumers != 1 and "rabbitmq_streams" in args.peers:
        _parser().error("rabbitmq_streams runs with one consumer (a stream's consumers each read every "
                        "record): name the other --peers")
    configs = tuple(c for c in suite.CONFIGS if c.name in args.peers)
    signal.signal(signal.SIGTERM, _terminate)
    progress(f"peers: {suite.versions()}")
    progress(f"workload: {records:,} records of {', '.join(map(str, args.size))} B, "
             f"{args.producers} producer(s), {args.consumers} consumer(s), window {args.window}, "
             f"batch {args.batch}; {runs} run(s); "
             f"load average {os.getloadavg()[0]:.2f}")
    for line in suite.durability_lines(configs):
        progress(f"durability: {line}")
    found = suite.run_peers(workloads, Options(runs, args.quick, os.path.abspath(args.dir)), configs)
    if args.json:
        print_json_lines(found)
    else:
        for line in suite.durability_lines(configs):
            print(line)
        print(f"runs: {runs}{' (quick)' if args.quick else ''}\n")
        print_table(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench storage|meta|broker|fast|sendfile|security|subscriptions|delayed|console|spark|tables|e2e|
cluster|replication|topics|chaos [--json]
[--runs N] [--quick] [--dir DIR] [--write-results]`.

Results go to stdout (a table, or one JSON object per line with --json; e2e: tables, or one JSON object);
progress and machine facts go to stderr, so `--json` output can be piped as is."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
from datetime import UTC, datetime
from types import FrameType

from bench import results
from bench.common import (
    CLIENT_KEEP_BYTES,
    Options,
    ProgressBar,
    Result,
    describe_machine,
    disk_description,
    machine_info,
    print_json_lines,
    print_table,
    progress,
)
from danube_fast.allocator import keep_freed_memory


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description="danube_fast benchmarks")
    suites = parser.add_subparsers(dest="suite", required=True)
    st = suites.add_parser("storage", help="WAL append against plain writes, codec, CRC, index, reads")
    _common_options(st, "Storage", "64 MiB per disk run and 0.2 s per CPU run instead of 512 MiB and 1 s")
    me = suites.add_parser("meta", help="LocalCache reads; EmbeddedStore and EtcdStore puts and transactions "
                                        "(EtcdStore against raw aetcd calls)")
    _common_options(me, "Metadata", "0.25 s per figure and run instead of 2 s")
    br = suites.add_parser("broker", help="the official client producing and consuming through the broker "
                                          "(reliable and non-reliable) against a bare grpc.aio server")
    _common_options(br, BROKER_SECTION, "a fifth of the messages per figure, and 1 run unless --runs says "
                                        "otherwise", default_runs=None)
    fa = suites.add_parser("fast", help="our fast API's produce stream through the broker against a bare "
                                        "grpc.aio server answering the same stream")
    _common_options(fa, FAST_SECTION, "200 batches per figure instead of 1,000, and 1 run unless --runs says "
                                      "otherwise", default_runs=None)
    sf = suites.add_parser("sendfile", help="a consumer catching up from segment files over the native "
                                            "transport: sendfile() against read-and-write, same run")
    _common_options(sf, SENDFILE_SECTION, "50 batches instead of 2,000, and 1 run unless --runs says "
                                          "otherwise", default_runs=None)
    se = suites.add_parser("security", help="the cost of mode = tls_jwt (TLS, tokens, RBAC) against mode = "
                                             "none, same run: the official client and our fast producer")
    _common_options(se, SECURITY_SECTION, "a fifth of the messages and batches, and 1 run unless --runs says "
                                          "otherwise", default_runs=None)
    su = suites.add_parser("subscriptions", help="seek by time and by offset, peek and skip on a large topic "
                                                 "(docs/SUBSCRIPTIONS.md)")
    _common_options(su, SUBSCRIPTIONS_SECTION, f"{subscriptions_records(True):,} records instead of "
                                               f"{subscriptions_records(False):,}, and 1 run unless --runs "
                                               "says otherwise", default_runs=None)
    de = suites.add_parser("delayed", help="delayed delivery: memory per waiting record, the rate of records "
                           "due at once against a backlog's, the dispatcher's check")
    _common_options(de, DELAYED_SECTION, "20,000 waiting and 2,000 due instead of 1,000,000 and 50,000, "
                    "and 1 run unless --runs says otherwise", default_runs=None)
    co = suites.add_parser("console", help="the web console in headless Chromium with 1,000 topics: time to "
                           "a rendered page, and produce and consume with the console open against closed")
    _common_options(co, CONSOLE_SECTION, "100 topics, 20 subscriptions, 2 opens per page and 0.5 s of "
                    "produce instead of 1,000, 100, 5 and 4 s, and 1 run unless --runs says otherwise",
                    default_runs=None)
    sp = suites.add_parser("spark", help="our Spark data source against Spark's Parquet scan of the same "
                                         "records and the codec alone: full scan, offset and time pruning")
    _common_options(sp, SPARK_SECTION, f"{QUICK_SPARK_RECORDS:,} records instead of {SPARK_RECORDS:,}, and "
                                       "1 run unless --runs says otherwise", default_runs=None)
    sp.add_argument("--records", type=_positive_int, help=f"records to produce (default {SPARK_RECORDS:,})")
    rp = suites.add_parser("replication", help="replicated topics (docs/REPLICATION.md) on 3 brokers: "
                           "produce throughput and ack latency with 1, 2 and 3 copies, and unavailability "
                           "when an owner is killed")
    _common_options(rp, REPLICATION_SECTION, "200 batches per factor, 2 s paced and one kill instead of "
                    "2,000, 8 s and 3, and 1 run unless --runs says otherwise", default_runs=None)
    ta = suites.add_parser("tables", help="what writing topic tables costs the broker (publish-ack p99, CPU "
                                          "per MB) and how fresh they are, against no tables in the same run")
    _common_options(ta, TABLES_SECTION, "200 batches instead of 10,000, and 1 run unless --runs says "
                                        "otherwise", default_runs=None)
    _e2e_options(suites.add_parser(
        "e2e", help="the same workload against our broker, NATS JetStream, Redis Streams and RabbitMQ "
                    "Streams: throughput, latency at a fixed rate, CPU per side, throughput by record size"))
    _topics_options(suites.add_parser(
        "topics", help="one broker as Reliable topics grow to 10,000: its threads, RSS and topic creation "
                       "rate"))
    _cluster_options(suites.add_parser(
        "cluster", help="three brokers in cluster mode on etcd and moto S3: producer-visible unavailability "
                        "per topic move (ours and the official client), the uploader against raw S3 puts"))
    from bench import chaos

    chaos.add_options(suites.add_parser(
        "chaos", help="randomized fault campaigns on a 3-broker cluster, checked against the clients' "
                      "history (lost, duplicated, inconsistent, skipped messages)"))
    return parser


def _cluster_options(parser: argparse.ArgumentParser) -> None:
    from bench import cluster

    quick = (f"{cluster.QUICK_MOVES} moves, {cluster.QUICK_OFFICIAL_MOVES} of the official client, "
             f"{cluster.QUICK_UPLOAD_MIB} MiB, 1 run")
    _common_options(parser, cluster.TITLE, quick, default_runs=None, json_help="one JSON object on stdout")
    parser.add_argument("--moves", type=_positive_int, help=f"moves of our producer's topic (default "
                                                            f"{cluster.MOVES})")
    parser.add_argument("--official-moves", type=int, help=f"moves under the official client (default "
                                                           f"{cluster.OFFICIAL_MOVES}; 0: none)")
    parser.add_argument("--upload-mib", type=_positive_int, help=f"MiB the uploader drains (default "
                                                                 f"{cluster.UPLOAD_MIB})")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="records/s our producer is paced at (default 0: as fast as acks come back)")


def _topics_options(parser: argparse.ArgumentParser) -> None:
    from bench import topics

    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--quick", action="store_true",
                        help=f"{topics.QUICK_TOPICS} topics in steps of {topics.QUICK_STEP}")
    parser.add_argument("--topics", type=_positive_int, help=f"topics to create (default {topics.TOPICS:,})")
    parser.add_argument("--step", type=_positive_int, help=f"topics per sample (default {topics.STEP})")
    parser.add_argument("--plot", help="also draw threads, RSS and creation rate against topics to this PNG")
    parser.add_argument("--aggregate-rounds", type=int,
                        help=f"rounds of Reliable produce on {topics.AGGREGATE_TOPICS:,} topics at once "
                             f"against one topic (default {topics.AGGREGATE_ROUNDS}; 0: skip)")
    parser.add_argument("--aggregate-topics", type=_positive_int,
                        help=f"topics of that phase (default {topics.AGGREGATE_TOPICS:,})")
    parser.add_argument("--aggregate-seconds", type=_positive_float,
                        help=f"seconds per figure of that phase (default {topics.AGGREGATE_SECONDS})")
    parser.add_argument("--dir", default="/tmp", help="where to create the scratch directory (removed after)")
    parser.add_argument("--write-results", action="store_true",
                        help=f"also rewrite the {topics.TITLE} section of bench/RESULTS.md from this run")


def subscriptions_records(quick: bool) -> int:
    from bench import subscriptions

    return subscriptions.QUICK_RECORDS if quick else subscriptions.RECORDS


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {value}")
    return value


def _e2e_options(parser: argparse.ArgumentParser) -> None:
    from bench import e2e  # its defaults; the peers and their clients are imported only when it runs

    _common_options(parser, "end-to-end", f"{e2e.QUICK_RECORDS:,} records and {e2e.QUICK_RUNS} run unless "
                                          "--records / --runs say otherwise", default_runs=None,
                    json_help="one JSON object on stdout, no progress bar")
    parser.add_argument("--size", type=_positive_int, default=256, help="bytes per record (default 256)")
    parser.add_argument("--records", type=_positive_int,
                        help=f"N, records per phase (default {e2e.RECORDS:,}; quick {e2e.QUICK_RECORDS:,})")
    parser.add_argument("--producers", type=_positive_int, default=1)
    parser.add_argument("--consumers", type=_positive_int, default=1)
    parser.add_argument("--sizes", type=_positive_int, nargs="*", default=list(e2e.SIZES),
                        help="record sizes of the throughput sweep (default: %(default)s; none: no sweep); "
                             f"at most {e2e.SWEEP_BYTES >> 20} MiB of records a size ("
                             f"--quick: {e2e.QUICK_SWEEP_BYTES >> 20} MiB)")
    parser.add_argument("--systems", nargs="+", choices=e2e.SYSTEMS,
                        help="systems to run (default: every one installed; a named one must be)")
    parser.add_argument("--linger-ms", type=float, default=e2e.LINGER_MS,
                        help="ours at the fixed rate: a batch ships this long after its first record, if not "
                             "full before (default %(default)s)")
    parser.add_argument("--e2e-rate", type=_positive_float,
                        help="records/s of the fixed-rate phase (default: half each system's produce rate)")
    parser.add_argument("--broker-config", metavar="FILE",
                        help="start our broker with this TOML config file (danube-fast broker --config-file; "
                             "the bench's mode, data dir, address and metrics flags override it); the "
                             "results name it and what it sets")


FAST_SECTION = "Fast API"
SENDFILE_SECTION = "Sendfile"
SPARK_SECTION = "Spark"
SECURITY_SECTION = "Security"
SUBSCRIPTIONS_SECTION = "Subscription operations"
DELAYED_SECTION = "Delayed delivery"
CONSOLE_SECTION = "Console"
TABLES_SECTION = "Topic tables"
REPLICATION_SECTION = "Replication"
SPARK_RECORDS = 8_000_000  # bench/spark.py RECORDS, here so that --help needs no pyspark
QUICK_SPARK_RECORDS = 400_000
BROKER_SECTION = "Broker (Danube API)"
BROKER_RUNS = 3  # the broker suite's default --runs (1 with --quick)


def _common_options(parser: argparse.ArgumentParser, section: str, quick_help: str,
                    default_runs: int | None = 5, json_help: str = "one JSON object per result on stdout"
                    ) -> None:
    parser.add_argument("--json", action="store_true", help=json_help)
    runs_help = "runs per figure; figures are medians" + (
        "" if default_runs else f" (default {BROKER_RUNS}, or 1 with --quick)")
    parser.add_argument("--runs", type=_positive_int, default=default_runs, help=runs_help)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--dir", default="/tmp",
                        help="where to create the scratch directory (removed after); its file system is "
                             "measured")
    parser.add_argument("--write-results", action="store_true",
                        help=f"also rewrite the {section} section of bench/RESULTS.md from this run")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if not os.path.isdir(args.dir):
        _parser().error(f"--dir {args.dir!r} is not a directory")
    # The clients of every system run in this process and move large buffers: the broker's own setting
    # (danube_fast/allocator.py), named in every section's machine line.
    keep_freed_memory(CLIENT_KEEP_BYTES)
    if args.suite == "e2e":
        return _e2e(args, argv)
    if args.suite == "topics":
        from bench import topics

        return topics.main(args, argv)
    if args.suite == "chaos":
        from bench import chaos

        signal.signal(signal.SIGTERM, _terminate)
        return chaos.main(args, argv)
    if args.suite == "cluster":
        from bench import cluster

        signal.signal(signal.SIGTERM, _terminate)
        return cluster.main(args, argv)
    if args.runs is None:
        args.runs = 1 if args.quick else BROKER_RUNS
    info = machine_info(os.path.abspath(args.dir))
    progress(f"machine: {describe_machine(info)}; load average {info['load_average_1m']}")
    extra: list[str] = []  # lines the RESULTS.md section adds after the machine line
    runs_note = results.RUNS_NOTE
    if args.suite == "storage":
        from bench.micro import storage

        title = "Storage"
        warning = storage.check_native()
        if warning:
            progress(f"WARNING: {warning}")
        found: list[Result] = storage.run_storage(Options(args.runs, args.quick, args.dir))
    elif args.suite == "broker":
        from bench import broker  # here: only this suite needs danube-client

        title = BROKER_SECTION
        extra.append(broker.load_line())
        runs_note = broker.RUNS_NOTE
        found = broker.run_broker(Options(args.runs, args.quick, args.dir))
    elif args.suite == "fast":
        from bench import fast

        title = FAST_SECTION
        extra.append(fast.load_line())
        found = fast.run_fast(Options(args.runs, args.quick, args.dir))
    elif args.suite == "security":
        from bench import security

        title = SECURITY_SECTION
        extra.append(security.load_line())
        found = security.run_security(Options(args.runs, args.quick, args.dir))
    elif args.suite == "subscriptions":
        from bench import subscriptions

        title = SUBSCRIPTIONS_SECTION
        extra.append(subscriptions.load_line(subscriptions_records(args.quick)))
        found = subscriptions.run_subscriptions(Options(args.runs, args.quick, args.dir))
    elif args.suite == "delayed":
        from bench import delayed

        title = DELAYED_SECTION
        extra.append(delayed.load_line(delayed.QUICK_PENDING if args.quick else delayed.PENDING,
                                       delayed.QUICK_DUE if args.quick else delayed.DUE))
        found = delayed.run_delayed(Options(args.runs, args.quick, args.dir))
    elif args.suite == "console":
        from bench import console  # here: only this suite needs Selenium and Chromium

        title = CONSOLE_SECTION
        extra.append(console.load_line(args.quick))
        runs_note = console.RUNS_NOTE
        found = console.run_console(Options(args.runs, args.quick, args.dir))
    elif args.suite == "spark":
        from bench import spark  # here: only this suite needs pyspark and a JVM

        title = SPARK_SECTION
        records = args.records or (QUICK_SPARK_RECORDS if args.quick else SPARK_RECORDS)
        extra.append(spark.load_line(records))
        found = spark.run_spark(Options(args.runs, args.quick, args.dir), records)
    elif args.suite == "replication":
        from bench import replication

        title = REPLICATION_SECTION
        extra.append(replication.load_line(args.quick))
        found = replication.run_replication(Options(args.runs, args.quick, args.dir))
    elif args.suite == "sendfile":
        from bench import sendfile

        title = SENDFILE_SECTION
        extra.append(sendfile.load_line(sendfile.QUICK_COUNT if args.quick else sendfile.COUNT))
        found = sendfile.run_sendfile(Options(args.runs, args.quick, args.dir))
    elif args.suite == "tables":
        from bench import tables

        title = TABLES_SECTION
        extra.append(tables.load_line(tables.QUICK_COUNT if args.quick else tables.COUNT))
        found = tables.run_tables(Options(args.runs, args.quick, args.dir))
    else:
        from bench.micro import meta  # here: the storage suite needs neither gRPC nor an etcd binary

        title = "Metadata"
        found, etcd_version = meta.run_meta(Options(args.runs, args.quick, args.dir))
        extra.append(meta.etcd_version_line(etcd_version))
    if args.json:
        print_json_lines(found)
    else:
        print(f"machine: {describe_machine(info)}")
        for line in extra:
            print(line.removeprefix("- "))
        print(f"runs: {args.runs}{' (quick)' if args.quick else ''}\n")
        print_table(found)
    if args.write_results:
        command = shlex.join(["python", "-m", "bench", *argv])
        date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        section = results.render_section(title, found, info, command, date, args.runs, args.quick, runs_note)
        if extra:
            head, machine_line, rest = section.partition("\n- Date: ")
            section = head + "\n" + "\n".join(extra) + machine_line + rest
        results.write_section(title, section)
        progress(f"wrote the {title} section of {results.RESULTS_PATH}")
    return 0


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the `with` blocks that stop the servers


def _e2e(args: argparse.Namespace, argv: list[str]) -> int:
    from bench import e2e
    from bench.e2e import report as e2e_report

    try:
        broker = None if args.broker_config is None else e2e.BrokerFile.read(args.broker_config)
    except ValueError as e:
        _parser().error(f"--broker-config {args.broker_config}: {e}")
    settings = e2e.Settings(
        size=args.size, records=args.records or (e2e.QUICK_RECORDS if args.quick else e2e.RECORDS),
        producers=args.producers, consumers=args.consumers, sizes=tuple(args.sizes),
        runs=args.runs or (e2e.QUICK_RUNS if args.quick else e2e.RUNS), quick=args.quick,
        systems=tuple(args.systems or e2e.SYSTEMS), linger_ms=args.linger_ms, e2e_rate=args.e2e_rate,
        parent_dir=os.path.abspath(args.dir), broker_config=broker)
    signal.signal(signal.SIGTERM, _terminate)
    info = machine_info(settings.parent_dir)
    disk = disk_description(settings.parent_dir)
    progress(f"machine: {describe_machine(info)}; disk {disk}; load average {info['load_average_1m']}")
    steps = settings.runs * len(settings.workloads()) * len(e2e.select(settings, bool(args.systems))[0])
    bar = None if args.json else ProgressBar(steps)
    try:
        report = e2e.run_e2e(settings, bar, explicit=bool(args.systems))
    finally:
        if bar is not None:
            bar.close()
    for name, why in report.skipped.items():
        progress(f"WARNING: {name} not run: {why}")
    versions = e2e.versions(report)
    if args.json:
        print(json.dumps(e2e_report.as_json(report, {**info, "disk": disk}, versions), ensure_ascii=False))
    else:
        print(f"machine: {describe_machine(info)}\ndisk: {disk}\nservers and clients: {versions}")
        if (broker_text := e2e_report.broker_config_text(report)) is not None:
            print(f"our broker's config file: {broker_text}")
        for label, durability, batching in e2e_report.described(report):
            print(f"{label}: {durability}\n    batching: {batching}")
        for table in e2e_report.tables(report):
            print("", *table.lines(markdown=False), sep="\n")
    if args.write_results:
        command = shlex.join(["python", "-m", "bench", *argv])
        date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        note = f"{info['cpu']}, {info['usable_cores']} cores, {date}, commit {info['git_commit']}"
        plots = e2e_report.plot(report, note=note)
        section = e2e_report.section(report, info, command, date, versions, disk, plots)
        results.write_section(e2e_report.TITLE, section)
        progress(f"wrote the {e2e_report.TITLE} section of {results.RESULTS_PATH} and {len(plots)} plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench storage|meta|broker|fast [--json] [--runs N] [--quick] [--dir DIR] [--write-results]`.

Results go to stdout (a table, or one JSON object per line with --json); progress and machine facts go to
stderr, so `--json` output can be piped as is."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from datetime import UTC, datetime

from bench import results, storage
from bench.common import (
    Options,
    Result,
    describe_machine,
    machine_info,
    print_json_lines,
    print_table,
    progress,
)


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
    return parser


FAST_SECTION = "Fast API"
BROKER_SECTION = "Broker (Danube API)"
BROKER_RUNS = 3  # the broker suite's default --runs (1 with --quick)


def _common_options(parser: argparse.ArgumentParser, section: str, quick_help: str,
                    default_runs: int | None = 5) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object per result on stdout")
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
    if args.runs is None:
        args.runs = 1 if args.quick else BROKER_RUNS
    info = machine_info(os.path.abspath(args.dir))
    progress(f"machine: {describe_machine(info)}; load average {info['load_average_1m']}")
    extra: list[str] = []  # lines the RESULTS.md section adds after the machine line
    runs_note = results.RUNS_NOTE
    if args.suite == "storage":
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
    else:
        from bench import meta  # here: the storage suite needs neither gRPC nor an etcd binary

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


if __name__ == "__main__":
    sys.exit(main())

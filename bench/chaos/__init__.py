"""`python -m bench chaos`: randomized fault campaigns against a 3-broker cluster, checked against the full
history of what the clients were told (docs/CHAOS.md).

Each seed is one campaign (campaign.py): its faults come from the seed (printed, replayable with --seeds),
its history is saved next to the report, and `--check FILE` runs the checker again over a saved history.
Exit status 1 when a campaign is not valid.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from bench import results
from bench.common import describe_machine, machine_info, progress

TITLE = "Chaos"
SECONDS = 300.0
QUICK_SECONDS = 60.0
SEEDS = (1, 2, 3)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS),
                        help="one campaign per seed (default: %(default)s)")
    parser.add_argument("--seconds", type=float,
                        help=f"seconds of faults per campaign (default {SECONDS:.0f}; --quick "
                             f"{QUICK_SECONDS:.0f})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SECONDS:.0f} s per campaign")
    parser.add_argument("--json", action="store_true", help="one JSON object per campaign on stdout")
    parser.add_argument("--dir", default="/tmp", help="where to create the scratch directory (removed after)")
    parser.add_argument("--out", default=".", help="where the histories and plots go (default: here)")
    parser.add_argument("--plot", action="store_true", help="also draw throughput and faults per campaign")
    parser.add_argument("--replication-factor", type=int, default=2, metavar="N",
                        help="copies of every topic (docs/REPLICATION.md; default %(default)s, with "
                             "minInSyncReplicas 2); with more than 1 the nemesis also wipes brokers")
    parser.add_argument("--wipes", action=argparse.BooleanOptionalAction, default=None,
                        help="wipe brokers (kill -9, data directory deleted, started empty); default: when "
                             "replicated. With --replication-factor 1 it shows the loss window")
    parser.add_argument("--check", metavar="HISTORY", help="only run the checker over a saved history")
    parser.add_argument("--write-results", action="store_true",
                        help=f"also rewrite the {TITLE} section of bench/RESULTS.md from this run")


def main(args: argparse.Namespace, argv: list[str]) -> int:
    from bench.chaos import checker, report, workload
    from bench.chaos.campaign import run
    from bench.chaos.history import History

    if args.check:
        verdict = checker.check(History.read(Path(args.check)), workload.subscriptions())
        print(json.dumps({"valid": verdict.valid, **vars(verdict)}, indent=1))
        return 0 if verdict.valid else 1
    seconds = args.seconds or (QUICK_SECONDS if args.quick else SECONDS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = machine_info(args.dir)
    progress(f"machine: {describe_machine(info)}; load average {info['load_average_1m']}")
    outcomes = []
    for seed in args.seeds:
        progress(f"seed {seed}: {seconds:.0f} s of faults")
        scratch = Path(tempfile.mkdtemp(prefix=f"bench-chaos-{seed}-", dir=args.dir))
        try:
            outcome, history = run(scratch, seed, seconds, out, args.replication_factor, args.wipes)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        outcomes.append(outcome)
        if args.plot:
            path = out / f"chaos-{seed}.png"
            report.plot(history, path)
            progress(f"plot: {path}")
        if args.json:
            print(json.dumps(report.as_json(outcome)), flush=True)
        progress(f"seed {seed}: {'valid' if outcome.valid else 'NOT VALID'}")
    if not args.json:
        print(f"machine: {describe_machine(info)}\n")
        print(report.text(outcomes))
    if args.write_results:
        command = shlex.join(["python", "-m", "bench", *argv])
        date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        results.write_section(TITLE, report.section(outcomes, info, command, date, TITLE))
        progress(f"wrote the {TITLE} section of {results.RESULTS_PATH}")
    return 0 if all(o.valid for o in outcomes) else 1

"""The campaign's report: a table per run and over runs, JSON, the RESULTS.md section, and a plot of
throughput (acknowledged sends and reads per second) with the faults drawn over it."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from bench import results
from bench.chaos.campaign import RECOVERY_TARGET, Outcome
from bench.chaos.history import History

CLASSES = ("lost", "unseen", "inconsistent", "unexpected", "poll_skips", "unexpected_duplicates")
TARGET_FAULTS = 100  # per 5-minute campaign (the bar)


def as_json(o: Outcome) -> dict[str, object]:
    out = asdict(o)
    out["valid"] = o.valid
    out["verdict"]["valid"] = o.verdict.valid
    return out


def rows(outcomes: list[Outcome]) -> list[tuple[str, ...]]:
    """One row per campaign: seed, faults, sends, reads, the classes, recovery, valid."""
    table = []
    for o in outcomes:
        v = o.verdict
        recovery = max(o.recovery.values()) if o.recovery else float("inf")
        table.append((str(o.seed), f"{o.seconds:.0f}", str(o.replication), str(o.faults), f"{v.acked:,}",
                      f"{v.unknown:,}", f"{v.recovered:,}", f"{v.reads:,}",
                      *(f"{getattr(v, c):,}" for c in CLASSES), f"{v.redelivered:,}",
                      ", ".join(f"{p} {n}" for p, n in sorted(v.stored_twice.items())) or "0",
                      f"{v.rewinds:,}", str(o.watchdog_restarts), f"{o.drain_seconds:.0f}", f"{recovery:.1f}",
                      str(len(o.errors)), "yes" if o.valid else "NO"))
    return table


COLUMNS = ("seed", "seconds", "copies", "faults", "acked", "unknown", "recovered", "reads", "lost", "unseen",
           "inconsistent", "unexpected", "poll-skips", "unexpected dup.", "redelivered", "stored twice",
           "rewinds", "watchdog", "final read s", "recovery s", "errors", "valid")


def text(outcomes: list[Outcome]) -> str:
    lines = []
    for o in outcomes:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(o.fault_kinds.items()))
        lines.append(f"seed {o.seed}: {o.faults} faults ({kinds}); history {o.history_path}, brokers' logs "
                     f"{o.logs_path}")
        for kind, examples in o.verdict.examples.items():
            lines += [f"  {kind}: {e}" for e in examples]
        lines += [f"  error: {e[-1500:]}" for e in o.errors]
        if o.open_failures:
            lines.append(f"  clients that failed to open: {o.open_failures}, the last at {o.last_open_error}")
        if o.tracebacks:
            lines.append(f"  tracebacks in the brokers' logs: {o.tracebacks}")
        lines.append(f"  native transport connections (our fast clients): {o.native_connections}")
    header = "| " + " | ".join(COLUMNS) + " |"
    lines += ["", header, "|" + "---:|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(outcomes)]
    return "\n".join(lines)


def section(outcomes: list[Outcome], info: dict[str, object], command: str, date: str, title: str) -> str:
    faults = sum(o.faults for o in outcomes)
    recovery = max((max(o.recovery.values()) for o in outcomes if o.recovery), default=float("inf"))
    runs = f"{len(outcomes)} campaign(s), one per seed"
    lines = results.head_lines(title, info, command, date, runs, False)
    lines += [
        "- Cluster: 3 brokers (`--mode cluster`), one etcd, moto S3; a fault-injecting proxy in front of "
        "each broker, etcd and S3, and in front of each broker's native transport listener. Topics: 2 "
        "Reliable topics and one of 2 partitions; producers: ours over the native transport (batches of 5, "
        "4 in flight) and the official client; subscriptions: Exclusive, Failover, Shared (official "
        "client) and ours over the native transport (bench/chaos/workload.py). Checker: "
        "bench/chaos/checker.py, docs/CHAOS.md. `copies`: each topic's replicationFactor "
        "(minInSyncReplicas 2 when above 1; docs/REPLICATION.md); with copies the nemesis also wipes "
        "brokers (kill -9, data directory deleted)",
        "",
        "| figure | value | target | met? |",
        "|:---|---:|:---|:---:|",
    ]
    for label, value in (
            ("lost + unseen", sum(o.verdict.lost + o.verdict.unseen for o in outcomes)),
            ("inconsistent offsets", sum(o.verdict.inconsistent for o in outcomes)),
            ("poll-skips", sum(o.verdict.poll_skips for o in outcomes)),
            ("unexpected duplicates", sum(o.verdict.unexpected_duplicates for o in outcomes))):
        lines.append(f"| {label} | {value:,} | 0 | {'yes' if value == 0 else 'NO'} |")
    wanted = round(sum(TARGET_FAULTS * o.seconds / 300 for o in outcomes))
    lines.append(f"| faults in total | {faults} | >= {wanted} (100 per 5 min) | "
                 f"{'yes' if faults >= wanted else 'NO'} |")
    lines.append(f"| slowest recovery after the last heal (s) | {recovery:.1f} | <= {RECOVERY_TARGET:.0f} | "
                 f"{'yes' if recovery <= RECOVERY_TARGET else 'NO'} |")
    twice: dict[str, int] = {}
    for o in outcomes:
        for p, n in o.verdict.stored_twice.items():
            twice[p] = twice.get(p, 0) + n
    fast = sum(n for p, n in twice.items() if p.startswith("f"))
    lines.append(f"| messages stored twice by our (idempotent) producer | {fast:,} | 0 | "
                 f"{'yes' if fast == 0 else 'NO'} |")
    lines += ["", text(outcomes).split("\n\n", 1)[-1].strip()]
    return "\n".join(lines) + "\n"


def plot(history: History, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = max([s.completed for s in history.sends] + [r.at for r in history.receives] + [1.0])
    seconds = int(end) + 1
    acked = [0] * seconds
    reads = [0] * seconds
    for s in history.sends:
        if s.outcome == "ok":
            acked[int(s.completed)] += 1
    for r in history.receives:
        reads[int(r.at)] += 1
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.plot(range(seconds), acked, label="acknowledged sends/s", linewidth=1)
    ax.plot(range(seconds), reads, label="reads/s (all subscriptions)", linewidth=1, alpha=0.7)
    kinds = sorted({f.kind for f in history.faults})
    colours = {k: plt.get_cmap("tab20")(i % 20) for i, k in enumerate(kinds)}
    top = max(reads + acked + [1])
    for i, f in enumerate(history.faults):
        healed = f.healed if f.healed is not None else end
        y = top * (1.02 + 0.03 * (i % 4))
        ax.plot([f.started, max(healed, f.started + 0.3)], [y, y], color=colours[f.kind], linewidth=4,
                solid_capstyle="butt")
    for k in kinds:
        ax.plot([], [], color=colours[k], linewidth=4, label=k)
    ax.set_xlabel("seconds since the campaign started")
    ax.set_ylabel("per second")
    ax.set_title(f"Chaos campaign, seed {history.seed}: throughput and faults")
    ax.legend(fontsize=7, ncol=3, loc="lower left")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

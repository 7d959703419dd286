"""The cluster suite's output: its figures as Result rows, the lines describing the setup, one JSON object,
and the "Cluster" section of RESULTS.md (the rows, then every move of our client, part by part)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench import results
from bench.broker import percentile
from bench.cluster.moves import BATCH_RECORDS, IN_FLIGHT, LINGER_MS, PAUSE, RECORD_BYTES
from bench.cluster.servers import CLUSTER_SETTINGS
from bench.common import Result, Target, median, paired_ratio

if TYPE_CHECKING:
    from bench.cluster import Moves, Report

MOVE_TARGET = Target("<= 1 s", "<=", 1000.0)
NONE_TARGET = Target("0", "<=", 0.0)
PARTS = ("seal", "assign", "load", "first_ack")


def figures(report: Report) -> list[Result]:
    found: list[Result] = []
    for m, prefix in ((report.fast, "move"), (report.official, "official_move")):
        if m is None:
            continue
        n = len(m.moves)
        gaps = sorted(x.gap_ms for x in m.moves)
        found += [Result(f"{prefix}_unavailable_p50", "ms", percentile(gaps, 0.5), n),
                  Result(f"{prefix}_unavailable_p99", "ms", percentile(gaps, 0.99), n,
                         target=MOVE_TARGET if m.client == "fast" else None),
                  Result(f"{prefix}_unavailable_max", "ms", gaps[-1], n)]
        for part in PARTS:
            values = [v for x in m.moves if (v := getattr(x, f"{part}_ms")) is not None]
            if values:
                found.append(Result(f"{prefix}_{part}_p50", "ms", median(values), len(values)))
        drained = [x.drained_bytes / 1e6 for x in m.moves]
        found.append(Result(f"{prefix}_drained_p50", "MB", median(drained), n))
        unit = "batches" if m.client == "fast" else "messages"
        if m.client == "fast":  # futures failed as retriable, sent again by the bench (see fast_sender)
            found.append(Result(f"{prefix}_sends_rejected", unit, m.acks["rejected"], n, target=NONE_TARGET))
        found.append(Result(f"{prefix}_acks_lost", unit, m.lost, n, target=NONE_TARGET))
    ups, raws = [u.uploader_mb_s for u in report.uploads], [u.raw_mb_s for u in report.uploads]
    runs = len(report.uploads)
    found += [Result("uploader_drain", "MB/s", median(ups), runs, median(raws), paired_ratio(ups, raws)),
              Result("raw_put", "MB/s", median(raws), runs)]
    return found


def moves_json(m: Moves) -> dict[str, object]:
    gaps = sorted(x.gap_ms for x in m.moves)
    return {"client": m.client, "moves": len(m.moves),
            "unavailable_ms": {"p50": percentile(gaps, 0.5), "p99": percentile(gaps, 0.99), "max": gaps[-1]},
            "acks": m.acks, "lost": m.lost, "records_per_s": round(m.records / m.seconds),
            "per_move": [x.as_json() for x in m.moves]}


def setup_lines(report: Report) -> list[str]:
    s, f = report.settings, report.fast
    settings = ", ".join(f"{k} {v}" for k, v in CLUSTER_SETTINGS.items())
    rate = f"paced at {s.rate:,.0f} records/s" if s.rate else "as fast as acks come back"
    lines = [f"Cluster: 3 brokers (`danube-fast broker --mode cluster`), etcd {report.etcd_version}, a moto "
             f"S3 server (subprocess) as the object store, all on loopback; [cluster] {settings}, the "
             "rest default; WAL sync always",
             f"Moves: our FastProducer on a Reliable topic, batches of {BATCH_RECORDS} x {RECORD_BYTES} B "
             f"(linger {LINGER_MS:g} ms), at most {IN_FLIGHT} unacknowledged, {rate} "
             f"({round(f.records / f.seconds):,} records/s over the phase); {len(f.moves)} moves, each an "
             f"unload as the admin API writes it, {PAUSE:g} s of traffic between moves; sends: "
             f"{_acks_text(f.acks)}"]
    if f.acks["rejected"]:
        rejected, reopens = f.acks["rejected"], f.acks["reopens"]
        lines.append(f"FastProducer did not follow the moves by itself: {rejected} sends failed with a "
                     "retriable UNAVAILABLE rejection from the old owner, which keeps the Produce stream "
                     f"open; the bench reopened the producer {reopens} times and sent them again in order "
                     "(bench/cluster/moves.py `fast_sender`): the unavailability figures include that")
    if report.official is not None:
        o = report.official
        lines.append(f"Official danube-client: one `send` at a time, {len(o.moves)} moves; sends: "
                     f"{_acks_text(o.acks)}. Its retry policy sleeps 1.5-3 s (5 retries, linear backoff with "
                     "jitter) before it looks the topic up again (docs/WIRE.md B.2): its figures measure "
                     "that design more than the broker")
    u = report.uploads[0]
    lines.append(f"Upload: a WAL of {s.upload_mib} MiB (batches of 1,000 x 256 B records) drained "
                 f"by `Uploader.drain()` into {u.objects} objects ({u.object_bytes / 1e6:.0f} MB; "
                 "descriptors in an EmbeddedStore) against plain aiobotocore `put_object` calls of the same "
                 "sizes, one at a time, same moto endpoint, the order alternating between runs")
    return lines


def _acks_text(a: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in a.items())


def as_json(report: Report, info: dict[str, object]) -> dict[str, object]:
    return {"suite": "cluster", "machine": info, "etcd": report.etcd_version,
            "settings": {**report.settings.__dict__, "cluster": CLUSTER_SETTINGS, "in_flight": IN_FLIGHT,
                         "batch_records": BATCH_RECORDS, "record_bytes": RECORD_BYTES,
                         "pause_s": PAUSE},
            "moves": moves_json(report.fast),
            "official_moves": None if report.official is None else moves_json(report.official),
            "upload": [u.__dict__ for u in report.uploads],
            "results": [r.as_json() for r in report.results]}


def section(report: Report, info: dict[str, object], command: str, date: str) -> str:
    s = report.settings
    note = (f"moves: nearest-rank percentiles over the moves (the `runs` column); upload: medians over "
            f"{s.runs} runs, ratio = median of the per-run ratios")
    text = results.render_section("Cluster", report.results, info, command, date, s.runs, s.quick, note)
    head, machine_line, rest = text.partition("\n- Date: ")
    text = head + "".join(f"\n- {line}" for line in setup_lines(report)) + machine_line + rest
    lines = ["", "Our client's moves, in ms after the unload (seal: the old owner's sealed state seen; "
             "assign: the new assignment seen; load: the new owner's offset reservation seen; first ack: "
             "from the new owner), and the object bytes the old owner uploaded while sealing:", "",
             "| move | unavailable | seal | assign | load | first ack | drained MB |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for i, m in enumerate(report.fast.moves, 1):
        parts = " | ".join("" if (v := getattr(m, f"{p}_ms")) is None else f"{v:.0f}" for p in PARTS)
        lines.append(f"| {i} | {m.gap_ms:.0f} | {parts} | {m.drained_bytes / 1e6:.1f} |")
    return text + "\n".join(lines) + "\n"

"""`python -m bench storage`: the storage figures, each the median over `runs` runs.

Disk figures run in pairs: plain writes (the baseline) immediately followed by the WAL workload, fresh files
each, on the same file system. On a disk whose sequential fdatasync rate swings several-fold between runs
(we saw 270 to 1500 MB/s on the development VM), only the per-pair ratio is comparable across runs; the
reported ratio is the median of those, not the ratio of the medians.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from typing import Literal

from bench.common import (
    GIB,
    MB,
    MIB,
    PUBLISH_TIME,
    Options,
    Result,
    Target,
    median,
    paired_ratio,
    progress,
    time_calls,
)
from bench.micro import codec, disk
from danube_fast.codec import frames
from danube_fast.storage import wal_engine

CHUNK_BYTES = 16 * MIB  # the baseline's write size
IN_FLIGHT = 64  # concurrent appends against the asyncio facade
INDEX_BATCHES = 131_072  # one-record batches, all indexed: >= 100,000 index entries
INDEX_PAYLOAD = 100
LOOKUPS = 100_000
READ_BYTES = MIB



@dataclass(frozen=True)
class Sizes:
    write_bytes: int  # per baseline run, and (rounded up to whole batches) per WAL run
    cpu_budget_s: float  # per run of a CPU figure

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        # Short disk runs: this VM's disk flips between fast and slow states every few seconds, so a pair
        # is only comparable when both halves are short (bench/README.md).
        return cls(32 * MIB, 0.2) if quick else cls(128 * MIB, 1.0)


DISK_RUNS_PER_RUN = 3  # disk pairs per --runs step: the disk figures need more samples than the CPU ones


@dataclass(frozen=True)
class WalWorkload:
    name: str
    payload_bytes: int
    records_per_batch: int
    layer: Literal["facade", "engine"]
    batches_per_call: int = 1  # engine only: batches handed to one append() before its sync()
    target_bytes: Target | None = None
    target_records: Target | None = None
    text: bool = False  # JSON-like payloads (codec.text_payloads) instead of random bytes
    compression: str = "none"  # the producer's codec (docs/FORMAT.md#compression)

    def batch(self) -> bytes:
        if not self.text:
            return disk.encode_batch_of(self.payload_bytes, self.records_per_batch)
        return frames.encode_payloads(codec.text_payloads(self.records_per_batch, self.payload_bytes),
                                      publish_time=PUBLISH_TIME, compression=self.compression)


WAL_WORKLOADS = (
    WalWorkload("wal_append_always_4k", 4096, 64, "facade",
                target_bytes=Target(">= 80% of baseline", ">=", 0.8, of="ratio")),
    WalWorkload("wal_append_always_256b", 256, 1000, "facade",
                target_records=Target(">= 5,000,000 records/s", ">=", 5_000_000)),
    WalWorkload("wal_append_engine_256b", 256, 1000, "engine", batches_per_call=16),
    # The same text-like records, plain and compressed by the producer: the pair the compression targets use.
    WalWorkload("wal_append_text_256b", 256, 1000, "facade", text=True),
    WalWorkload("wal_append_zstd_text_256b", 256, 1000, "facade", text=True, compression="zstd"),
    WalWorkload("wal_append_lz4_text_256b", 256, 1000, "facade", text=True, compression="lz4"),
)
COMPRESSED_VS_PLAIN = {"wal_append_zstd_text_256b": "wal_append_text_256b",
                       "wal_append_lz4_text_256b": "wal_append_text_256b"}


def run_storage(options: Options) -> list[Result]:
    sizes = Sizes.of(options.quick)
    scratch = tempfile.mkdtemp(prefix="danube-bench-", dir=options.parent_dir)
    try:
        cpu = codec_figures(options.runs, sizes.cpu_budget_s, scratch)
        index = index_figures(scratch, options.runs, sizes.cpu_budget_s)
        wal = wal_figures(scratch, options.runs, sizes.write_bytes)
        cold = cold_read_figures(scratch, options.runs, sizes.write_bytes * 4)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return wal + cpu + index + cold


# -- disk: baseline and WAL, in pairs -------------------------------------------------------------------


def wal_figures(scratch: str, runs: int, write_bytes: int) -> list[Result]:
    chunk = os.urandom(CHUNK_BYTES)
    chunks = max(1, write_bytes // CHUNK_BYTES)
    base_bytes = chunks * CHUNK_BYTES
    all_baselines: list[float] = []
    measured: dict[str, tuple[list[float], list[float]]] = {w.name: ([], []) for w in WAL_WORKLOADS}
    batches = {w.name: w.batch() for w in WAL_WORKLOADS}
    def baseline(tag: str) -> float:
        path = os.path.join(scratch, f"baseline-{tag}")
        rate = base_bytes / disk.write_baseline(path, chunk, chunks) / MB
        os.unlink(path)
        return rate

    runs *= DISK_RUNS_PER_RUN
    for run in range(runs):
        for w in WAL_WORKLOADS:
            # Bracketed: a baseline right before and right after the WAL run, so a change of the disk's
            # state during the pair biases neither side.
            before = baseline(f"{run}-{w.name}-a")
            value = _run_wal(w, batches[w.name], os.path.join(scratch, f"wal-{run}-{w.name}"), base_bytes)
            base = (before + baseline(f"{run}-{w.name}-b")) / 2
            measured[w.name][0].append(value)
            measured[w.name][1].append(base)
            all_baselines.append(base)
            progress(f"run {run + 1}/{runs} {w.name}: {value:,.0f} MB/s, baseline {base:,.0f} MB/s, "
                     f"ratio {value / base:.2f}")
    results = [Result("baseline_write_fdatasync", "MB/s", median(all_baselines), len(all_baselines))]
    for w in WAL_WORKLOADS:
        values, bases = measured[w.name]
        ratio = paired_ratio(values, bases)
        per_record = len(batches[w.name]) / w.records_per_batch
        results.append(Result(w.name, "MB/s", median(values), runs, median(bases), ratio, w.target_bytes))
        # The baseline in records/s: what plain writes of the same bytes would carry.
        results.append(Result(f"{w.name}_records", "records/s", median(values) * MB / per_record, runs,
                              median(bases) * MB / per_record, ratio, w.target_records))
    results += compression_results(measured, batches, runs)
    return results


def compression_results(measured: dict[str, tuple[list[float], list[float]]], batches: dict[str, bytes],
                        runs: int) -> list[Result]:
    """Each compressed workload against the same records plain: bytes written per record (the object tier
    stores the same bytes: an upload copies the WAL's), and records/s, paired within each run."""
    by_name = {w.name: w for w in WAL_WORKLOADS}
    out = []
    for name, plain_name in COMPRESSED_VS_PLAIN.items():
        w, plain = by_name[name], by_name[plain_name]
        per_record = len(batches[name]) / w.records_per_batch
        plain_per_record = len(batches[plain_name]) / plain.records_per_batch
        rates = [v * MB / per_record for v in measured[name][0]]
        plain_rates = [v * MB / plain_per_record for v in measured[plain_name][0]]
        out.append(Result(f"{name}_bytes_per_record", "B", per_record, 1, plain_per_record,
                          per_record / plain_per_record,
                          Target("<= 0.5x the plain bytes", "<=", 0.5, of="ratio")))
        out.append(Result(f"{name}_vs_plain_records", "records/s", median(rates), runs, median(plain_rates),
                          paired_ratio(rates, plain_rates),
                          Target(">= 0.8x the plain record rate", ">=", 0.8, of="ratio")))
    return out


def _run_wal(w: WalWorkload, batch: bytes, directory: str, write_bytes: int) -> float:
    """One run of a WAL workload writing at least `write_bytes`; returns MB/s of batch bytes."""
    per_call = len(batch) * w.batches_per_call
    calls = math.ceil(write_bytes / per_call)
    try:
        if w.layer == "facade":
            elapsed = disk.wal_facade_append(directory, batch, calls, IN_FLIGHT)
        else:
            elapsed = disk.engine_append(directory, batch, w.batches_per_call, calls)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return calls * per_call / elapsed / MB


# -- CPU: codec and CRC ---------------------------------------------------------------------------------


def codec_figures(runs: int, budget_s: float, scratch: str) -> list[Result]:
    payloads = codec.make_payloads(1000, 256)
    records = codec.make_records(payloads)
    buf_256 = codec.batches_buffer(64, 1000, 256)
    buf_1k = codec.batches_buffer(64, 1000, 1024)
    crc_data = os.urandom(64 * MIB)
    text = {c: codec.batches_buffer(64, 1000, 256, text=True, compression=c) for c in ("none", "zstd", "lz4")}
    # The same distinct records as WAL batches and as a topic table's Parquet file: what the Spark source
    # would gain by reading a table's files instead of the topic's objects (docs/TABLES.md).
    distinct = codec.batches_buffer(64, 1000, 256, distinct=True)
    table_path = codec.table_file(distinct, scratch)
    encode_target = Target(">= 3,000,000 records/s", ">=", 3_000_000)
    decode_target = Target(">= 4 GiB/s", ">=", 4.0)
    rows: dict[str, list[float]] = {}

    def measure(name: str, rate: float) -> None:
        rows.setdefault(name, []).append(rate)

    for run in range(runs):
        progress(f"run {run + 1}/{runs} encode, decode_arrow, crc32c")
        measure("encode_batch_records", codec.encode_batch_rate(records, budget_s))
        measure("encode_payloads_records", codec.encode_payloads_rate(payloads, budget_s))
        measure("decode_arrow", codec.decode_arrow_rate(buf_256, True, budget_s) / GIB)
        measure("decode_arrow_1k", codec.decode_arrow_rate(buf_1k, True, budget_s) / GIB)
        measure("decode_arrow_noverify", codec.decode_arrow_rate(buf_256, False, budget_s) / GIB)
        measure("decode_arrow_1k_noverify", codec.decode_arrow_rate(buf_1k, False, budget_s) / GIB)
        measure("crc32c", codec.crc32c_rate(crc_data, budget_s / 2) / GIB)
        measure("zlib_crc32", codec.zlib_crc32_rate(crc_data, budget_s / 2) / GIB)
        for c, buf in text.items():
            measure(f"decode_arrow_{c}_text_records", codec.decode_arrow_records_rate(buf, budget_s))
        measure("decode_arrow_distinct", codec.decode_arrow_rate(distinct, True, budget_s) / GIB)
        measure("table_parquet_read", codec.parquet_read_rate(table_path, len(distinct), budget_s) / GIB)
    plain = rows["decode_arrow_none_text_records"]  # the same text-like records, not compressed
    return [
        Result("encode_batch_records", "records/s", median(rows["encode_batch_records"]), runs,
               target=encode_target),
        Result("encode_payloads_records", "records/s", median(rows["encode_payloads_records"]), runs,
               target=encode_target),
        Result("decode_arrow", "GiB/s", median(rows["decode_arrow"]), runs, target=decode_target),
        Result("decode_arrow_1k", "GiB/s", median(rows["decode_arrow_1k"]), runs, target=decode_target),
        Result("decode_arrow_noverify", "GiB/s", median(rows["decode_arrow_noverify"]), runs),
        Result("decode_arrow_1k_noverify", "GiB/s", median(rows["decode_arrow_1k_noverify"]), runs),
        Result("crc32c", "GiB/s", median(rows["crc32c"]), runs, median(rows["zlib_crc32"]),
               paired_ratio(rows["crc32c"], rows["zlib_crc32"])),
        Result("decode_arrow_none_text_records", "records/s", median(rows["decode_arrow_none_text_records"]),
               runs),
        *[Result(name, "records/s", median(rows[name]), runs, median(plain), paired_ratio(rows[name], plain))
          for name in ("decode_arrow_zstd_text_records", "decode_arrow_lz4_text_records")],
        Result("table_parquet_read", "GiB/s", median(rows["table_parquet_read"]), runs,
               median(rows["decode_arrow_distinct"]),
               paired_ratio(rows["table_parquet_read"], rows["decode_arrow_distinct"])),
    ]


# -- index lookups and reads ----------------------------------------------------------------------------


def index_figures(scratch: str, runs: int, budget_s: float) -> list[Result]:
    progress(f"building a log of {INDEX_BATCHES:,} indexed batches")
    log = disk.build_indexed_log(os.path.join(scratch, "indexed"), INDEX_BATCHES, INDEX_PAYLOAD)
    try:
        rng = random.Random(7)
        offsets = [rng.randrange(log.next_offset) for _ in range(LOOKUPS)]
        pass_bytes = disk.read_all(log, READ_BYTES)
        lookups: list[float] = []
        reads: list[float] = []
        for run in range(runs):
            progress(f"run {run + 1}/{runs} index_lookup, wal_read_1mib")
            lookups.append(disk.time_lookups(log, offsets) / len(offsets) * 1e6)
            calls, elapsed = time_calls(lambda: disk.read_all(log, READ_BYTES), budget_s)
            reads.append(calls * pass_bytes / elapsed / MB)
    finally:
        log.close()
    return [
        Result("index_lookup", "µs", median(lookups), runs, target=Target("<= 1 µs", "<=", 1.0)),
        Result("wal_read_1mib", "MB/s", median(reads), runs),
    ]


def cold_read_figures(scratch: str, runs: int, total_bytes: int) -> list[Result]:
    """A log written with direct appends, read front to back in 1 MiB reads with its files out of the page
    cache: direct reads (Segment.direct_reads) against buffered ones of the same files, in pairs; MB/s, and
    CPU milliseconds per MiB read (docs/ARCHITECTURE.md, "Direct reads")."""
    directory = os.path.join(scratch, "cold")
    progress(f"writing a {total_bytes // MIB} MiB log with direct appends")
    disk.build_direct_log(directory, total_bytes)
    speed: dict[str, list[float]] = {"direct": [], "buffered": []}
    cpu: dict[str, list[float]] = {"direct": [], "buffered": []}
    for run in range(runs):
        progress(f"run {run + 1}/{runs} wal_cold_read (direct, buffered)")
        for mode in ("direct", "buffered"):
            total, seconds, cpu_s = disk.cold_read(directory, mode == "direct", READ_BYTES)
            speed[mode].append(total / seconds / MB)
            cpu[mode].append(cpu_s * 1e3 / (total / MIB))
    return [
        Result("wal_cold_read_direct", "MB/s", median(speed["direct"]), runs,
               baseline=median(speed["buffered"]),
               ratio=median([d / b for d, b in zip(speed["direct"], speed["buffered"], strict=True)])),
        Result("wal_cold_read_direct_cpu", "ms/MiB", median(cpu["direct"]), runs,
               baseline=median(cpu["buffered"]),
               ratio=median([d / b for d, b in zip(cpu["direct"], cpu["buffered"], strict=True)])),
    ]


def check_native() -> str | None:
    """A warning when the pure-Python twins are selected: their figures say nothing about the product."""
    if frames.IMPL != "native" or wal_engine.IMPL != "native":
        return f"codec {frames.IMPL}, WAL engine {wal_engine.IMPL}: DANUBE_FAST_PURE=1 measures the twins"
    return None

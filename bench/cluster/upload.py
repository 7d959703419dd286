"""The uploader's throughput against raw aiobotocore puts of the same bytes, on the same S3 endpoint.

A WAL (sync none: the fill is not what is measured) is filled with batches of 1,000 records of 256 B. Per
run, `Uploader.drain()` copies it into a fresh prefix of the bucket: objects of at most `max_object_bytes`
(the broker's default), each built (footer, index), put, then published by a descriptor transaction in an
EmbeddedStore (SQLite, fsynced). The baseline is a loop of plain `put_object` calls through an aiobotocore
client of the objects' sizes, one at a time as the uploader puts them, into another fresh prefix. The two
take turns going first; ratio = the median of the per-run ratios. MB/s count the objects' bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cluster.servers import S3_KEY, S3_REGION
from bench.common import MIB, PUBLISH_TIME
from danube_fast.codec import frames
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.storage import SyncPolicy, Wal, WalConfig
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.storage.uploader import Uploader, UploaderConfig

RECORD_BYTES = 256
BATCH_RECORDS = 1000
NAMESPACE = "bench"
DRAIN_TIMEOUT = 600.0


@dataclass
class UploadRun:
    uploader_mb_s: float
    raw_mb_s: float
    objects: int
    object_bytes: int


async def fill_wal(directory: Path, mib: int) -> Wal:
    wal = await Wal.open(directory, WalConfig(sync=SyncPolicy("none")))
    batch = frames.encode_payloads([b"u" * RECORD_BYTES] * BATCH_RECORDS, publish_time=PUBLISH_TIME)
    for _ in range(-(-mib * MIB // len(batch))):
        await wal.append(batch)
    return wal


async def measure_upload(endpoint: str, bucket: str, scratch: Path, mib: int, runs: int,
                         progress: Callable[[str], None]) -> list[UploadRun]:
    from aiobotocore.session import get_session

    from danube_fast.storage.objects.s3 import S3Store

    wal = await fill_wal(scratch / "upload-wal", mib)
    meta = await EmbeddedStore.open(scratch / "upload-meta.db")
    store = await S3Store.open(bucket, "uploader", endpoint_url=endpoint, region=S3_REGION, access_key=S3_KEY,
                               secret_key=S3_KEY)
    session = get_session()
    found: list[UploadRun] = []
    try:
        async with session.create_client("s3", endpoint_url=endpoint, region_name=S3_REGION,
                                         aws_access_key_id=S3_KEY, aws_secret_access_key=S3_KEY) as raw:
            sizes: list[int] = []
            for run in range(runs):
                topic = f"run{run}"
                if run % 2 and sizes:
                    raw_s = await _raw_puts(raw, bucket, f"raw/{topic}", sizes)
                    up_s, sizes = await _drain(wal, store, meta, topic)
                else:
                    up_s, sizes = await _drain(wal, store, meta, topic)
                    raw_s = await _raw_puts(raw, bucket, f"raw/{topic}", sizes)
                total = sum(sizes)
                found.append(UploadRun(total / up_s / 1e6, total / raw_s / 1e6, len(sizes), total))
                progress(f"upload run {run + 1}/{runs}: {len(sizes)} objects, {total / 1e6:.0f} MB: uploader "
                         f"{found[-1].uploader_mb_s:.0f} MB/s, raw puts {found[-1].raw_mb_s:.0f} MB/s")
                for key in await store.list(f"{NAMESPACE}/{topic}/"):  # moto keeps objects in memory
                    await store.delete(key)
                for i in range(len(sizes)):
                    await raw.delete_object(Bucket=bucket, Key=f"raw/{topic}/{i}")
    finally:
        await store.close()
        await meta.close()
        await wal.close()
    return found


async def _drain(wal: Wal, store: Any, meta: EmbeddedStore, topic: str) -> tuple[float, list[int]]:
    """Seconds `Uploader.drain()` takes to upload the whole WAL under `topic`, and the objects' sizes."""
    uploader = Uploader(wal, store, meta, NAMESPACE, topic, checkpoint=-1,
                        config=UploaderConfig(delete_local=False))  # the same WAL serves every run
    try:
        began = time.perf_counter()
        last = await uploader.drain(DRAIN_TIMEOUT)
        elapsed = time.perf_counter() - began
    finally:
        await uploader.close()
    if last != wal.committed_offset - 1:
        raise RuntimeError(f"the uploader drained up to offset {last}; the WAL ends at "
                           f"{wal.committed_offset - 1}")
    sizes = [d.size for d in await load_descriptors(meta, NAMESPACE, topic)]
    if sum(sizes) != uploader.stats.bytes:
        raise RuntimeError(f"the descriptors hold {sum(sizes)} bytes; the uploader counted "
                           f"{uploader.stats.bytes}")
    return elapsed, sizes


async def _raw_puts(client: Any, bucket: str, prefix: str, sizes: list[int]) -> float:
    bodies = {size: bytes(size) for size in set(sizes)}
    began = time.perf_counter()
    for i, size in enumerate(sizes):
        await client.put_object(Bucket=bucket, Key=f"{prefix}/{i}", Body=bodies[size])
    return time.perf_counter() - began

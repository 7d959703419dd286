"""Helpers of the Spark tests: producing known records into a real broker, waiting for its uploads, and the
reader options that point Spark at the broker's metadata and objects."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from danube_fast.client import FastProducer
from danube_fast.meta.reader import open_reader
from danube_fast.storage.objects.catalog import load_descriptors
from danube_fast.testing.broker import Broker
from tests.compat.compat_support import Session

UPLOAD_WAIT = 30.0


def payload(topic: str, i: int) -> bytes:
    return f"{topic}#{i:06d}".encode()


async def produce_fast(broker: Broker, topic: str, count: int, start: int = 0) -> None:
    """`count` records with known payloads through the fast API, in batches of 500."""
    producer = await FastProducer.connect(broker.target, topic, "spark-fast")
    try:
        for i in range(start, start + count):
            await producer.send(payload(topic, i))
        await producer.flush()
    finally:
        await producer.close()


async def produce_rich(broker: Broker, topic: str, count: int, *,
                       partitions: int = 0) -> list[dict[str, Any]]:
    """`count` records with routing keys and attributes through the official client; what was sent."""
    sent = []
    async with Session(broker.url) as s:
        producer = await s.producer(topic, "spark-rich", reliable=True, partitions=partitions)
        for i in range(count):
            data = f"rich#{i:04d}".encode()
            attributes = {"n": str(i), "parity": "even" if i % 2 == 0 else "odd"}
            key = f"key-{i % 5}"
            await asyncio.wait_for(producer.send_with_key(data, attributes, key), 10)
            sent.append({"value": data, "attributes": attributes, "key": key.encode()})
    return sent


def metadata_url(broker: Broker) -> str:
    return f"embedded:{broker.data_dir / 'metadata.db'}"


def objects_url(broker: Broker) -> str:
    return str(broker.data_dir / "objects")


def uploaded_end(broker: Broker, stored: str) -> int:
    """One past the last offset of `stored` (/ns/topic) in the object tier."""

    async def ask() -> int:
        meta = await open_reader(metadata_url(broker))
        try:
            ns, short = stored.split("/")[1:]
            return max((d.end_offset + 1 for d in await load_descriptors(meta, ns, short)), default=0)
        finally:
            await meta.close()

    return asyncio.run(ask())


def wait_uploaded(broker: Broker, stored: str, end: int) -> None:
    deadline = time.monotonic() + UPLOAD_WAIT
    while (got := uploaded_end(broker, stored)) < end:
        assert time.monotonic() < deadline, f"{stored}: {got} of {end} offsets uploaded in {UPLOAD_WAIT} s"
        time.sleep(0.1)


def reader_options(broker: Broker, **extra: str) -> dict[str, str]:
    return {"metadataStore": metadata_url(broker), "objectStore": objects_url(broker), **extra}

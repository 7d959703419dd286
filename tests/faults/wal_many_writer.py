"""Many WALs written at once in one process, for the crash test of the shared I/O pool: appends until killed,
printing one line per acknowledged append.

    python wal_many_writer.py DIR TOPICS RUN_ID

The WAL of topic i is DIR/t{i}. Line per ack: "ack TOPIC FIRST LAST RUN PRODUCER SEQ COUNT", with the record
payloads of wal_writer.payload(RUN, PRODUCER, SEQ, j). PRODUCER is the topic's number: each topic has one
producer at a time, and TOPICS / 4 producers run at once, each moving on to a random topic after every ack.
"""

from __future__ import annotations

import asyncio
import random
import sys

import uvloop
from wal_writer import payload

from danube_fast.codec import frames
from danube_fast.storage import SyncPolicy, Wal, WalConfig


async def main(directory: str, topics: int, run: int) -> None:
    config = WalConfig(sync=SyncPolicy.parse("always"), segment_bytes=64 * 1024, index_max_bytes=64 * 1024)
    wals = [await Wal.open(f"{directory}/t{i}", config) for i in range(topics)]
    print("ready", flush=True)
    seqs = [0] * topics
    busy: set[int] = set()

    async def produce(k: int) -> None:
        rng = random.Random(run * 100_000 + k)
        while True:
            t = rng.randrange(topics)
            if t in busy:
                await asyncio.sleep(0)
                continue
            busy.add(t)
            seq = seqs[t]
            count = rng.randint(1, 20)
            data = frames.encode_payloads([payload(run, t, seq, j) for j in range(count)], publish_time=seq)
            first, last = await wals[t].append(data)
            seqs[t] = seq + 1
            busy.discard(t)
            print("ack", t, first, last, run, t, seq, count, flush=True)

    await asyncio.gather(*[produce(k) for k in range(max(1, topics // 4))])


if __name__ == "__main__":
    uvloop.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))

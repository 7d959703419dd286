"""A WAL writer process for crash tests: appends until killed, printing one line per acknowledged append.

    python wal_writer.py DIR SYNC PRODUCERS RUN_ID [FSIZE_LIMIT]

Line per ack: "ack FIRST LAST RUN PRODUCER SEQ COUNT". Record j of that append has the payload
payload(RUN, PRODUCER, SEQ, j). With FSIZE_LIMIT, RLIMIT_FSIZE is set first (SIGXFSZ ignored, so writes past
it fail with EFBIG like a full disk); the first failure is printed as "error TYPE MESSAGE" and the process
then exits 0.
"""

from __future__ import annotations

import asyncio
import random
import resource
import signal
import sys

import uvloop

from danube_fast.codec import frames
from danube_fast.errors import WalWriteError
from danube_fast.storage import SyncPolicy, Wal, WalConfig


def payload(run: int, producer: int, seq: int, j: int) -> bytes:
    head = f"{run}:{producer}:{seq}:{j}:".encode()
    return head + bytes([(run + producer + seq + j) % 251]) * ((seq * 7 + j) % 300)


async def main(directory: str, sync: str, producers: int, run: int) -> None:
    config = WalConfig(sync=SyncPolicy.parse(sync), segment_bytes=256 * 1024, index_max_bytes=64 * 1024)
    wal = await Wal.open(directory, config)
    print("ready", wal.committed_offset, flush=True)
    failed = asyncio.Event()

    async def produce(k: int) -> None:
        rng = random.Random(run * 1000 + k)
        seq = 0
        while not failed.is_set():
            count = rng.randint(1, 40)
            data = frames.encode_payloads([payload(run, k, seq, j) for j in range(count)], publish_time=seq)
            try:
                first, last = await wal.append(data)
            except WalWriteError as e:
                if not failed.is_set():
                    print("error", type(e).__name__, str(e).replace("\n", " "), flush=True)
                failed.set()
                return
            print("ack", first, last, run, k, seq, count, flush=True)
            seq += 1

    await asyncio.gather(*[produce(k) for k in range(producers)])
    await wal.close()


if __name__ == "__main__":
    if len(sys.argv) > 5:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        limit = int(sys.argv[5])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    uvloop.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))

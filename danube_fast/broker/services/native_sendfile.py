"""Batches sent from their segment file with sendfile() on a plaintext native connection (docs/TRANSPORT.md,
"Catch-up with sendfile"): a consumer catching up from the disk gets them from the page cache through the
kernel, without the broker's pread into memory and its write out of it.

uvloop's `loop.sendfile` is asyncio's abstract one (NotImplementedError) and its transports have no
sendfile of their own, so the bytes go with `os.sendfile` on a duplicate of the connection's socket
descriptor, in a thread of this sender's small pool (a read of cold data blocks in the kernel, not on the
event loop). What keeps the stream in order: the caller holds the connection's other frames back for the
time (services/native.py `Connection`), and a span starts only once the transport's own write buffer is
empty. A socket that stays full for WAIT_S (a slow reader) is not waited for in the pool: what is left of
the span is read and written through the transport, where the connection's slow-reader timeout applies. The
duplicate keeps the socket open until the thread is done, so a connection closed meanwhile can never make
it write to a descriptor number reused by another file.
"""

from __future__ import annotations

import asyncio
import os
import select
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client.core import CounterMetricFamily

from danube_fast.storage.file_span import FileSpan

THREADS = 4  # sendfiles at a time, across every connection
WAIT_S = 0.05  # how long a thread waits for a full socket before the rest goes through the transport
DRAIN_POLL_S = 0.001  # how often the transport's buffer is looked at while it empties


def send_some(out: int, fd: int, position: int, length: int, wait_s: float) -> int:
    """sendfile() `length` bytes at `position` of `fd` to socket `out` (non-blocking; closed here), waiting at
    most `wait_s` at a time for room; how many went. Raises OSError when the connection breaks."""
    sent = 0
    try:
        while sent < length:
            try:
                n = os.sendfile(out, fd, position + sent, length - sent)
            except BlockingIOError:
                poll = select.poll()
                poll.register(out, select.POLLOUT)
                if not poll.poll(wait_s * 1000):
                    break
                continue
            if n == 0:  # the file ended early: the caller reads (and reports) the rest
                break
            sent += n
    finally:
        os.close(out)
    return sent


class FileSender:
    """The broker's sendfile pool and counters (one per native listener)."""

    def __init__(self, threads: int = THREADS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sendfile")
        self.sent_bytes = 0  # bytes that went by sendfile
        self.copied_bytes = 0  # bytes of spans that went through the transport instead (full sockets)

    async def send(self, transport: Any, span: FileSpan, timeout: float) -> None:
        """`span` after what `transport` has written so far; raises TimeoutError when the transport's buffer
        does not empty within `timeout`, OSError when the connection breaks."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while transport.get_write_buffer_size():
            if loop.time() > deadline:
                raise TimeoutError("the client read nothing")
            await asyncio.sleep(DRAIN_POLL_S)
        sock = transport.get_extra_info("socket")
        if sock is None or transport.is_closing():
            raise ConnectionError("the connection closed")
        out = os.dup(sock.fileno())
        sent = await loop.run_in_executor(self._pool, send_some, out, span.fd, span.position, span.length,
                                          WAIT_S)
        self.sent_bytes += sent
        if sent < span.length:
            rest = await loop.run_in_executor(None, span.read, sent)
            self.copied_bytes += len(rest)
            transport.write(rest)

    def collect(self) -> Iterator[CounterMetricFamily]:
        """Its counters on the broker's metrics endpoint (a prometheus_client collector)."""
        yield CounterMetricFamily("danube_native_sendfile_bytes", "Native transport: record bytes sent from "
                                  "segment files with sendfile().", value=self.sent_bytes)
        yield CounterMetricFamily("danube_native_sendfile_copied_bytes", "Native transport: bytes of segment "
                                  "file spans written through the transport instead (the socket was full).",
                                  value=self.copied_bytes)

    def close(self) -> None:
        self._pool.shutdown(wait=False)  # (a queued send still closes its descriptor)

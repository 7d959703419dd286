"""A fault-injecting TCP proxy on a free loopback port, in front of one upstream server (host:port): bytes
pass through both ways until a test asks for a fault.

- delay(seconds, jitter): every chunk is held that long (plus up to `jitter` more, at random) before it is
  forwarded (a slow link);
- blackhole(): connections stay open and new ones are accepted, but every byte is dropped (bytes missing
  from the middle of a TCP stream: a broken middlebox, not a network, can do that);
- stall(): nothing is forwarded, nothing is lost: bytes wait (in the kernel's buffers, then the sender's)
  until the fault heals, as in a network partition that TCP's retransmissions outlast;
- one_way(direction): stall() one way only ("to_server": requests wait, "to_client": answers wait), a
  one-way partition;
- reset(): every open connection is closed with a TCP RST on both sides (a crashed peer or middlebox);
- refuse(): new connections are reset as soon as they are accepted;
- cut(): refuse() and reset(), a partition that clients notice at once;
- pass_through(): no fault (again).

The Proxy owns its event loop, which runs in a thread of its own (so the proxy serves sync and async tests
alike), and every socket: close() (or the end of its `with` block) stops them. The fault methods may be called
from any thread; they take effect on the proxy's thread before they return.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, TypeVar

from danube_fast.testing.ports import LOOPBACK

T = TypeVar("T")
CHUNK = 64 * 1024
Mode = Literal["pass", "delay", "blackhole", "stall", "to_server", "to_client"]
Direction = Literal["to_server", "to_client"]


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST: SO_LINGER 0 makes close() send RST instead of FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    pumps: list[asyncio.Task[None]] = field(default_factory=list)

    def reset(self) -> None:
        _reset(self.client)
        _reset(self.upstream)


class Proxy:
    """Listens on LOOPBACK:`port` (see `target`) and forwards each connection to `upstream` (host:port)."""

    def __init__(self, upstream: str) -> None:
        self.upstream_host, _, port = upstream.rpartition(":")
        self.upstream_port = int(port)
        self.mode: Mode = "pass"
        self.delay_seconds = 0.0
        self.jitter_seconds = 0.0
        self.refusing = False
        self.accepted = 0  # connections accepted, refused ones included
        self.resets = 0  # connections reset by reset() or refuse()
        self._connections: set[_Connection] = set()
        # Set while bytes may flow that way; used on the proxy's thread only.
        self._flowing = {"to_server": asyncio.Event(), "to_client": asyncio.Event()}
        for flowing in self._flowing.values():
            flowing.set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        self._server = self._call_async(self._listen())
        self.port: int = self._server.sockets[0].getsockname()[1]

    @property
    def target(self) -> str:
        """host:port to connect to instead of the upstream server."""
        return f"{LOOPBACK}:{self.port}"

    # -- faults (any thread) ------------------------------------------------------------------------

    def pass_through(self) -> None:
        self._call(lambda: self._set("pass", 0.0, refusing=False))

    def delay(self, seconds: float, jitter: float = 0.0) -> None:
        self._call(lambda: self._set("delay", seconds, refusing=False, jitter=jitter))

    def blackhole(self) -> None:
        self._call(lambda: self._set("blackhole", 0.0, refusing=False))

    def stall(self) -> None:
        self._call(lambda: self._set("stall", 0.0, refusing=False))

    def one_way(self, direction: Direction) -> None:
        """Hold what goes in `direction`, forward the other way."""
        self._call(lambda: self._set(direction, 0.0, refusing=False))

    def refuse(self) -> None:
        """New connections are reset when accepted; open ones are left alone (see reset())."""
        self._call(lambda: self._set(self.mode, self.delay_seconds, refusing=True,
                                     jitter=self.jitter_seconds))

    def reset(self) -> int:
        """Reset every open connection; how many there were."""
        return self._call(self._reset_all)

    def cut(self) -> None:
        """refuse() and reset(): the server is unreachable through the proxy until pass_through()."""
        self.refuse()
        self.reset()

    @property
    def open_connections(self) -> int:
        return self._call(lambda: len(self._connections))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call_async(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- the proxy's thread --------------------------------------------------------------------------

    def _call(self, fn: Callable[[], T]) -> T:
        done: Future[T] = Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as e:
                done.set_exception(e)

        self._loop.call_soon_threadsafe(run)
        return done.result()

    def _call_async(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._accept, LOOPBACK, 0)

    def _set(self, mode: Mode, delay: float, *, refusing: bool, jitter: float = 0.0) -> None:
        self.mode, self.delay_seconds, self.refusing, self.jitter_seconds = mode, delay, refusing, jitter
        for direction, flowing in self._flowing.items():
            if mode in ("stall", direction):
                flowing.clear()
            else:
                flowing.set()

    def _reset_all(self) -> int:
        connections = list(self._connections)
        for c in connections:
            c.reset()
        self.resets += len(connections)
        return len(connections)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.refusing:
            self.resets += 1
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            _reset(writer)  # the upstream refused us: refuse the client
            return
        connection = _Connection(writer, up_writer)
        self._connections.add(connection)
        connection.pumps = [asyncio.ensure_future(self._pump(reader, up_writer, "to_server")),
                            asyncio.ensure_future(self._pump(up_reader, writer, "to_client"))]
        try:
            await asyncio.gather(*connection.pumps, return_exceptions=True)
        finally:
            self._connections.discard(connection)
            writer.close()
            up_writer.close()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, direction: Direction
                    ) -> None:
        """Forward `source` to `sink` as the mode says, until end of file (passed on as a half-close) or a
        broken connection (passed on as a reset, as if the two ends were connected directly)."""
        try:
            flowing = self._flowing[direction]
            while True:
                await flowing.wait()  # not read while held: TCP's flow control holds the sender
                data = await source.read(CHUNK)
                if not data:
                    break
                await flowing.wait()  # a chunk read just before the fault began waits too
                if self.mode == "blackhole":
                    continue
                if self.mode == "delay":
                    await asyncio.sleep(self.delay_seconds + random.uniform(0, self.jitter_seconds))
                sink.write(data)
                await sink.drain()
            if sink.can_write_eof() and not sink.transport.is_closing():
                sink.write_eof()
        except (ConnectionError, OSError):
            _reset(sink)

    async def _shutdown(self) -> None:
        self._server.close()
        for c in list(self._connections):
            c.reset()
        handlers = asyncio.all_tasks() - {asyncio.current_task()}  # they end soon, their sockets reset
        if handlers:
            _, stuck = await asyncio.wait(handlers, timeout=5)
            for task in stuck:  # still connecting to an upstream that does not answer
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)
        await self._server.wait_closed()

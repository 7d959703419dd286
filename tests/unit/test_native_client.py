"""NativeConnection's handshake against a listener that never answers: a timeout, and nothing left behind
that fails unread when the connection then ends (asyncio's "Future exception was never retrieved")."""

from __future__ import annotations

import asyncio
import gc
import socket
from typing import Any

from danube_fast.client.native import NativeConnection


def test_a_handshake_that_times_out_leaves_no_failed_future_unread() -> None:
    async def run() -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        unread: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: unread.append(context))
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        port = listener.getsockname()[1]
        async def connect() -> str:
            try:
                await NativeConnection.connect(f"127.0.0.1:{port}", timeout=0.3)
            except TimeoutError:
                return "timed out"
            return "connected"

        connecting = asyncio.ensure_future(connect())
        accepted, _ = await loop.sock_accept(listener)  # a listener that takes the HELLO and says nothing
        assert await connecting == "timed out"
        del connecting
        accepted.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00")
        accepted.close()  # a reset, as the chaos campaign's proxies send
        listener.close()
        await asyncio.sleep(0.2)
        gc.collect()
        await asyncio.sleep(0)
        return unread

    assert asyncio.run(run()) == []

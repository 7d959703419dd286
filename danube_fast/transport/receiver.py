"""Frames read off a socket with as few copies as Python allows: the read half of an
`asyncio.BufferedProtocol`, used by the broker's listener and by the client (docs/TRANSPORT.md, "Serving
it").

The kernel reads into a 64 KiB staging buffer; frames that fit are parsed there (their bodies copied out:
they are small). A frame whose body does not fit gets a buffer of its own size, and the kernel reads the
rest of it straight into that buffer, which is handed over as the frame's body: a record batch is copied
once, for at most its first 64 KiB. A header is checked as soon as its 16 bytes are in, before any of its
body is buffered (frames.parse_header), so a length of 4 GiB costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from danube_fast.transport import frames
from danube_fast.transport.frames import Frame, FrameType

STAGE_BYTES = 64 * 1024  # every small frame fits


class FrameReceiver:
    """`get_buffer` and `buffer_updated` of a BufferedProtocol; each whole frame goes to `deliver`, which may
    call `stop()` (a closed connection: the rest is not parsed). Raises FrameError on a broken header."""

    def __init__(self, deliver: Callable[[Frame], None], max_frame: int = frames.DEFAULT_MAX_FRAME) -> None:
        self._deliver = deliver
        self.max_frame = max_frame
        self._stage = bytearray(STAGE_BYTES)
        self._staged = 0
        self._body: bytearray | None = None  # a large frame's body being read into its own buffer
        self._body_got = 0
        self._head: tuple[int, FrameType, int, int] | None = None
        self._stopped = False

    def stop(self) -> None:
        self._stopped = True

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is not None:
            return memoryview(self._body)[self._body_got:]
        return memoryview(self._stage)[self._staged:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._body is not None:
            self._body_got += nbytes
            if self._body_got == len(self._body):
                body, head = self._body, self._head
                self._body = self._head = None
                assert head is not None
                self._deliver(Frame(head[1], head[2], head[3], memoryview(body)))
            return
        self._staged += nbytes
        self._parse_stage()

    def _parse_stage(self) -> None:
        view = memoryview(self._stage)
        at = 0
        try:
            while not self._stopped and self._staged - at >= frames.HEADER_BYTES:
                head = frames.parse_header(view[at:at + frames.HEADER_BYTES], self.max_frame)
                size = head[0]
                start = at + frames.HEADER_BYTES
                if self._staged - start >= size:
                    at = start + size
                    self._deliver(Frame(head[1], head[2], head[3], memoryview(bytes(view[start:at]))))
                    continue
                if start + size <= len(self._stage):
                    break  # a small frame not all in yet: it will be, here
                have = self._staged - start
                self._body = bytearray(size)
                self._body[:have] = view[start:self._staged]
                self._body_got, self._head = have, head
                at = self._staged
                break
            rest = self._staged - at
            if rest and at:
                view[:rest] = view[at:self._staged]
            self._staged = rest
        finally:
            view.release()

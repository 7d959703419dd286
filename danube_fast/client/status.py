"""Which stream failures the fast client retries (reconnect, resend) and which it reports: the rule, and why.

The broker refuses a batch in-band (`Rejected`: code, message, retriable). It ends a stream with a status only
when it refuses the Open or Subscribe, when the client breaks the protocol, or when the topic leaves it or
it stops (UNAVAILABLE). Such a status is the code of a DanubeError (INVALID_ARGUMENT, FAILED_PRECONDITION,
PERMISSION_DENIED, NOT_FOUND, ALREADY_EXISTS, DATA_LOSS, INTERNAL for a storage failure, ...) with the
broker's own message; an exception the handler did not expect reaches the client as UNKNOWN "Unexpected
<class ...>: ..." (grpc's server).

The rule: a failed call is retriable when
  1. its code is UNAVAILABLE, RESOURCE_EXHAUSTED or DEADLINE_EXCEEDED, whoever set it (the broker uses these
     only for conditions that pass); or
  2. its code is INTERNAL or UNKNOWN and its details start with a text that grpc itself gives a broken
     transport (TRANSPORT_FAILURES): the call failed on this side, not by the broker's choice.
Every other status, INTERNAL and UNKNOWN with any other text included, is the broker's answer: reported at
once.

Why (measured with grpcio 1.85.1 against the broker subprocess, SIGKILLed):
* Reads alone in progress when the connection dies end in UNAVAILABLE "Stream removed (Socket closed)".
* A write that Core cannot finish because the connection died ends in INTERNAL "Internal error from Core":
  grpc.aio's `_StreamRequestMixin._write` answers any failed write with `set_internal_error`, which replaces
  the call's status (grpc/grpc#36066), so a read waiting on the same call may get it too. A raw stream
  flooding writes got it on both the write and the read in 10 of 10 kills; a FastProducer's reader in
  about 1 kill of 10, a FastConsumer acking record by record within 2 kills. The issue saw 8 of 30 kills
  fail every unacknowledged batch this way.
* Nothing else sets the two apart. Trailing metadata is empty either way: the broker sends none with its
  statuses. debug_error_string() is for debugging and changes form between releases: older Cores wrote
  "Error received from peer" for a status read from the server's trailers, 1.85 gives "INTERNAL:<details>"
  for a server's INTERNAL and a transport's UNAVAILABLE alike (only grpc.aio's own status differs: 'Failed
  "execute_batch": ...'). The details are the stable API, and the texts below are grpc's own constants,
  none of which the broker's messages start with. Google's Cloud clients resume a stream on INTERNAL the
  same way, by its message ("RST_STREAM", "Received unexpected EOS on DATA frame from server":
  googleapis/python-spanner, `_STREAM_RESUMPTION_INTERNAL_ERROR_MESSAGES`).

What it costs: "Internal error from Core" says only that the stream is gone, and grpc/grpc#36066 shows it can
also replace a status the broker sent an instant before (its abort racing a write). Retrying is still right:
the new stream's Open (Subscribe) is answered before anything else is written on it, so a refusal that
persists comes back there with its own status and is reported then; and the producer counts its stream
attempts from the broker's last answer, so a stream that keeps failing before any answer still ends in an
error. A transport INTERNAL with a text not listed here stays fatal: add the text when one is seen.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from danube_fast.errors import DanubeError

RETRIABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                             grpc.StatusCode.DEADLINE_EXCEEDED})

TRANSPORT_CODES = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})

# How grpc words a call that the transport ended (the start of `details()`).
TRANSPORT_FAILURES = (
    "Internal error from Core",  # grpc.aio: a write Core could not finish (grpc/aio/_call.py)
    "Received RST_STREAM with error code",  # chttp2: the peer, or a proxy, reset the HTTP/2 stream
    "Received unexpected EOS on DATA frame from server",  # the connection closed inside a message
    "Stream removed",  # chttp2: the stream went with its connection (UNKNOWN before grpc 1.5x)
    "Socket closed",
    "Connection reset",
    "Broken pipe",
    "GOAWAY received",
)


def retriable(error: grpc.aio.AioRpcError) -> bool:
    """May the call be made again on a new stream (the module docstring's rule)?"""
    code = error.code()
    if code in RETRIABLE_CODES:
        return True
    return code in TRANSPORT_CODES and (error.details() or "").startswith(TRANSPORT_FAILURES)


async def write_or_broken(call: Any, request: Any) -> bool:
    """Write `request` on the stream `call`; False when the stream is broken, which the stream's reader
    notices and handles (reconnect and resend, or fail).

    A write on a call this client cancelled (a reader that switches to a new stream cancels the old one
    while another task waits in its write) raises asyncio.CancelledError, not an AioRpcError: grpc.aio's
    `_raise_for_status` answers a locally cancelled call that way. That is a broken stream too; the
    CancelledError is passed on only when the task itself is being cancelled. The cluster bench's moves
    under traffic ended in that error before (a producer's send_batch raised CancelledError)."""
    try:
        await call.write(request)
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        return False
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if (task is not None and task.cancelling()) or not call.done():  # (cancelled() is still False)
            raise
        return False
    return True


Offsets = tuple[int, int]  # a batch's first and last offset


class ProduceRejected(DanubeError):
    """The broker refused a batch (or the producer): `code` is the gRPC status name it gave."""

    def __init__(self, code: str, message: str, retriable: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.grpc_code = code
        self.retriable = retriable

"""The frames a follower of a replicated topic fetches its copy with (docs/TRANSPORT.md, "Replication";
docs/REPLICATION.md): the Replication service's Fetch (proto/Replication.proto) over the native transport,
so that the owner writes the records from its log's buffers to the socket (no copy in Python, none into
grpc's slices) and the follower appends them from the buffer the kernel read the frame into.

REPLICA_FETCH (0x50) is FetchRequest's fields, REPLICA_DATA (0x51) FetchResponse's and then the record
batches; a refusal is an ERROR with the request's id.
"""

from __future__ import annotations

from dataclasses import dataclass

from danube_fast.transport.frames import BodyReader, BodyWriter, FrameError

DATA_FIELDS = 8 + 8 + 8 + 1  # a REPLICA_DATA body's fields before its batches


@dataclass(frozen=True)
class ReplicaFetch:
    topic: str
    follower_id: int
    epoch: int
    from_offset: int
    max_bytes: int
    wait_ms: int
    durable_offset: int

    def encode(self) -> bytes:
        return (BodyWriter().string(self.topic).u64(self.follower_id).u64(self.epoch).i64(self.from_offset)
                .u32(self.max_bytes).u32(self.wait_ms).i64(self.durable_offset).done())

    @classmethod
    def decode(cls, body: memoryview | bytes) -> ReplicaFetch:
        r = BodyReader(body, "REPLICA_FETCH")
        got = cls(r.string("topic"), r.u64("follower_id"), r.u64("epoch"), r.i64("from_offset"),
                  r.u32("max_bytes"), r.u32("wait_ms"), r.i64("durable_offset"))
        r.end()
        return got


def data_fields(next_offset: int, start_offset: int, uploaded_through: int, reset: bool) -> bytes:
    """A REPLICA_DATA body's fields; the record batches follow them (written as they are, not joined)."""
    return (BodyWriter().i64(next_offset).i64(start_offset).i64(uploaded_through).u8(int(reset)).done())


@dataclass(frozen=True)
class ReplicaData:
    next_offset: int
    start_offset: int
    uploaded_through: int
    reset: bool
    data: memoryview  # the batches: a view into the frame's body

    def encode(self) -> bytes:
        return data_fields(self.next_offset, self.start_offset, self.uploaded_through, self.reset) + \
            bytes(self.data)

    @classmethod
    def decode(cls, body: memoryview | bytes) -> ReplicaData:
        r = BodyReader(body, "REPLICA_DATA")
        next_offset, start, uploaded, reset = (r.i64("next_offset"), r.i64("start_offset"),
                                               r.i64("uploaded_through"), r.u8("reset"))
        if reset > 1:
            raise FrameError(f"REPLICA_DATA: reset is {reset}, not 0 or 1")
        return cls(next_offset, start, uploaded, bool(reset), r.rest())

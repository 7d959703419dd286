"""The campaign's history: every send with its outcome, every receive, every fault, on one monotonic clock.

Vocabulary (Jepsen's): a send is `ok` when the broker acknowledged it (at `offset` when the client says so:
ours does, the official client does not), `fail` when it was definitely refused, `info` when its outcome is
unknown (a timeout, a broken stream: the record may or may not be stored). Payloads are the message's id,
`<producer>:<n>`, so every receive names the send it came from.

The History belongs to the campaign's event loop: clients and the nemesis append from that loop only.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Outcome = Literal["ok", "fail", "info"]


def payload(producer: str, n: int) -> bytes:
    return f"{producer}:{n}".encode()


def parse_payload(data: bytes) -> tuple[str, int] | None:
    """(producer, n) of a payload made by payload(); None for anything else."""
    producer, _, n = bytes(data).decode(errors="replace").rpartition(":")
    return (producer, int(n)) if producer and n.isdigit() else None


@dataclass(frozen=True)
class Send:
    producer: str
    n: int
    topic: str  # the topic the producer was given (a partitioned topic's base name)
    invoked: float
    completed: float
    outcome: Outcome
    offset: int | None = None
    error: str = ""


@dataclass(frozen=True)
class Receive:
    at: float
    topic: str  # the topic (partition) the record was read from
    subscription: str
    sub_type: str  # "exclusive", "failover", "shared", "fast"
    consumer: str
    offset: int
    producer: str
    n: int


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str
    started: float
    healed: float | None = None
    detail: str = ""


@dataclass(frozen=True)
class Session:
    """A consumer (re)subscribed: what it reads after this may repeat what came before (at least once)."""
    at: float
    subscription: str
    consumer: str
    reason: str


@dataclass
class History:
    seed: int
    started: float = field(default_factory=time.monotonic)
    sends: list[Send] = field(default_factory=list)
    receives: list[Receive] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    sessions: list[Session] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # received payloads that payload() did not make

    def now(self) -> float:
        """Seconds since the campaign started."""
        return time.monotonic() - self.started

    def write(self, path: Path) -> None:
        """One JSON object per line: {"send": {...}}, {"receive": {...}}, ...: replayable by the checker."""
        with path.open("w") as f:
            f.write(json.dumps({"seed": self.seed}) + "\n")
            for kind, events in (("send", self.sends), ("receive", self.receives), ("fault", self.faults),
                                 ("session", self.sessions)):
                for e in events:
                    f.write(json.dumps({kind: asdict(e)}) + "\n")

    @classmethod
    def read(cls, path: Path) -> History:
        lines = path.read_text().splitlines()
        history = cls(seed=json.loads(lines[0])["seed"], started=0.0)
        types: dict[str, tuple[Any, list[Any]]] = {
            "send": (Send, history.sends), "receive": (Receive, history.receives),
            "fault": (Fault, history.faults), "session": (Session, history.sessions)}
        for line in lines[1:]:
            ((kind, fields),) = json.loads(line).items()
            make, into = types[kind]
            into.append(make(**fields))
        return history

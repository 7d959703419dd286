"""The checker: what a history (history.py) says about the broker, in Jepsen's vocabulary.

For every subscription, against every send the broker acknowledged on the subscription's topic:
- lost: acknowledged, never read, though the subscription read past it (a later offset of that topic, or a
  later message of the same producer where the client gives no offsets);
- unseen: acknowledged, never read, and nothing after it was read either (stuck at the end);
- duplicates: one message read twice. At the same offset it is a redelivery, explained when the
  subscription (re)subscribed or a fault was under way between the two reads, unexpected otherwise. At two
  offsets (read or acknowledged there) it was stored twice: a producer retried a send whose ack it never
  got; counted once per message, whatever the subscriptions that read it;
- inconsistent offsets: one offset of one topic read or acknowledged with two different messages;
- unexpected: a read message that no producer sent;
- poll-skips (Exclusive, Failover and the fast consumer, whose order is promised): a consumer jumped over
  offsets its subscription had not read yet; rewinds (reading again from an earlier offset, which a
  redelivery does) are counted, not failed.
Sends whose outcome is unknown (`info`) may or may not be read: those read are counted as recovered.

A pure function of the history: `python -m bench chaos --check FILE` runs it again over a saved one.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from bench.chaos.history import History, Receive, Send

ORDERED = frozenset({"exclusive", "failover", "fast"})
EXAMPLES = 5  # examples kept per class
FAULT_MARGIN = 2.0  # seconds after a fault heals during which a redelivery is still its doing


@dataclass
class Verdict:
    sends: int = 0
    acked: int = 0
    failed: int = 0
    unknown: int = 0
    recovered: int = 0
    reads: int = 0
    lost: int = 0
    unseen: int = 0
    inconsistent: int = 0
    unexpected: int = 0
    redelivered: int = 0  # duplicates at one offset with a cause
    unexpected_duplicates: int = 0  # duplicates at one offset without one
    stored_twice: dict[str, int] = field(default_factory=dict)  # per producer
    poll_skips: int = 0
    rewinds: int = 0
    unreadable: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return not (self.lost or self.unseen or self.inconsistent or self.unexpected or self.poll_skips
                    or self.unexpected_duplicates or self.unreadable)

    def example(self, kind: str, text: str) -> None:
        kept = self.examples.setdefault(kind, [])
        if len(kept) < EXAMPLES:
            kept.append(text)

    def failures(self) -> dict[str, int]:
        """The classes that make a run invalid, with their counts (the ones that are not 0)."""
        counts = {"lost": self.lost, "unseen": self.unseen, "inconsistent offsets": self.inconsistent,
                  "unexpected messages": self.unexpected, "poll-skips": self.poll_skips,
                  "unexpected duplicates": self.unexpected_duplicates, "unreadable payloads": self.unreadable}
        return {k: v for k, v in counts.items() if v}


def check(history: History, subscriptions: dict[str, str]) -> Verdict:
    """`subscriptions`: each subscription's name -> the topic it reads (a partitioned topic's base name)."""
    v = Verdict(sends=len(history.sends), reads=len(history.receives), unreadable=len(history.unreadable))
    for text in history.unreadable[:EXAMPLES]:
        v.example("unreadable payloads", text)
    sent = {(s.producer, s.n): s for s in history.sends}
    acked = [s for s in history.sends if s.outcome == "ok"]
    v.acked = len(acked)
    v.failed = sum(s.outcome == "fail" for s in history.sends)
    v.unknown = sum(s.outcome == "info" for s in history.sends)
    by_sub: dict[str, list[Receive]] = defaultdict(list)
    for r in history.receives:
        by_sub[r.subscription].append(r)
    read_ids = {(r.producer, r.n) for r in history.receives}
    v.recovered = sum(s.outcome == "info" and (s.producer, s.n) in read_ids for s in history.sends)
    exists = _inconsistent(v, history, acked)
    _stored_twice(v, history, acked)
    for r in history.receives:
        if (r.producer, r.n) not in sent:
            v.unexpected += 1
            v.example("unexpected messages",
                      f"{r.subscription} read {r.producer}:{r.n} at {r.topic}@{r.offset}")
    for name, topic in subscriptions.items():
        reads = sorted(by_sub.get(name, []), key=lambda r: r.at)
        _missing(v, name, [s for s in acked if s.topic == topic], reads)
        _duplicates(v, history, name, reads)
        if reads and reads[0].sub_type in ORDERED:
            _order(v, name, reads, exists)
    return v


def _inconsistent(v: Verdict, history: History, acked: list[Send]) -> set[tuple[str, int]]:
    """Counts offsets holding two messages; returns every (topic, offset) known to hold one."""
    at: dict[tuple[str, int], set[tuple[str, int]]] = defaultdict(set)
    for topic, offset, message in _held(history, acked):
        at[(topic, offset)].add(message)
    for (topic, offset), messages in sorted(at.items()):
        if len(messages) > 1:
            v.inconsistent += 1
            v.example("inconsistent offsets", f"{topic}@{offset} holds {sorted(messages)}")
    return set(at)


def _held(history: History, acked: list[Send]) -> Iterator[tuple[str, int, tuple[str, int]]]:
    """(topic, offset, (producer, n)): where each message was acknowledged or read."""
    for s in acked:
        if s.offset is not None:
            yield s.topic, s.offset, (s.producer, s.n)
    for r in history.receives:
        yield r.topic, r.offset, (r.producer, r.n)


def _stored_twice(v: Verdict, history: History, acked: list[Send]) -> None:
    """Messages held at two offsets (read there, or acknowledged there), once per message and producer
    whatever the subscriptions that read them."""
    where: dict[tuple[str, int], set[tuple[str, int]]] = defaultdict(set)
    for topic, offset, message in _held(history, acked):
        where[message].add((topic, offset))
    for (producer, _), offsets in where.items():
        if len(offsets) > 1:
            v.stored_twice[producer] = v.stored_twice.get(producer, 0) + 1


def _missing(v: Verdict, name: str, acked: list[Send], reads: list[Receive]) -> None:
    read = {(r.producer, r.n) for r in reads}
    top_offset: dict[str, int] = {}
    top_n: dict[str, int] = {}
    for r in reads:
        top_offset[r.topic] = max(top_offset.get(r.topic, -1), r.offset)
        top_n[r.producer] = max(top_n.get(r.producer, -1), r.n)
    for s in acked:
        if (s.producer, s.n) in read:
            continue
        if s.offset is not None:
            passed = top_offset.get(s.topic, -1) > s.offset
        else:
            passed = top_n.get(s.producer, -1) > s.n
        kind = "lost" if passed else "unseen"
        setattr(v, kind, getattr(v, kind) + 1)
        v.example(kind, f"{name}: {s.producer}:{s.n} acked at {s.completed:.2f} s"
                        + (f" at offset {s.offset}" if s.offset is not None else ""))


def _duplicates(v: Verdict, history: History, name: str, reads: list[Receive]) -> None:
    first_read: dict[tuple[str, int], Receive] = {}
    sessions = sorted(s.at for s in history.sessions if s.subscription == name)
    for r in reads:
        key = (r.producer, r.n)
        earlier = first_read.get(key)
        if earlier is None:
            first_read[key] = r
        elif (earlier.topic, earlier.offset) == (r.topic, r.offset):
            if _explained(history, sessions, earlier.at, r.at):
                v.redelivered += 1
            else:
                v.unexpected_duplicates += 1
                v.example("unexpected duplicates", f"{name}: {r.producer}:{r.n} at {r.topic}@{r.offset} read "
                                                   f"at {earlier.at:.2f} s and {r.at:.2f} s")


def _explained(history: History, sessions: list[float], first: float, second: float) -> bool:
    if any(first <= at <= second for at in sessions):
        return True
    return any(f.started <= second and (f.healed is None or f.healed + FAULT_MARGIN >= first)
               for f in history.faults)


def _order(v: Verdict, name: str, reads: list[Receive], exists: set[tuple[str, int]]) -> None:
    """Offsets are not dense: a broker that takes a topic over from one that crashed starts past a reserved
    range (docs/TOPIC_MOVE.md), so only offsets known to hold a message can be skipped."""
    known: dict[str, list[int]] = defaultdict(list)  # per topic: offsets known to hold a message, sorted
    for topic, offset in sorted(exists):
        known[topic].append(offset)
    seen: dict[str, set[int]] = defaultdict(set)  # per topic (partition): offsets the subscription read
    last: dict[tuple[str, str], int] = {}  # per consumer and topic: the offset it read last
    for r in reads:
        key = (r.consumer, r.topic)
        before = last.get(key)
        if before is not None:
            if r.offset <= before:
                v.rewinds += 1
            elif r.offset > before + 1:
                offsets = known[r.topic]
                between = offsets[bisect.bisect_right(offsets, before):bisect.bisect_left(offsets, r.offset)]
                skipped = [o for o in between if o not in seen[r.topic]]
                if skipped:
                    v.poll_skips += 1
                    v.example("poll-skips", f"{name}: {r.consumer} read {r.topic}@{before} then @{r.offset} "
                                            f"at {r.at:.2f} s; never read before: {skipped[:5]}")
        last[key] = r.offset
        seen[r.topic].add(r.offset)

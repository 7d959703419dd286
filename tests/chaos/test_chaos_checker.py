"""The chaos checker (bench/chaos/checker.py) on hand-made histories: each class it reports is found, and a
clean history is valid."""

from __future__ import annotations

from pathlib import Path

from bench.chaos.checker import check
from bench.chaos.history import Fault, History, Receive, Send, Session, parse_payload, payload

TOPIC = "/default/t"
SUBS = {"x": TOPIC}


def sent(n: int, offset: int | None, outcome: str = "ok", producer: str = "f") -> Send:
    return Send(producer, n, TOPIC, n * 1.0, n * 1.0 + 0.1, outcome, offset)  # type: ignore[arg-type]


def read(at: float, offset: int, n: int, consumer: str = "c", producer: str = "f",
         kind: str = "exclusive") -> Receive:
    return Receive(at, TOPIC, "x", kind, consumer, offset, producer, n)


def history(sends: list[Send], receives: list[Receive]) -> History:
    h = History(seed=1, started=0.0)
    h.sends, h.receives = sends, receives
    return h


def test_a_clean_history_is_valid() -> None:
    v = check(history([sent(i, i) for i in range(5)], [read(10 + i, i, i) for i in range(5)]), SUBS)
    assert v.valid and v.acked == 5 and v.reads == 5 and not v.failures()


def test_lost_unseen_and_recovered() -> None:
    sends = [sent(0, 0), sent(1, 1), sent(2, None, "info"), sent(3, 3), sent(4, 4)]
    v = check(history(sends, [read(10, 0, 0), read(11, 2, 2), read(12, 3, 3)]), SUBS)
    assert (v.lost, v.unseen, v.recovered) == (1, 1, 1)  # f:1 lost (offset 3 read after it), f:4 unseen
    assert v.failures() == {"lost": 1, "unseen": 1, "poll-skips": 1}  # read 0 then 2: 1 was skipped


def test_without_offsets_a_later_message_of_the_producer_decides_lost() -> None:
    sends = [sent(0, None, producer="o"), sent(1, None, producer="o")]
    v = check(history(sends, [read(10, 7, 1, producer="o", kind="shared")]), SUBS)
    assert (v.lost, v.unseen) == (1, 0)


def test_inconsistent_offsets_and_unexpected_messages() -> None:
    v = check(history([sent(0, 0), sent(1, 1)], [read(10, 0, 1), read(11, 1, 1), read(12, 2, 9)]), SUBS)
    assert v.inconsistent == 1  # offset 0 acked with f:0, read with f:1
    assert v.unexpected == 1  # f:9 was never sent
    assert v.stored_twice == {"f": 1}  # f:1 read at offsets 0 and 1


def test_poll_skip_and_rewind() -> None:
    sends = [sent(i, i) for i in range(4)]
    v = check(history(sends, [read(10, 0, 0), read(11, 2, 2), read(12, 1, 1), read(13, 3, 3)]), SUBS)
    assert v.poll_skips == 1 and v.rewinds == 1 and not v.lost
    shared = [read(10, 0, 0, kind="shared"), read(11, 2, 2, kind="shared"), read(12, 1, 1, kind="shared"),
              read(13, 3, 3, kind="shared")]
    assert check(history(sends, shared), SUBS).valid  # no order is promised to a Shared subscription


def test_a_jump_over_what_another_consumer_read_is_not_a_skip() -> None:
    sends = [sent(i, i) for i in range(4)]
    reads = [read(10, 0, 0, "a", kind="failover"), read(11, 1, 1, "b", kind="failover"),
             read(12, 2, 2, "b", kind="failover"), read(13, 3, 3, "a", kind="failover")]
    assert check(history(sends, reads), SUBS).valid


def test_a_redelivery_needs_a_cause() -> None:
    h = history([sent(0, 0)], [read(10, 0, 0), read(20, 0, 0)])
    v = check(h, SUBS)
    assert v.unexpected_duplicates == 1 and not v.valid
    h.sessions.append(Session(15.0, "x", "c", "reconnected"))
    v = check(h, SUBS)
    assert (v.unexpected_duplicates, v.redelivered) == (0, 1) and v.valid
    h.sessions.clear()
    h.faults.append(Fault("kill", "broker1", 12.0, 14.0))
    assert check(h, SUBS).redelivered == 1


def test_payloads_and_a_saved_history_round_trip(tmp_path: Path) -> None:
    assert parse_payload(payload("o-a", 12)) == ("o-a", 12)
    assert parse_payload(b"junk") is None
    h = history([sent(0, 0), sent(1, None, "info")], [read(10, 0, 0)])
    h.faults.append(Fault("pause", "broker2", 1.0, None, "4.5 s"))
    h.sessions.append(Session(0.5, "x", "c", "start"))
    h.write(tmp_path / "h.jsonl")
    again = History.read(tmp_path / "h.jsonl")
    assert (again.sends, again.receives, again.faults, again.sessions) == (h.sends, h.receives, h.faults,
                                                                           h.sessions)


def test_a_jump_over_offsets_no_message_holds_is_not_a_skip() -> None:
    """A new owner after a crash starts past the dead one's reserved range (docs/TOPIC_MOVE.md)."""
    sends = [sent(0, 0), sent(1, 10_000_001)]
    assert check(history(sends, [read(10, 0, 0), read(11, 10_000_001, 1)]), SUBS).valid


def test_a_message_stored_twice_counts_once_whatever_the_subscriptions_that_read_it() -> None:
    """Two subscriptions read f:1 at offsets 1 and 2, and it was acknowledged at 1: one message stored twice
    (the 5-minute campaigns once reported it per subscription, about 3.4 times too many)."""
    subs = {"x": TOPIC, "y": TOPIC}
    reads = [read(10, 1, 1), read(11, 2, 1), Receive(10.0, TOPIC, "y", "shared", "c2", 1, "f", 1),
             Receive(11.0, TOPIC, "y", "shared", "c2", 2, "f", 1)]
    v = check(history([sent(1, 1)], reads), subs)
    assert v.stored_twice == {"f": 1}

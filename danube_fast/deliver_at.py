"""Delayed delivery's one field on the wire: the reserved record attribute `danube-deliver-at`, the time
(milliseconds since the Unix epoch, as a decimal string) before which Shared and Key-Shared subscriptions do
not receive the record (docs/SUBSCRIPTIONS.md, "Delayed delivery").

An attribute, on both APIs, so that the official client sends it unchanged and the fast API's batches keep
their format: `attributes(at)` builds it for either (`frames.Record(..., attributes=...)`, the official
client's `attributes=`).
"""

from __future__ import annotations

import time

ATTRIBUTE = "danube-deliver-at"
# A time this far in the past is taken as "now" (the producer's clock may be behind the broker's); earlier
# than that it is refused: a producer computing it from a stale clock should hear so.
PAST_TOLERANCE_MS = 60_000
DEFAULT_MAX_DELAY_MS = 10 * 24 * 3600 * 1000  # [dispatch] max_delivery_delay_ms's default: ten days


def now_ms() -> int:
    return int(time.time() * 1000)


def parse(value: str) -> int:
    """The time an attribute value names; ValueError saying why it is not one."""
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 15:
        raise ValueError(f"attribute {ATTRIBUTE} must be milliseconds since the Unix epoch (up to 15 "
                         f"digits), not {value[:40]!r}")
    return int(text)


def check(value: str, now: int, max_delay_ms: int) -> int:
    """The time `value` names, refused (ValueError, naming the value) when it is not one, lies more than
    PAST_TOLERANCE_MS in the past, or more than `max_delay_ms` ahead of `now` (ms)."""
    at = parse(value)
    if at < now - PAST_TOLERANCE_MS:
        raise ValueError(f"attribute {ATTRIBUTE} {at} is {(now - at) / 1000:.0f} s in the past (the broker's "
                         f"clock reads {now}); a time up to {PAST_TOLERANCE_MS // 1000} s past is delivered "
                         "at once")
    if at > now + max_delay_ms:
        raise ValueError(f"attribute {ATTRIBUTE} {at} is {(at - now) / 3_600_000:.1f} h ahead, beyond the "
                         f"broker's max_delivery_delay_ms ({max_delay_ms / 3_600_000:.1f} h)")
    return at


def attributes(at_ms: int | float, **others: str) -> dict[str, str]:
    """Record attributes that deliver the record no earlier than `at_ms` (ms since the epoch), with
    `others`."""
    return {**others, ATTRIBUTE: str(int(at_ms))}


def after(delay_ms: int | float, **others: str) -> dict[str, str]:
    """Record attributes that deliver the record `delay_ms` from now (this machine's clock)."""
    return attributes(now_ms() + delay_ms, **others)

"""The console's sessions (docs/CONSOLE.md, "Security"): a random id in an HttpOnly, SameSite=Strict
cookie names a session held here, in the broker's memory, with the user's token (never sent back to the
page, never in a URL) and the CSRF token every change must carry in its `X-CSRF-Token` header.

A session ends `idle_s` after its last use or `max_s` after it began, whichever is first, and when the
token inside it expires (the broker checks that on every call anyway). At most `max_sessions` live; the
oldest goes first. A broker restart ends every session: the user signs in again.

Owner: the console's event loop (aiohttp handlers); nothing else touches it.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field

COOKIE = "danube_console"
IDLE_S = 30 * 60
MAX_S = 8 * 3600
MAX_SESSIONS = 10_000


@dataclass
class Session:
    id: str
    token: str | None  # the user's bearer token; None when the broker checks no identity
    csrf: str
    principal: str
    started: float
    used: float = field(default=0.0)
    token_expires: float | None = None

    def csrf_ok(self, sent: str | None) -> bool:
        return sent is not None and hmac.compare_digest(sent, self.csrf)


class Sessions:
    def __init__(self, idle_s: float = IDLE_S, max_s: float = MAX_S,
                 max_sessions: int = MAX_SESSIONS) -> None:
        self.idle_s = idle_s
        self.max_s = max_s
        self._max = max_sessions
        self._live: OrderedDict[str, Session] = OrderedDict()

    def open(self, token: str | None, principal: str, token_expires: float | None = None) -> Session:
        now = time.monotonic()
        while len(self._live) >= self._max:
            self._live.popitem(last=False)
        session = Session(secrets.token_urlsafe(32), token, secrets.token_urlsafe(32), principal, now, now,
                          token_expires)
        self._live[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of that id (its use refreshed), None when there is none or it ended."""
        if not session_id:
            return None
        session = self._live.get(session_id)
        if session is None:
            return None
        now = time.monotonic()
        if now - session.used > self.idle_s or now - session.started > self.max_s or \
                (session.token_expires is not None and time.time() >= session.token_expires):
            del self._live[session_id]
            return None
        session.used = now
        self._live.move_to_end(session_id)
        return session

    def close(self, session_id: str | None) -> None:
        if session_id:
            self._live.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._live)

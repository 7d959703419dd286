"""The web console's HTTP listener (docs/CONSOLE.md): the page and its assets from the package, the JSON
endpoints of api.py, sign-in and sign-out, and the rules every response and change follows.

- Every response carries a Content-Security-Policy without inline scripts or styles (`script-src 'self'`),
  `frame-ancestors 'none'`, nosniff, no referrer; API answers are never cached.
- A change (POST, DELETE) needs the session's CSRF token in `X-CSRF-Token`; signing in, which has no
  session yet, needs `X-Requested-With: danube-console`, a header a cross-site form cannot send and a
  cross-site script cannot send without a CORS preflight this server never grants. A request whose
  `Origin` is another site is refused outright.
- With security on (docs/SECURITY.md) the user signs in with a token; without it every visitor gets an
  anonymous session (still with CSRF protection: the broker accepts any change then, so the browser must
  not be made to send one).

aiohttp serves it (the field's asyncio HTTP server); the listener's socket is bound by assemble.py with the
other ports and served from Broker.start.
"""

from __future__ import annotations

import socket
import ssl
from importlib import resources
from pathlib import Path
from typing import Any

import jwt
from aiohttp import web

from danube_fast.console.api import Api, Handler, read_body, refusal, text_field
from danube_fast.console.calls import AdminCalls
from danube_fast.console.sessions import COOKIE, Session, Sessions
from danube_fast.errors import ApiError
from danube_fast.proto import DanubeAdmin_pb2 as admin_pb

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
HEADERS = {"Content-Security-Policy": CSP, "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cross-Origin-Opener-Policy": "same-origin"}
SIGN_IN_HEADER = ("X-Requested-With", "danube-console")
MAX_BODY = 1024 * 1024
STATIC = Path(str(resources.files("danube_fast.console") / "static"))


@web.middleware
async def _headers(request: web.Request, handler: Any) -> web.StreamResponse:
    origin = request.headers.get("Origin")
    if origin is not None and origin.split("://", 1)[-1] != request.host:
        response: web.StreamResponse = refusal("PERMISSION_DENIED", f"requests from {origin[:100]} are not "
                                                                    "accepted: open the console itself")
    else:
        try:
            response = await handler(request)
        except web.HTTPException as e:
            response = e
    response.headers.update(HEADERS)
    if request.path.startswith("/api/"):
        response.headers["Cache-Control"] = "no-store"
    return response


class ConsoleServer:
    def __init__(self, calls: AdminCalls, api: Api, sessions: Sessions, *, authenticates: bool,
                 tls: ssl.SSLContext | None = None) -> None:
        self._calls = calls
        self._api = api
        self.sessions = sessions
        self._authenticates = authenticates
        self._tls = tls
        self._sock: socket.socket | None = None
        self._runner: web.AppRunner | None = None
        self.app = web.Application(middlewares=[_headers], client_max_size=MAX_BODY)
        self.app.router.add_get("/", self._index)
        self.app.router.add_static("/static/", STATIC, follow_symlinks=False)
        self.app.router.add_get("/api/session", self._session)
        self.app.router.add_post("/api/session", self._sign_in)
        self.app.router.add_delete("/api/session", self._sign_out)
        for method, path, handler in api.routes():
            self.app.router.add_route(method, path, self._guarded(handler))

    async def bind(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); served from `serve`. Returns the bound port."""
        sock = socket.create_server((host, port), reuse_port=False)
        sock.setblocking(False)
        self._sock = sock
        return int(sock.getsockname()[1])

    async def serve(self) -> None:
        assert self._sock is not None
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock, ssl_context=self._tls).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        elif self._sock is not None:
            self._sock.close()
        self._sock = None
        await self._calls.close()

    # -- sessions ----------------------------------------------------------------------------------------

    def _cookie(self, response: web.StreamResponse, session: Session) -> None:
        response.set_cookie(COOKIE, session.id, httponly=True, samesite="Strict", path="/",
                            secure=self._tls is not None, max_age=int(self.sessions.max_s))

    def _view(self, session: Session | None) -> dict[str, Any]:
        return {"security": self._authenticates, "signed_in": session is not None,
                "principal": session.principal if session else None,
                "csrf": session.csrf if session else None,
                "idle_s": self.sessions.idle_s}

    async def _session(self, request: web.Request) -> web.StreamResponse:
        session = self.sessions.get(request.cookies.get(COOKIE))
        if session is None and not self._authenticates:
            session = self.sessions.open(None, "anonymous")
        response = web.json_response(self._view(session))
        if session is not None:
            self._cookie(response, session)
        return response

    async def _sign_in(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get(SIGN_IN_HEADER[0]) != SIGN_IN_HEADER[1]:
            return refusal("PERMISSION_DENIED", f"signing in needs the header {SIGN_IN_HEADER[0]}: "
                                                f"{SIGN_IN_HEADER[1]} (sent by the console's own page)")
        if not self._authenticates:
            return refusal("FAILED_PRECONDITION", "this broker checks no identity: no sign-in needed")
        try:
            body = await read_body(request)
            token = text_field(body, "token").strip()
            # The broker judges the token: UNAUTHENTICATED refuses it; a token it accepts may still be
            # refused this call (PERMISSION_DENIED) and is good for the calls its roles allow.
            try:
                await self._calls.call("BrokerAdmin", "ListNamespaces", admin_pb.Empty(),
                                       admin_pb.NamespaceListResponse, token)
            except ApiError as e:
                if e.grpc_code != "PERMISSION_DENIED":
                    raise
        except ApiError as e:
            return refusal(e.grpc_code, str(e))
        claims = jwt.decode(token, options={"verify_signature": False})  # verified by the broker above
        expires = claims.get("exp")
        session = self.sessions.open(token, str(claims.get("sub", "?")),
                                     float(expires) if isinstance(expires, int | float) else None)
        response = web.json_response(self._view(session))
        self._cookie(response, session)
        return response

    async def _sign_out(self, request: web.Request) -> web.StreamResponse:
        session = self.sessions.get(request.cookies.get(COOKIE))
        if session is not None and not session.csrf_ok(request.headers.get("X-CSRF-Token")):
            return refusal("PERMISSION_DENIED", "signing out needs the session's X-CSRF-Token header")
        if session is not None:
            self.sessions.close(session.id)
        response = web.json_response({"signed_in": False})
        response.del_cookie(COOKIE, path="/")
        return response

    def _guarded(self, handler: Handler) -> Any:
        async def guarded(request: web.Request) -> web.StreamResponse:
            session = self.sessions.get(request.cookies.get(COOKIE))
            if session is None:
                return refusal("UNAUTHENTICATED", "sign in first (the session ended or never began)")
            if request.method != "GET" and not session.csrf_ok(request.headers.get("X-CSRF-Token")):
                return refusal("PERMISSION_DENIED", "a change needs the session's X-CSRF-Token header")
            try:
                result = await handler(request, session)
            except ApiError as e:
                return refusal(e.grpc_code, str(e))
            if isinstance(result, web.StreamResponse):
                return result
            return web.json_response(result)
        return guarded

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html")

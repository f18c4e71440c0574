"""CORS for browser apps on other origins: the same origins the WebSocket's Origin check admits.

A page on another origin calls the HTTP endpoints with `fetch` (the WebRTC offer `POST
/v1/realtime/calls` and its hangup, the ICE servers, `POST /v1/realtime/client_secrets`, ...): the
browser first sends a preflight `OPTIONS` for a request with an `Authorization` header or an
`application/sdp` body, and lets the page read an answer only when it names the page's origin.

The rule is `origin_ok` (server/auth.py): the server's own origins and every `--allow-origin` (`*`:
any). An admitted origin's preflight is answered here (204) before the key check (a browser never
sends credentials on a preflight), and every response to it carries `Access-Control-Allow-Origin`
echoing that origin; an origin not admitted gets no CORS header, and its preflight is refused 403
`origin_not_allowed`. No credentials mode (cookies) is allowed: the key travels in `Authorization`.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.auth import origin_ok

ALLOW_METHODS = "GET, POST, OPTIONS"
# What a page may send: the key, the offer's type, the beta flag, the extensions and the resume token.
ALLOW_HEADERS = "Authorization, Content-Type, OpenAI-Beta, X-Duplex-Extensions, X-Duplex-Resume-Token"
# What a page may read besides the simple headers: the call's URL (its hangup) and a refusal's wait.
EXPOSE_HEADERS = "Location, Retry-After"
MAX_AGE_S = 600  # a preflight's answer is cached this long (Chromium caps it at 7200 s)


def _refused(origin: str) -> bytes:
    return json.dumps({"error": {"type": "invalid_request_error", "code": "origin_not_allowed",
                                 "message": f"origin {origin!r} is not allowed; start the server with "
                                 "--allow-origin ORIGIN"}}).encode()


class CORS:
    """`origins()`: the admitted origins (read per request: the runtime owns the set)."""

    def __init__(self, app: ASGIApp, origins: Callable[[], set[str]]) -> None:
        self.app = app
        self.origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None:  # not a browser's cross-origin request: nothing to add
            await self.app(scope, receive, send)
            return
        admitted = origin_ok(origin, self.origins())
        if scope.get("method") == "OPTIONS" and "access-control-request-method" in headers:
            await self._preflight(origin, admitted, send)
            return
        if not admitted:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                out["Access-Control-Allow-Origin"] = origin
                out["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
                out.add_vary_header("Origin")
            await send(message)

        await self.app(scope, receive, send_with_cors)

    @staticmethod
    async def _preflight(origin: str, admitted: bool, send: Send) -> None:
        if admitted:
            headers = [(b"access-control-allow-origin", origin.encode("latin-1")),
                       (b"access-control-allow-methods", ALLOW_METHODS.encode()),
                       (b"access-control-allow-headers", ALLOW_HEADERS.encode()),
                       (b"access-control-max-age", str(MAX_AGE_S).encode()),
                       (b"vary", b"Origin"), (b"content-length", b"0")]
            await send({"type": "http.response.start", "status": 204, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        body = _refused(origin)
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"vary", b"Origin"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

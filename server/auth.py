"""API-key authentication and browser Origin checks.

Keys come as `Authorization: Bearer KEY` (HTTP and WebSocket), or, for browsers that cannot set
headers on a WebSocket, as a subprotocol `duplex-api-key.KEY` (or OpenAI's
`openai-insecure-api-key.KEY`, so existing Realtime browser clients work unchanged).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

KEY_SUBPROTOCOL_PREFIXES = ("duplex-api-key.", "openai-insecure-api-key.")
RESUME_HEADER = "x-duplex-resume-token"  # a resume token travels here (or in the subprotocol), not in URLs
RESUME_SUBPROTOCOL_PREFIX = "duplex-resume-token."  # browsers cannot set headers on a WebSocket
# Paths anyone may fetch: the static web client holds no data; everything else is API.
PUBLIC_PREFIXES = ("/static/",)
PUBLIC_PATHS = ("/", "/index.html", "/favicon.ico")


def _equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def bearer(headers: Headers) -> str | None:
    value = headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def subprotocol_key(protocols: Iterable[str]) -> str | None:
    for proto in protocols:
        for prefix in KEY_SUBPROTOCOL_PREFIXES:
            if proto.startswith(prefix):
                return proto[len(prefix):]
    return None


def key_ok(expected: str | None, headers: Headers, protocols: Iterable[str] = ()) -> bool:
    if not expected:
        return True
    given = bearer(headers) or subprotocol_key(protocols)
    return given is not None and _equal(given, expected)


def default_origins(host: str, port: int) -> set[str]:
    hosts = {host, "127.0.0.1", "localhost", "[::1]"} if host in ("127.0.0.1", "localhost", "::1") else {host}
    hosts = {f"[{h}]" if ":" in h and not h.startswith("[") else h for h in hosts}
    return {f"{scheme}://{h}:{port}" for h in hosts for scheme in ("http", "https")}


def origin_ok(origin: str | None, allowed: set[str]) -> bool:
    """No Origin header means a non-browser client; browsers always send one."""
    if origin is None:
        return True
    return "*" in allowed or origin.rstrip("/") in allowed


class APIKeyMiddleware:
    """Rejects HTTP requests without the configured key (WebSockets are checked by their endpoint)."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.api_key:
            path = scope.get("path", "")
            public = path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)
            if not public and not key_ok(self.api_key, Headers(scope=scope)):
                response = JSONResponse(
                    {"error": {"type": "invalid_request_error", "code": "invalid_api_key",
                               "message": "missing or wrong API key: send 'Authorization: Bearer <key>'"}},
                    status_code=401, headers={"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def client_id(scope: Scope) -> str:
    """Who a connection is, for the per-client session cap: its address (one API key serves everyone)."""
    client = scope.get("client")
    return f"addr:{client[0]}" if client else "addr:unknown"


def resume_token(conn: HTTPConnection) -> str | None:
    """The resume token a WebSocket or HTTP request (WebRTC offer) carries: the subprotocol
    `duplex-resume-token.TOKEN` (browsers' WebSockets), the `X-Duplex-Resume-Token` header, or, for
    older clients, `?resume_token=` (redacted from the access log: server/cli.py)."""
    for proto in conn.scope.get("subprotocols", ()):
        if proto.startswith(RESUME_SUBPROTOCOL_PREFIX):
            return str(proto[len(RESUME_SUBPROTOCOL_PREFIX):])
    return conn.headers.get(RESUME_HEADER) or conn.query_params.get("resume_token")

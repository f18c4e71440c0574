"""API-key authentication and browser Origin checks.

Keys come as `Authorization: Bearer KEY` (HTTP and WebSocket), or, for browsers that cannot set
headers on a WebSocket, as a subprotocol `duplex-api-key.KEY` (or OpenAI's
`openai-insecure-api-key.KEY`, so existing Realtime browser clients work unchanged).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import urllib.parse
from collections.abc import Iterable
from enum import Enum
from typing import Protocol

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


# What a key or secret may hold: a bearer token's characters (RFC 6750's b64token), so that it travels
# in an Authorization header and a subprotocol, and is written into haproxy.cfg with nothing to escape.
SECRET = re.compile(r"^[A-Za-z0-9._~+/-]{1,4096}=*$")


def check_secret(value: str, what: str) -> str:
    """`value` if it can be a key or secret; else ValueError naming `what` (never the value)."""
    if not SECRET.match(value):
        raise ValueError(f"{what} must be 1-4096 of A-Z, a-z, 0-9 and . _ ~ + / - (then any '='), as a bearer "
                         "token is; e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return value


def read_secret(path: str, what: str) -> str:
    """A key or secret from a file (its first line, without the line's end): argv shows what it holds to
    every user of the host (`ps`), a file only to whom it lets read it."""
    try:
        with open(path, encoding="utf-8") as f:
            value = f.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what}: cannot read {path}: {exc}") from None
    return check_secret(value, f"{what} (in {path})")


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


class EphemeralKeys(Protocol):
    """server/client_secrets.py's ClientSecrets, as the middleware sees it."""

    def authorize_http(self, api_key: str | None, scope: Scope) -> tuple[bool, tuple[str, str] | None]:
        """(whether an ephemeral key may be used here, and the refusal's (code, message) or None)."""


class APIKeyMiddleware:
    """Rejects HTTP requests without the configured key (WebSockets are checked by their endpoint). An
    ephemeral key (server/client_secrets.py) is taken where a browser uses one: the WebRTC offer, which
    spends it, and the ICE servers; it is checked there even on a server without a key of its own."""

    def __init__(self, app: ASGIApp, api_key: str | None, client_secrets: EphemeralKeys | None = None) -> None:
        self.app = app
        self.api_key = api_key
        self.client_secrets = client_secrets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            public = path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)
            refusal = None if public else self._refusal(scope)
            if refusal is not None:
                code, message = refusal
                response = JSONResponse(
                    {"error": {"type": "invalid_request_error", "code": code, "message": message}},
                    status_code=401, headers={"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[str, str] | None:
        """(code, message) when the request may not go on; None when it may."""
        if self.client_secrets is not None:
            applies, refusal = self.client_secrets.authorize_http(self.api_key, scope)
            if applies:
                return refusal
        if self.api_key and not key_ok(self.api_key, Headers(scope=scope)):
            return "invalid_api_key", "missing or wrong API key: send 'Authorization: Bearer <key>'"
        return None


def client_id(scope: Scope) -> str:
    """Who a connection is, for the per-client session cap: its address (one API key serves everyone)."""
    client = scope.get("client")
    return f"addr:{client[0]}" if client else "addr:unknown"


def resume_token(conn: HTTPConnection) -> str | None:
    """The resume token a WebSocket or HTTP request (WebRTC offer) carries: the subprotocol
    `duplex-resume-token.TOKEN` (browsers' WebSockets), the `X-Duplex-Resume-Token` header, or, for
    older clients, `?resume_token=` (redacted from the access log: server/process.py)."""
    for proto in conn.scope.get("subprotocols", ()):
        if proto.startswith(RESUME_SUBPROTOCOL_PREFIX):
            return str(proto[len(RESUME_SUBPROTOCOL_PREFIX):])
    return conn.headers.get(RESUME_HEADER) or conn.query_params.get("resume_token")


# A query parameter `name=value`: the name as sent (percent-encoded or not), up to its value's end.
_QUERY_PARAM = re.compile(r"([^?&;=\s\"']+)=([^&;\s\"']*)")
_SECRET_PARAMS = frozenset({"resume_token", "api_key", "key", "token"})


def redact_query(text: str) -> str:
    """`text` (a log line's path, its arguments) with the values of secret query parameters replaced by
    `<redacted>`; a parameter's name is compared as the server parses it (`resume%5Ftoken` is
    `resume_token`)."""
    if "=" not in text:
        return text

    def one(m: re.Match[str]) -> str:
        name = urllib.parse.unquote_plus(m.group(1)).lower()
        return f"{m.group(1)}=<redacted>" if name in _SECRET_PARAMS else m.group(0)

    return _QUERY_PARAM.sub(one, text)


# -- resume tokens ----------------------------------------------------------------------------------
# A token is `REPLICA.RANDOM` or, with a cluster secret, `REPLICA.RANDOM.MAC`. The replica id comes
# first so that a proxy can route a resume on the token's prefix alone (deploy/haproxy.py); the MAC
# (HMAC-SHA256 over `REPLICA.RANDOM`, shared by every replica) means a client can neither forge a
# token nor re-label one to pick a replica. The random part alone (24 bytes) is what makes a token
# unguessable; the MAC adds that only a replica can have made it.
REPLICA_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")  # what haproxy server names and tokens can both hold
_MAC_CHARS = 22  # 16 bytes of the digest, base64url without padding


class TokenCheck(Enum):
    OURS = "ours"  # well-formed, MAC verified (when there is a secret), names this replica
    FORGED = "forged"  # malformed, or its MAC does not verify: no replica made it
    FOREIGN = "foreign"  # genuine, made by another replica


def new_replica_id() -> str:
    return "r" + secrets.token_hex(3)


class ResumeTokens:
    """Mints and checks this replica's resume tokens. Without a secret a token is only a random
    string (prefixed with the replica id) looked up in the registry, as on a single server."""

    def __init__(self, replica_id: str, secret: str | None = None) -> None:
        if not REPLICA_ID.match(replica_id):
            raise ValueError(f"replica id must be 1-32 of a-z, 0-9 and '-', starting with a letter or digit; "
                             f"got {replica_id!r}")
        self.replica_id = replica_id
        self._key = secret.encode() if secret else None

    def _mac(self, body: str) -> str:
        assert self._key is not None
        digest = hmac.new(self._key, body.encode(), hashlib.sha256).digest()[:16]
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def mint(self) -> str:
        body = f"{self.replica_id}.{secrets.token_urlsafe(24)}"
        return f"{body}.{self._mac(body)}" if self._key is not None else body

    def check(self, token: str) -> TokenCheck:
        """Whether `token` can be one of ours; constant-time on the MAC. Registry lookup comes after."""
        if self._key is None:
            return TokenCheck.OURS  # nothing to verify: an unknown token is simply not in the registry
        replica, dot, rest = token.partition(".")
        body_rest, dot2, mac = rest.rpartition(".")
        if not dot or not dot2 or not body_rest or len(mac) != _MAC_CHARS:
            return TokenCheck.FORGED
        if not hmac.compare_digest(mac.encode(), self._mac(f"{replica}.{body_rest}").encode()):
            return TokenCheck.FORGED
        return TokenCheck.OURS if replica == self.replica_id else TokenCheck.FOREIGN


def session_id_prefix(replica_id: str) -> str:
    """Session ids start with this (`sess_ID_`), so that a proxy routes a request naming a session (a
    WebRTC call's hangup) to the replica that holds it; '_' never occurs in a replica id."""
    return f"sess_{replica_id}_"


def token_replica(token: str) -> str:
    """The replica id a token names (its prefix); not verified."""
    return token.partition(".")[0]

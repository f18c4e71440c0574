"""Ephemeral keys (client secrets), minted the way the OpenAI API mints them, for browser apps.

A browser app must not hold the server's key. Its own backend asks, with the key,

    POST /v1/realtime/client_secrets   {"expires_after": {"anchor": "created_at", "seconds": N},
                                        "session": {...}}           (both optional)
    200 {"value": "ek_...", "expires_at": <unix s>, "session": {...}}

and hands `value` to the page, which opens ONE session with it as its bearer: `Authorization: Bearer
ek_...` or the subprotocol `openai-insecure-api-key.ek_...` (`duplex-api-key.ek_...`) on the WebSocket
`/v1/realtime`, `Authorization` on the WebRTC offer `POST /v1/realtime/calls` (which also lets it read
`GET /v1/realtime/calls/ice` first without spending it); GPT-Live takes them the same way, on its WebSocket
`/v1/live/sessions` and its WebRTC `POST /v1/live/sessions` (a live session has no use for the
Realtime `session` a key was minted with: it is dropped). A key opens one connection (the OpenAI API's
open as many as they like until they expire): used, it is spent; a resume needs a new one. It is good
for `--ephemeral-key-ttl` seconds (a shorter `expires_after.seconds` is kept; a longer one is cut to
it); a late one is refused 401 `client_secret_expired`, a spent one `client_secret_used`.

Keys are `ek_`, the minting replica's id and a dot, then 32 random bytes (secrets.token_urlsafe): the
replica holds the key, so behind the cluster's proxy a connection that carries it is routed to that
replica, as a resume token is (deploy/haproxy.py; the id is no secret, the random part is). Keys are
kept in memory only as their SHA-256 (a heap dump or a debugger shows no usable key), at most MAX_KEYS
at once: minting evicts expired keys first and past the cap is refused (429). Nothing here logs a key.
A key is checked whether or not the server has a key of its own: a client that presents one gets it
checked and spent.

The `session` given at minting is validated then (the checks of `session.update`), reported back, and
kept with the key; once the key is redeemed, the transport hands it to its connection
(`hand_over`) and the connection takes it (`take(conn)`) to apply before `session.created`.
"""

from __future__ import annotations

import hashlib
import secrets
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import Scope

from server import protocol as p
from server._session_update import updated_settings
from server.auth import bearer, key_ok, origin_ok, subprotocol_key
from server.protocol import ProtocolError
from server.sessions import SessionSettings

PREFIX = "ek_"
PATH = "/v1/realtime/client_secrets"
MAX_KEYS = 10_000  # keys held at once (live, and spent or expired ones kept to say why they are refused)
RETAIN_S = 600.0  # a spent or expired key is remembered this long past its expiry (then it is only unknown)
MAX_TTL_S = 7200.0  # the OpenAI API's longest expires_after


class Verdict(Enum):
    OK = "ok"
    WRONG = "wrong"  # not the server's key, and not an ephemeral one
    UNKNOWN = "unknown"  # an ephemeral key this server never minted (or forgot: RETAIN_S)
    SPENT = "spent"
    EXPIRED = "expired"


WRONG_KEY = "missing or wrong API key: send 'Authorization: Bearer <key>'"
# Each refusal's error code and message (HTTP 401, or the WebSocket handshake's 401).
REFUSALS = {
    Verdict.WRONG: ("invalid_api_key", WRONG_KEY),
    Verdict.UNKNOWN: ("invalid_api_key", "unknown ephemeral key: mint one with POST /v1/realtime/client_secrets"),
    Verdict.SPENT: ("client_secret_used", "this ephemeral key was already used: each key opens one session; "
                    "mint a new one"),
    Verdict.EXPIRED: ("client_secret_expired", "this ephemeral key expired before it was used; mint a new one "
                      "just before connecting"),
}
# Where an ephemeral key is taken over HTTP, and whether it is spent there: the WebRTC offer opens the
# session; the ICE servers are read before it.
HTTP_USES = {("POST", "/v1/realtime/calls"): True, ("POST", "/v1/live/sessions"): True,
             ("GET", "/v1/realtime/calls/ice"): False}
SCOPE_KEY = "duplex.client_secret"  # the redeemed key, in the offer's scope, for its session config


class Full(Exception):
    """MAX_KEYS live keys are held: none is minted until some expire or are used."""


@dataclass
class _Grant:
    deadline: float  # monotonic: usable before it
    session: dict[str, Any] | None  # the config given at minting; None once taken
    spent: bool = False


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def is_ephemeral(key: str | None) -> bool:
    return key is not None and key.startswith(PREFIX)


class ClientSecrets:
    """This process's ephemeral keys. `clock`: monotonic seconds (tests may pass their own)."""

    def __init__(self, ttl_s: float, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic, replica_id: str = "") -> None:
        self.ttl_s = ttl_s
        self.prefix = f"{PREFIX}{replica_id}." if replica_id else PREFIX  # what the proxy routes on
        self.max_keys = max_keys
        self._clock = clock
        self._grants: dict[bytes, _Grant] = {}

    def __len__(self) -> int:
        return len(self._grants)

    def mint(self, session: dict[str, Any] | None = None, seconds: float | None = None) -> tuple[str, int]:
        """A new key and its expiry (unix seconds); Full past the cap. `seconds` is cut to the TTL."""
        now = self._clock()
        life = self.ttl_s if seconds is None else min(float(seconds), self.ttl_s)
        if len(self._grants) >= self.max_keys:
            self._evict(now, now - RETAIN_S)
        if len(self._grants) >= self.max_keys:
            self._evict(now, now)  # under pressure, every expired or spent key goes
        if len(self._grants) >= self.max_keys:
            raise Full(f"{self.max_keys} ephemeral keys are waiting to be used; try again when some expire "
                       f"(they last {self.ttl_s:g} s)")
        key = self.prefix + secrets.token_urlsafe(32)
        self._grants[_digest(key)] = _Grant(now + life, session)
        return key, int(time.time() + life)

    def _evict(self, now: float, before: float) -> None:
        """Forget keys expired before `before`, and spent keys too when `before` is now."""
        self._grants = {d: g for d, g in self._grants.items()
                        if g.deadline >= before and not (g.spent and before >= now)}

    def check(self, key: str) -> Verdict:
        """Whether `key` could open a session now; nothing is spent."""
        grant = self._grants.get(_digest(key))
        if grant is None:
            return Verdict.UNKNOWN
        if grant.spent:
            return Verdict.SPENT
        return Verdict.OK if self._clock() < grant.deadline else Verdict.EXPIRED

    def redeem(self, key: str) -> Verdict:
        """`check`, and when OK the key is spent (its session config waits for `take_config`)."""
        verdict = self.check(key)
        if verdict is Verdict.OK:
            self._grants[_digest(key)].spent = True
        return verdict

    def take_config(self, key: str) -> dict[str, Any] | None:
        """The session config a redeemed key was minted with, once; None without one (or taken)."""
        grant = self._grants.get(_digest(key))
        if grant is None or not grant.spent:
            return None
        config, grant.session = grant.session, None
        return config

    def authorize(self, api_key: str | None, headers: Headers, protocols: Iterable[str] = (),
                  spend: bool = True) -> tuple[Verdict, str | None]:
        """The bearer (header or subprotocol) checked: the server's key, or one of these keys (spent when
        `spend`). Returns the verdict and, for an ephemeral key that passed, the key."""
        if api_key and key_ok(api_key, headers, protocols):  # the server's own key (it may start with ek_ too)
            return Verdict.OK, None
        given = bearer(headers) or subprotocol_key(protocols)
        if given is not None and is_ephemeral(given):
            verdict = self.redeem(given) if spend else self.check(given)
            return verdict, given if verdict is Verdict.OK else None
        return (Verdict.WRONG if api_key else Verdict.OK), None

    def authorize_http(self, api_key: str | None, scope: Scope) -> tuple[bool, tuple[str, str] | None]:
        """For APIKeyMiddleware: (whether an ephemeral key may be used on this request: the offer, the ICE
        servers; else the server's key alone decides, and the refusal's (code, message) or None). A key
        spent here is left in the scope (SCOPE_KEY) for the offer's session config."""
        spend = HTTP_USES.get((scope.get("method", ""), scope.get("path", "")))
        if spend is None:
            return False, None
        verdict, key = self.authorize(api_key, Headers(scope=scope), spend=spend)
        if key is not None and spend:
            scope[SCOPE_KEY] = key
        return True, None if verdict is Verdict.OK else REFUSALS[verdict]


# A redeemed key's session config, from the transport that redeemed it to the connection it made.
_handed: weakref.WeakKeyDictionary[object, dict[str, Any]] = weakref.WeakKeyDictionary()


def hand_over(conn: object, config: dict[str, Any] | None) -> None:
    if config is not None:
        _handed[conn] = config


def take(conn: object) -> dict[str, Any] | None:
    """The session config the connection's ephemeral key was minted with, once (None: none)."""
    return _handed.pop(conn, None)


# -- POST /v1/realtime/client_secrets ---------------------------------------------------------------

MAX_BODY_BYTES = 256 * 1024  # a session's instructions (32,000 characters) and tools (64 kB) fit


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return JSONResponse({"error": {"type": kind, "code": code, "message": message}}, status_code=status,
                        headers=headers)


async def _read_body(request: Request) -> bytes | None:
    """The body, read only up to MAX_BODY_BYTES (None past it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            return None
    return bytes(body)


def _lifetime(value: Any) -> float | None:
    """`expires_after.seconds` (anchor `created_at`, the only one); ValueError if malformed."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("anchor", "created_at") != "created_at":
        raise ValueError("expires_after must be {\"anchor\": \"created_at\", \"seconds\": N}")
    seconds = value.get("seconds")
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
        raise ValueError(f"expires_after.seconds must be a whole number of seconds, 1 or more; got {seconds!r}")
    return float(seconds)


def _session(value: Any) -> dict[str, Any] | None:
    """The session config asked for, checked as `session.update` checks it (ProtocolError, ValueError)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("session must be an object (a realtime session's configuration)")
    if value.get("type", "realtime") != "realtime":
        raise ValueError(f"session.type {value.get('type')!r} is not served here; only 'realtime' sessions")
    updated_settings(value, SessionSettings(), audio_started=False, media_ok=True, eid=None)
    return value


def register_routes(app: FastAPI, store: ClientSecrets) -> None:
    """`POST /v1/realtime/client_secrets`: the server's key is checked by APIKeyMiddleware (server/auth.py)."""

    @app.post(PATH, response_model=None)
    async def create_client_secret(request: Request) -> JSONResponse:
        runtime = request.app.state.runtime
        origin = request.headers.get("origin")
        if not origin_ok(origin, runtime.allowed_origins):
            return _error(403, "origin_not_allowed", f"origin {origin!r} is not allowed; start the server "
                          "with --allow-origin ORIGIN")
        body = await _read_body(request)
        if body is None:
            return _error(413, "request_too_large", f"the request is over {MAX_BODY_BYTES} bytes")
        try:
            params = p.loads_strict(body) if body.strip() else {}
        except ValueError as exc:
            return _error(400, "invalid_json", f"the body is not valid JSON: {exc}")
        if not isinstance(params, dict):
            return _error(400, "invalid_request", "the body must be a JSON object: {\"session\": {...}, "
                          "\"expires_after\": {...}} (both optional)")
        try:
            seconds = _lifetime(params.get("expires_after"))
            session = _session(params.get("session"))
        except ProtocolError as exc:
            return _error(400, exc.code, exc.message)
        except ValueError as exc:
            return _error(400, "invalid_request", str(exc))
        try:
            key, expires_at = store.mint(session, seconds)
        except Full as exc:
            runtime.metrics.client_errors.labels("too_many_client_secrets").inc()
            return _error(429, "too_many_client_secrets", str(exc),
                          {"Retry-After": str(max(1, round(store.ttl_s)))})
        described = {**(session or {}), "type": "realtime", "object": "realtime.session",
                     "id": p.new_id("sess"), "model": runtime.model.name, "expires_at": expires_at}
        return JSONResponse({"value": key, "expires_at": expires_at, "session": described},
                            headers={"Cache-Control": "no-store"})

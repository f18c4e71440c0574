"""New sessions per client address, rate-limited before anything is opened for them.

Every WebSocket (each one opens or resumes a session) and every WebRTC offer (`POST
/v1/realtime/calls`, `POST /v1/live/sessions`) takes a token from its client's bucket
(server/rate_limit.py); without one it is refused at once: a WebSocket with an `error` event
`rate_limited` and close 1013, an offer with 429 and Retry-After. The client is the address uvicorn
puts in the scope, which is a forwarding header's only when it came from a proxy the operator named
(`--forwarded-allow-ips`).
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from server.auth import client_id
from server.protocol import error_event
from server.rate_limit import KeyedBuckets, retry_after

OFFER_PATHS = frozenset({"/v1/realtime/calls", "/v1/live/sessions"})  # the POSTs that open a session
BURST = 10  # sessions a client may open back to back (reconnects after a network change come in bursts)


def _message(wait: float) -> str:
    return (f"too many new sessions from this client address; try again in {retry_after(wait)} s "
            "(the limit per client: --new-sessions-per-minute)")


class NewSessionRateLimit:
    def __init__(self, app: ASGIApp, per_minute: float) -> None:
        self.app = app
        rate = per_minute / 60.0
        self.buckets = KeyedBuckets(rate, max(1.0, min(float(BURST), per_minute))) if per_minute > 0 else None

    def _counts(self, scope: Scope) -> bool:
        if scope["type"] == "websocket":
            return True
        return scope["type"] == "http" and scope.get("method") == "POST" and scope.get("path") in OFFER_PATHS

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.buckets is None or not self._counts(scope):
            await self.app(scope, receive, send)
            return
        wait = self.buckets.take(client_id(scope))
        if not wait:
            await self.app(scope, receive, send)
            return
        event = error_event("rate_limited", _message(wait))
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.send", "text": json.dumps(event)})
            await send({"type": "websocket.close", "code": 1013, "reason": "rate_limited"})
            return
        body = json.dumps({"error": event["error"]}).encode()
        await send({"type": "http.response.start", "status": 429,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"retry-after", retry_after(wait).encode())]})
        await send({"type": "http.response.body", "body": body})

"""The Host header of a server without a key that listens on loopback only: a loopback name, or it is
refused. A web page elsewhere can make the user's browser resolve its own name to 127.0.0.1 (DNS
rebinding) and then read this server as a same-origin page would (`/healthz`, `/metrics`, the TURN
credentials at `/v1/realtime/calls/ice`): its requests carry the page's name in Host. A server with a
key needs none of this (the page has no key); one on another interface needs a key (ServerConfig.check).
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "ip6-localhost"})


def host_name(host: str) -> str:
    """`host[:port]` or `[v6]:port` -> the name, lower-case, without brackets or port."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def allowed_names(bind: str, origins: list[str]) -> frozenset[str]:
    """Loopback names, the interface bound, and the hosts of the browser origins the operator allowed."""
    extra = {host_name(urlsplit(o).netloc) for o in origins if o != "*" and "://" in o}
    return LOOPBACK_NAMES | {host_name(bind)} | extra


class HostCheck:
    def __init__(self, app: ASGIApp, names: frozenset[str]) -> None:
        self.app = app
        self.names = names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = Headers(scope=scope).get("host")
        if host is None or host_name(host) in self.names:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008, "reason": "host_not_allowed"})
            return
        body = json.dumps({"error": {"type": "invalid_request_error", "code": "host_not_allowed",
                                     "message": "this server answers only to a loopback host name (or set an "
                                     "API key)"}}).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

"""The door of a WebSocket API endpoint: what `/v1/realtime` and `/v1/live/sessions` check before the
upgrade, and how a connection's tasks end, in one place so that the two protocols cannot drift apart.

The page's origin must be one `--allow-origin` admits (or the server's own); the key is the server's,
or an ephemeral one (server/client_secrets.py), spent here: one key, one connection. A refusal is an
HTTP answer with the protocol's error body (a client sees why), or a close where the server cannot
send one; it is counted per protocol (server/metrics.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

from server import client_secrets
from server.auth import KEY_SUBPROTOCOL_PREFIXES, RESUME_SUBPROTOCOL_PREFIX, origin_ok
from server.runtime import Runtime

CLOSE_POLICY = 1008

ErrorBody = Callable[[str, str], dict[str, Any]]  # (code, message) -> the protocol's `{"error": ...}`


@dataclass(frozen=True)
class Admitted:
    offered: list[str]  # the subprotocols the client offered (keys and tokens among them)
    ephemeral: str | None  # the ephemeral key the connection spent, if it came with one


async def admit(ws: WebSocket, protocol: str, error_body: ErrorBody, key_hint: str = "") -> Admitted | None:
    """The origin and key checks; None when the upgrade was refused (the answer is sent)."""
    runtime: Runtime = ws.app.state.runtime
    offered = list(ws.scope.get("subprotocols", []))
    if not origin_ok(ws.headers.get("origin"), runtime.allowed_origins):
        runtime.metrics.client_error("origin_not_allowed", protocol)
        await deny(ws, 403, error_body("origin_not_allowed", f"origin {ws.headers.get('origin')!r} is not allowed; "
                                       "start the server with --allow-origin ORIGIN"))
        return None
    store: client_secrets.ClientSecrets = ws.app.state.client_secrets
    verdict, ephemeral = store.authorize(runtime.config.api_key, ws.headers, offered)
    if verdict is not client_secrets.Verdict.OK:
        code, message = client_secrets.REFUSALS[verdict]
        if verdict is client_secrets.Verdict.WRONG:
            message += key_hint
        runtime.metrics.client_error(code, protocol)
        await deny(ws, 401, error_body(code, message))
        return None
    return Admitted(offered, ephemeral)


def plain_subprotocols(offered: list[str]) -> list[str]:
    """The subprotocols the server may answer with: never a key's or a resume token's."""
    return [x for x in offered if not x.startswith((*KEY_SUBPROTOCOL_PREFIXES, RESUME_SUBPROTOCOL_PREFIX))]


async def deny(ws: WebSocket, status: int, body: dict[str, Any]) -> None:
    """Refuse the upgrade with an HTTP status and `body`."""
    try:
        await ws.send_denial_response(JSONResponse(body, status_code=status))
    except RuntimeError:  # a server without the denial-response extension: a plain close (HTTP 403)
        await ws.close(CLOSE_POLICY, str(body.get("error", {}).get("message", ""))[:120])


CLOSE_CODE_WAIT_S = 0.5  # how long a connection whose writer failed waits for the client's close code


async def first_to_end(reader: asyncio.Task[int], writer: asyncio.Task[None],
                       cut: asyncio.Task[bool]) -> set[asyncio.Task[Any]]:
    """Wait for the first of a connection's reader, writer and cut to end (both WebSocket protocols).

    When the server stops meanwhile, all three are cancelled and retrieved with it. When the writer saw
    the socket go first, the client's close frame may be right behind: the reader gets a moment to read
    its code (1000, a goodbye, ends the session now; lost, the session would wait out its resume grace).
    """
    tasks: set[asyncio.Task[Any]] = {reader, writer, cut}
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    if writer in done and reader not in done:
        await asyncio.wait({reader}, timeout=CLOSE_CODE_WAIT_S)
    return done

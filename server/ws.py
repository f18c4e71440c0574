"""WebSocket endpoint `/v1/realtime`: authentication, admission, then a reader and a writer task."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from server import protocol as p
from server.auth import KEY_SUBPROTOCOL_PREFIXES, key_ok, origin_ok
from server.realtime import Close, RealtimeConnection
from server.runtime import Runtime
from server.sessions import RegistryFull

log = logging.getLogger(__name__)

CLOSE_TRY_AGAIN_LATER = 1013
CLOSE_POLICY = 1008
NORMAL_CLOSURE = 1000  # a client closing with this ends its session; any other close keeps it resumable


async def _deny(ws: WebSocket, status: int, code: str, message: str) -> None:
    """Refuse the handshake with an HTTP status and a JSON body naming the problem."""
    body = JSONResponse({"error": {"type": "invalid_request_error", "code": code, "message": message}},
                        status_code=status)
    try:
        await ws.send_denial_response(body)
    except RuntimeError:  # server without the denial-response extension: a plain close (HTTP 403)
        await ws.close(CLOSE_POLICY, message[:120])


def _pick_subprotocol(offered: list[str]) -> str | None:
    """Answer with a non-secret protocol the client offered ('realtime' first), never the key one."""
    plain = [proto for proto in offered if not proto.startswith(KEY_SUBPROTOCOL_PREFIXES)]
    return "realtime" if "realtime" in plain else (plain[0] if plain else None)


def _wants_beta(ws: WebSocket, offered: list[str]) -> bool:
    """Clients of the Realtime beta say so with a header, or (browsers) a subprotocol."""
    return "realtime=v1" in ws.headers.get("openai-beta", "") or "openai-beta.realtime-v1" in offered


async def realtime_endpoint(ws: WebSocket) -> None:
    runtime: Runtime = ws.app.state.runtime
    offered = list(ws.scope.get("subprotocols", []))
    if not origin_ok(ws.headers.get("origin"), runtime.allowed_origins):
        runtime.metrics.client_errors.labels("origin_not_allowed").inc()
        await _deny(ws, 403, "origin_not_allowed", f"origin {ws.headers.get('origin')!r} is not allowed; "
                    "start the server with --allow-origin ORIGIN")
        return
    if not key_ok(runtime.config.api_key, ws.headers, offered):
        runtime.metrics.client_errors.labels("invalid_api_key").inc()
        await _deny(ws, 401, "invalid_api_key", "missing or wrong API key: send 'Authorization: Bearer <key>' "
                    "or the subprotocol 'duplex-api-key.<key>'")
        return
    await ws.accept(subprotocol=_pick_subprotocol(offered))
    if runtime.draining:
        await _refuse(ws, CLOSE_TRY_AGAIN_LATER, "server_shutting_down", "server is shutting down; reconnect later")
        return
    registry, engine = runtime.registry, runtime.engine
    assert registry is not None and engine is not None
    token = ws.query_params.get("resume_token")
    conn: RealtimeConnection
    if token:
        resumed = registry.resumable(token)
        if resumed is None:
            await _refuse(ws, CLOSE_POLICY, "invalid_resume_token",
                          "resume token is unknown, expired or already in use; open a new session")
            return
        conn = RealtimeConnection(runtime, resumed, resumed=True, beta=_wants_beta(ws, offered))
        conn.hello()
        registry.resume(token, conn)
        engine.resumed(resumed)
    else:
        try:
            session = await runtime.open_session()
        except RegistryFull as exc:
            runtime.metrics.sessions_refused.inc()
            await _refuse(ws, CLOSE_TRY_AGAIN_LATER, "server_full", str(exc))
            return
        conn = RealtimeConnection(runtime, session, beta=_wants_beta(ws, offered))
        session.sink = conn
        conn.hello()
        engine.add(session)
    await _serve(ws, conn, runtime)


async def _refuse(ws: WebSocket, code: int, err: str, message: str) -> None:
    with contextlib.suppress(Exception):
        await ws.send_text(json.dumps(p.error_event(err, message)))
        await ws.close(code, message[:120])


async def _serve(ws: WebSocket, conn: RealtimeConnection, runtime: Runtime) -> None:
    writer = asyncio.create_task(_write(ws, conn), name=f"ws-writer-{conn.session.id}")
    reader = asyncio.create_task(_read(ws, conn), name=f"ws-reader-{conn.session.id}")
    done, _ = await asyncio.wait({writer, reader}, return_when=asyncio.FIRST_COMPLETED)
    for task in (reader, writer):
        if task not in done:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
            await task
    session = conn.session
    if not session.closed and session.sink is conn:
        assert runtime.registry is not None
        code = reader.result() if reader.done() and not reader.cancelled() and reader.exception() is None else None
        if code == NORMAL_CLOSURE:
            # The client said goodbye: free its model state (and its admission slot) now.
            await runtime.registry.close(session)
        else:
            # The connection dropped (or the client asked to come back): keep the session for the grace period.
            runtime.registry.detach(session)
    with contextlib.suppress(Exception):
        if ws.application_state is not WebSocketState.DISCONNECTED:
            await ws.close()


async def _read(ws: WebSocket, conn: RealtimeConnection) -> int:
    """Feed client messages to the connection; returns the client's close code."""
    while True:
        msg = await ws.receive()
        if msg["type"] == "websocket.disconnect":
            return int(msg.get("code", 1006))
        if msg.get("text") is not None:
            await conn.handle_text(msg["text"])
        elif msg.get("bytes") is not None:
            await conn.handle_audio_bytes(msg["bytes"])


async def _write(ws: WebSocket, conn: RealtimeConnection) -> None:
    while True:
        item = await conn.outbox.get()
        if isinstance(item, Close):
            await ws.close(item.code, item.reason[:120])
            return
        await ws.send_text(json.dumps(item, separators=(",", ":")))

"""WebSocket endpoint `/v1/live/sessions`: the checks `/v1/realtime` makes, then a reader and a writer.

Origins and the API key are checked before the upgrade by the door `/v1/realtime` uses
(server/ws_door.py); an ephemeral key is spent there too: one key, one connection. Admission,
per-client caps and resume happen at `session.start`, in `Runtime.attach`. A client that asks for
duplex's extensions (server/extensions.py) may send camera frames. A resume token (header
`X-Duplex-Resume-Token` or subprotocol `duplex-resume-token.TOKEN`) makes that `session.start` resume
the session instead of opening one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from server import client_secrets
from server.auth import client_id, resume_token
from server.extensions import wants_extensions
from server.live.connection import LiveConnection
from server.live.events import error_event
from server.outbox import Close
from server.runtime import Runtime
from server.sessions import Ended
from server.ws_door import admit, first_to_end, plain_subprotocols

log = logging.getLogger(__name__)

PATH = "/v1/live/sessions"
NORMAL_CLOSURE = 1000
CUT_CLOSE_SECONDS = 10.0  # a client cut for not reading has this long to take its close frame


def _subprotocol(offered: list[str]) -> str | None:
    """GPT-Live clients offer none; a browser's key or resume subprotocol is never echoed."""
    plain = plain_subprotocols(offered)
    return plain[0] if plain else None


def _error_body(code: str, message: str) -> dict[str, object]:
    return {"error": error_event(code, message)["error"]}


async def live_endpoint(ws: WebSocket) -> None:
    runtime: Runtime = ws.app.state.runtime
    admitted = await admit(ws, "live", _error_body)
    if admitted is None:
        return
    if admitted.ephemeral is not None:
        # Minted with a Realtime session's configuration, which a live session has no use for: dropped
        # (a GPT-Live client configures its session in session.start).
        store: client_secrets.ClientSecrets = ws.app.state.client_secrets
        store.take_config(admitted.ephemeral)
    offered = admitted.offered
    await ws.accept(subprotocol=_subprotocol(offered))
    conn = LiveConnection(runtime, client_id(ws.scope), resume_token(ws), wants_extensions(ws.headers, offered))
    await _serve(ws, conn, runtime)


async def _serve(ws: WebSocket, conn: LiveConnection, runtime: Runtime) -> None:
    heard = asyncio.Event()  # the client spoke after its session.started: it has the resume token
    writer = asyncio.create_task(_write(ws, conn), name="live-writer")
    reader = asyncio.create_task(_read(ws, conn, heard), name="live-reader")
    cut = asyncio.create_task(conn.cut.wait(), name="live-cut")
    done = await first_to_end(reader, writer, cut)
    if cut in done and not writer.done():
        # Resumable at once, while the writer gets a bounded time to deliver the close frame and reason.
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
            await reader
        await _detach(conn, runtime, None, heard)
        await asyncio.wait({writer}, timeout=CUT_CLOSE_SECONDS)
    for task in (reader, writer, cut):
        if task not in done and not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
            await task
    code = reader.result() if reader.done() and not reader.cancelled() and reader.exception() is None else None
    if code is None and reader.done() and not reader.cancelled() and reader.exception() is not None:
        log.error("live connection: reader failed", exc_info=reader.exception())
    await _detach(conn, runtime, code, heard)
    conn.release()
    with contextlib.suppress(Exception):
        if ws.application_state is not WebSocketState.DISCONNECTED:
            await asyncio.wait_for(ws.close(1008 if conn.cut.is_set() else NORMAL_CLOSURE), 1.0)


async def _detach(conn: LiveConnection, runtime: Runtime, code: int | None, heard: asyncio.Event) -> None:
    """A goodbye (session.close, or a normal close) ends the session; a drop keeps it for its resume."""
    session = conn.session
    if session is None:
        return
    if conn.said_goodbye or code == NORMAL_CLOSURE:
        ended = Ended.GOODBYE
    else:
        ended = Ended.DROPPED if heard.is_set() else Ended.UNCONFIRMED
    await runtime.detach(session, conn, ended)


async def _read(ws: WebSocket, conn: LiveConnection, heard: asyncio.Event) -> int:
    """Feed client messages to the connection; returns the client's close code."""
    while True:
        msg = await ws.receive()
        if msg["type"] == "websocket.disconnect":
            return int(msg.get("code", 1006))
        if conn.session is not None:
            heard.set()
        if msg.get("text") is not None:
            await conn.handle_text(msg["text"])
        elif msg.get("bytes") is not None:
            conn.handle_binary()


async def _write(ws: WebSocket, conn: LiveConnection) -> None:
    while True:
        item = await conn.outbox.get()
        if isinstance(item, Close):
            await ws.close(item.code, item.reason[:120])
            return
        await ws.send_text(item)

"""WebSocket endpoint `/v1/realtime`: authentication, then `Runtime.attach`, then a reader and a writer task.

The resume token comes in the `X-Duplex-Resume-Token` header or (browsers) the subprotocol
`duplex-resume-token.TOKEN`; `?resume_token=` still works for older clients (server/auth.py reads
all three, for WebRTC too).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from server import client_secrets
from server import protocol as p
from server.auth import client_id, resume_token
from server.extensions import wants_extensions
from server.outbox import Close
from server.realtime import RealtimeConnection
from server.runtime import Refused, Runtime
from server.sessions import Ended, Pace, Session
from server.ws_door import CLOSE_POLICY, admit, first_to_end, plain_subprotocols
from streaming.types import SAMPLE_RATE, TICK_SAMPLES, TICK_SECONDS

log = logging.getLogger(__name__)

CUT_CLOSE_SECONDS = 10.0  # a client cut for not reading has this long to read its close frame (uvicorn's close timeout)
NORMAL_CLOSURE = 1000  # a client closing with this ends its session; any other close keeps it resumable
TICK_MS = round(TICK_SECONDS * 1000)
OUTPUT_STALL_S = 5.0  # a media-pace client that reads nothing this long is no longer waited for (OutputRoom)


def _pick_subprotocol(offered: list[str]) -> str | None:
    """Answer with a non-secret protocol the client offered ('realtime' first), never the key one."""
    plain = plain_subprotocols(offered)
    return "realtime" if "realtime" in plain else (plain[0] if plain else None)


def _error_body(code: str, message: str) -> dict[str, object]:
    return {"error": {"type": "invalid_request_error", "code": code, "message": message}}


def _wants_beta(ws: WebSocket, offered: list[str]) -> bool:
    """Clients of the Realtime beta say so with a header, or (browsers) a subprotocol."""
    return "realtime=v1" in ws.headers.get("openai-beta", "") or "openai-beta.realtime-v1" in offered


async def realtime_endpoint(ws: WebSocket) -> None:
    runtime: Runtime = ws.app.state.runtime
    admitted = await admit(ws, "realtime", _error_body, " or the subprotocol 'duplex-api-key.<key>'")
    if admitted is None:
        return
    offered, ephemeral = admitted.offered, admitted.ephemeral
    store: client_secrets.ClientSecrets = ws.app.state.client_secrets
    await ws.accept(subprotocol=_pick_subprotocol(offered))
    conn = RealtimeConnection(runtime, beta=_wants_beta(ws, offered), extensions=wants_extensions(ws.headers, offered))
    if ephemeral is not None:  # the session config it was minted with, for the connection to apply
        client_secrets.hand_over(conn, store.take_config(ephemeral))
    token = resume_token(ws)
    try:
        session = await runtime.attach(conn, token, client_id(ws.scope))
    except Refused as exc:
        runtime.metrics.client_errors.labels(exc.code).inc()
        await _refuse(ws, exc.ws_close, exc.code, exc.message)
        return
    conn.emit(input_window(runtime.config.max_backlog_ticks))
    await _serve(ws, conn, session, runtime)


def input_window(backlog_ticks: int) -> dict[str, object]:
    """How far ahead of the server a client may send (docs/long-sessions.md): in media pace, audio sent
    past the micro-turns answered so far plus this window waits unread in the network (the server does
    not read it until there is room), in real time the oldest input past it is dropped."""
    return {"type": "duplex.input.window", "event_id": p.new_id("event"), "window_ms": backlog_ticks * TICK_MS,
            "window_samples": backlog_ticks * TICK_SAMPLES, "sample_rate": SAMPLE_RATE}


async def _refuse(ws: WebSocket, code: int, err: str, message: str) -> None:
    with contextlib.suppress(Exception):
        await ws.send_text(json.dumps(p.error_event(err, message)))
        await ws.close(code, message[:120])


class OutputRoom:
    """Media pace's back-pressure on output: a client that sends a long file at once and reads its answers
    more slowly than the model makes them would fill its outbox and be cut for not reading. Its input is
    not read (so not stepped) while its outbox is over half full, until the writer has sent it down to a
    quarter. A client that reads nothing at all (no event sent for OUTPUT_STALL_S) is not waited for:
    its input flows again and it is cut as any client that does not read. Real-time clients are not held
    (their micro-turns come on the clock)."""

    def __init__(self, conn: RealtimeConnection) -> None:
        self._conn = conn
        self._room = asyncio.Event()
        self._room.set()
        self._sent = 0  # events the writer handed to the transport
        self._stalled = False  # the client read nothing for OUTPUT_STALL_S: not waited for until it does

    def sent(self) -> None:
        """The writer handed an event to the transport."""
        self._sent += 1
        self._stalled = False
        if self._conn.outbox.bytes <= self._conn.outbox.max_bytes // 4:
            self._room.set()

    async def wait(self) -> None:
        conn = self._conn
        if (self._stalled or conn.session.settings.pace is not Pace.MEDIA
                or conn.outbox.bytes <= conn.outbox.max_bytes // 2):
            return
        self._room.clear()
        while not self._room.is_set() and not conn.cut.is_set():
            before = self._sent
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), OUTPUT_STALL_S)
            if self._sent == before and not self._room.is_set():
                self._stalled = True
                return


async def _serve(ws: WebSocket, conn: RealtimeConnection, session: Session, runtime: Runtime) -> None:
    heard = asyncio.Event()  # the client sent something on this connection
    room = OutputRoom(conn)
    writer = asyncio.create_task(_write(ws, conn, room), name=f"ws-writer-{session.id}")
    reader = asyncio.create_task(_read(ws, conn, heard, room), name=f"ws-reader-{session.id}")
    # A client cut for not reading: its writer may be stuck in a send that never completes, so the
    # cut itself ends the connection.
    cut = asyncio.create_task(conn.cut.wait(), name=f"ws-cut-{session.id}")
    done = await first_to_end(reader, writer, cut)
    if cut in done and not writer.done():
        # The session is resumable at once (the client may be reconnecting already), while the writer,
        # whose outbox now holds only the Close, gets a bounded time to hand the client its close frame
        # and reason: a client that reads again within CUT_CLOSE_SECONDS learns why it was cut.
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
            await reader
        await runtime.detach(session, conn, _dropped(heard))
        draining = asyncio.create_task(runtime.drained.wait(), name=f"ws-drain-{session.id}")
        await asyncio.wait({writer, draining}, timeout=CUT_CLOSE_SECONDS, return_when=asyncio.FIRST_COMPLETED)
        draining.cancel()  # a shutdown does not wait for a client that does not read
    for task in (reader, writer, cut):
        if task not in done and not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
            await task
    code = reader.result() if reader.done() and not reader.cancelled() and reader.exception() is None else None
    if code is None and reader.done() and not reader.cancelled() and reader.exception() is not None:
        log.error("session %s: reader failed", session.id, exc_info=reader.exception())
    # The client said goodbye (1000); any other end is a drop (or the server cut a client that does not read).
    await runtime.detach(session, conn, Ended.GOODBYE if code == NORMAL_CLOSURE else _dropped(heard))
    conn.release()
    with contextlib.suppress(Exception):
        if ws.application_state is not WebSocketState.DISCONNECTED:
            # Bounded: a client that does not read may never take the close frame either.
            await asyncio.wait_for(ws.close(CLOSE_POLICY if conn.cut.is_set() else 1000), 1.0)


def _dropped(heard: asyncio.Event) -> Ended:
    """A client that never spoke on this connection may never have got its greeting (a flaky network drops
    the new connection too): unconfirmed, so the runtime keeps the token it came with working."""
    return Ended.DROPPED if heard.is_set() else Ended.UNCONFIRMED


async def _read(ws: WebSocket, conn: RealtimeConnection, heard: asyncio.Event, room: OutputRoom) -> int:
    """Feed client messages to the connection; returns the client's close code."""
    while True:
        await room.wait()
        msg = await ws.receive()
        if msg["type"] == "websocket.disconnect":
            return int(msg.get("code", 1006))
        heard.set()
        if msg.get("text") is not None:
            await conn.handle_text(msg["text"])
        elif msg.get("bytes") is not None:
            await conn.handle_audio_bytes(msg["bytes"])


async def _write(ws: WebSocket, conn: RealtimeConnection, room: OutputRoom) -> None:
    while True:
        item = await conn.outbox.get()
        if isinstance(item, Close):
            await ws.close(item.code, item.reason[:120])
            return
        await ws.send_text(item)
        room.sent()

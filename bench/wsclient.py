"""The WebSocket client every bench opens its sessions with.

One way to connect (the server's API key from $DUPLEX_API_KEY, a resume token in a header and never in
the URL, room for large events), to read a session's two opening events and to set the session; each
bench keeps only what it measures. websockets' own exceptions pass through: a bench counts a refused
handshake (`InvalidStatus`) or a closed connection (`ConnectionClosed`) as its figures need.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from server.auth import RESUME_HEADER
from server.extensions import HEADER as EXTENSIONS_HEADER

Event = dict[str, Any]

# An audio delta is ~13 kB; pictures and extension events are larger.
MAX_SIZE = 16 << 20


def auth_headers() -> dict[str, str]:
    """The server's API key from $DUPLEX_API_KEY (the variable `duplex serve` reads), when set."""
    key = os.environ.get("DUPLEX_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def open_session(url: str, resume_token: str | None = None, headers: dict[str, str] | None = None,
                 open_timeout: float = 20.0, max_size: int | None = MAX_SIZE) -> connect:
    """A connection to `url`, to await or to use with `async with`. No keepalive pings: a bench's clock
    is the audio it sends, and a ping answered late would close a session the bench means to measure."""
    extra = {**auth_headers(), EXTENSIONS_HEADER: "1", **(headers or {})}  # resume, ticks, duplex.* events
    if resume_token:
        extra[RESUME_HEADER] = resume_token
    return connect(url, additional_headers=extra, max_size=max_size, open_timeout=open_timeout, ping_interval=None)


async def send(ws: ClientConnection, event: Event) -> None:
    await ws.send(json.dumps(event))


async def set_session(ws: ClientConnection, **fields: Any) -> None:
    """Send a `session.update` with `fields` (e.g. pace="realtime"); the answer comes among the events."""
    await send(ws, {"type": "session.update", "session": fields})


async def recv_event(ws: ClientConnection, timeout: float = 10.0) -> Event:
    """The next JSON event (binary frames are skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        msg = await asyncio.wait_for(ws.recv(), max(0.0, deadline - time.monotonic()))
        if isinstance(msg, str):
            event: Event = json.loads(msg)
            return event


async def recv_until(ws: ClientConnection, etype: str, timeout: float = 10.0) -> tuple[Event, list[Event]]:
    """Read events until one of type `etype`; returns it and everything read before it."""
    seen: list[Event] = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no {etype!r} within {timeout}s; saw {[e.get('type') for e in seen][-20:]}")
        ev = await recv_event(ws, left)
        if ev.get("type") == etype:
            return ev, seen
        seen.append(ev)


async def opening(ws: ClientConnection, timeout: float = 10.0) -> tuple[Event, Event | None]:
    """The session's first two events: `session.created` and `duplex.session.resume` (its id and token).
    A refusal (an `error` first, e.g. server_full) comes back as (error, None)."""
    first = await recv_event(ws, timeout)
    if first.get("type") == "error":
        return first, None
    return first, await recv_event(ws, timeout)


async def start(url: str, timeout: float = 10.0, **fields: Any) -> tuple[ClientConnection, Event]:
    """Open a session, read its opening events and, given `fields`, set them and wait for
    `session.updated`: the connection and its `duplex.session.resume` event (id, resume token)."""
    ws = await open_session(url)
    first, resume = await opening(ws, timeout)
    if resume is None:
        await ws.close()
        raise ConnectionRefusedError(f"{url} refused the session: {first.get('error')}")
    if fields:
        await set_session(ws, **fields)
        await recv_until(ws, "session.updated", timeout)
    return ws, resume

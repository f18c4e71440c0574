"""A long recording sent at once at media pace: the server's keepalive does not cut the client while the
server itself is not reading (back-pressure), and the client is told how far ahead it may send."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed

from tests.wsclient import TICK, open_ws, recv_event, recv_until, send

MINUTES = 15
N_TICKS = MINUTES * 60 * 5


async def _stream_all_at_once(url: str) -> tuple[int, int | None, dict[str, object]]:
    """Send the whole recording as fast as the socket takes it (no flow control), read every answer;
    returns (micro-turns answered, close code if the server closed, the input window event)."""
    ws = await open_ws(url, ping_interval=None)  # only the server's keepalive is under test
    assert (await recv_event(ws))["type"] == "session.created"
    assert (await recv_event(ws))["type"] == "duplex.session.resume"
    window = await recv_event(ws)
    await send(ws, {"type": "session.update", "session": {"pace": "media"}})
    await recv_until(ws, "session.updated")
    chunk = (np.arange(TICK, dtype=np.int16) % 2000 + 1).astype("<i2").tobytes()
    answered: set[int] = set()

    async def sender() -> None:
        for _ in range(N_TICKS):
            await ws.send(chunk)

    async def receiver() -> None:
        while len(answered) < N_TICKS:
            msg = await ws.recv()
            if isinstance(msg, str) and '"response.output_audio.delta"' in msg[:60]:
                answered.add(json.loads(msg)["tick"])

    code: int | None = None
    tasks = [asyncio.create_task(sender()), asyncio.create_task(receiver())]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    except Exception:
        code = ws.close_code
        for t in tasks:
            t.cancel()
    await ws.close()
    return len(answered), code, window


async def test_fifteen_minutes_at_once_at_media_pace_are_never_cut_by_keepalive(duplex_server) -> None:
    # Pings every 0.3 s with a 0.3 s deadline: the send pipeline (socket buffers, the inbox) holds far
    # more than 0.3 s of the server's work, so a pong stuck behind unread audio would be judged late.
    server = duplex_server("--model", "echo", "--ws-ping-interval", "0.3", "--ws-ping-timeout", "0.3")
    got, code, window = await _stream_all_at_once(server.ws_url)
    assert code is None, f"the server closed the session ({code}) after {got} of {N_TICKS} micro-turns"
    assert got == N_TICKS
    assert window["type"] == "duplex.input.window"
    assert window["window_ms"] == 10 * 200 and window["window_samples"] == 10 * TICK


async def test_a_client_that_stops_answering_pings_is_still_closed(duplex_server) -> None:
    # The patience applies only while the server holds unread input: a client that sends nothing and
    # answers no ping (its reading stopped) is closed by the keepalive as before.
    server = duplex_server("--model", "echo", "--ws-ping-interval", "0.2", "--ws-ping-timeout", "0.3")
    ws = await open_ws(server.ws_url, ping_interval=None)
    await recv_event(ws)
    ws.transport.pause_reading()  # it never sees the pings, so it never answers them
    await asyncio.sleep(1.5)
    ws.transport.resume_reading()
    with pytest.raises(ConnectionClosed):
        while True:
            await asyncio.wait_for(ws.recv(), 5)
    assert ws.close_code == 1011


async def test_a_client_that_keeps_sending_but_never_answers_pings_is_closed(duplex_server) -> None:
    # Reading pauses after every message until the session takes it: only that time is forgiven, so a
    # real-time client whose audio keeps coming but whose pongs never do still runs out of time.
    server = duplex_server("--model", "echo", "--ws-ping-interval", "0.2", "--ws-ping-timeout", "0.3")
    ws = await open_ws(server.ws_url, ping_interval=None)
    await recv_event(ws)
    ws.transport.pause_reading()
    chunk = bytes(TICK * 2)
    sent = 0
    with pytest.raises(ConnectionClosed):
        for _ in range(100):  # 20 s of audio at real-time pace, far past the keepalive's deadline
            await ws.send(chunk)
            sent += 1
            await asyncio.sleep(0.2)
    # Closed by the server within a few seconds (its close frame sat unread behind the paused reading,
    # so the client may only see the connection drop: 1006).
    assert sent < 40, sent
    assert ws.close_code in (1011, 1006)

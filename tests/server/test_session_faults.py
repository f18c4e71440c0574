"""Session-lifecycle faults through the real server and real WebSocket clients.

Each test names the fault it guards against: a client that stops reading (1), sizes a client can
make the server hold (2), JSON nested too deeply (3), formats lost on resume (5), a media session
that only types (6), resume tokens in logs and never rotated, the API key in --help (8), events of a
detached session (10).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.conftest import ROOT, ServerProc, start_server
from tests.server._background_stub import ScriptedOpenAI
from tests.wsclient import TICK, collect_audio, open_ws, pcm16, random_pcm, recv_event, recv_until, send, start_session

OUTBOX = 65536


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    # The default outbox bound: the typed-text test has up to eight 15 kB items echoed back in one burst,
    # and a 64 kB bound cut that client for "not reading" whenever the burst outran the writer (CI, once).
    srv = start_server("--model", "echo", "--background", "none", "--max-sessions", "8", "--resume-grace", "10",
                       "--log-level", "info",
                       tmp_path=tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


def typed(text: str) -> dict[str, Any]:
    return {"type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


def metric(base: str, name: str) -> float:
    for line in httpx.get(base + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


async def resume(url: str, token: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Resume with the token in the header (kept out of URLs); returns (ws, session.created, resume event)."""
    ws = await open_ws(url, additional_headers={"X-Duplex-Resume-Token": token})
    created = await recv_event(ws)
    again = await recv_event(ws)
    assert created["type"] == "session.created" and again["type"] == "duplex.session.resume", (created, again)
    return ws, created, again


# -- fault 1: a client that stops reading --------------------------------------------------------------

async def test_a_client_that_stops_reading_is_cut_and_nothing_else_breaks(duplex_server) -> None:
    srv = duplex_server("--model", "echo", "--background", "none", "--max-sessions", "4",
                        "--max-outbox-bytes", str(OUTBOX))
    # The stuck client: a tiny socket receive buffer, and websockets stops reading after one message.
    sock = socket.create_connection(("127.0.0.1", srv.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck = await connect(srv.ws_url, sock=sock, max_queue=1, max_size=16 << 20,
                          additional_headers={"X-Duplex-Extensions": "1"})  # for its resume token
    assert (await recv_event(stuck))["type"] == "session.created"
    token = (await recv_event(stuck))["resume_token"]
    await send(stuck, {"type": "session.update", "session": {"pace": "media"}})
    healthy, _ = await start_session(srv.ws_url, pace="media")
    chunk = pcm16(random_pcm(TICK, seed=3))

    async def flood() -> None:
        for _ in range(3000):  # bounded: 29 MB of audio at most
            await stuck.send(chunk)

    flooding = asyncio.create_task(flood())
    deadline = time.monotonic() + 30
    while await asyncio.to_thread(metric, srv.url, 'duplex_dropped_events_total{reason="outbox_full"}') < 1:
        assert time.monotonic() < deadline, "the server never cut the client that does not read"
        await asyncio.sleep(0.2)
    flooding.cancel()
    with contextlib.suppress(BaseException):
        await flooding
    # The healthy session, stepped in the same media loop and batches, still gets every echo exactly.
    data = [pcm16(random_pcm(TICK, seed=40 + k)) for k in range(10)]
    for piece in data:
        await healthy.send(piece)
    out = await collect_audio(healthy, 10)
    assert [out[k + 1] for k in range(9)] == data[:9], "echo:1 returns each chunk one micro-turn later"
    # The cut session was detached, not leaked: it can be resumed, and its slot freed by a goodbye.
    ws, _, again = await resume(srv.ws_url, token)
    assert again["resumed"] is True
    await ws.close()
    await healthy.close()
    stuck.transport.abort()
    # A SIGTERM drain still works: a clean exit, and nothing recursed on the way.
    assert srv.stop() == 0
    log = srv.log()
    assert "client not reading" in log and "RecursionError" not in log and "Traceback" not in log, log[-3000:]


# -- fault 2: bounded sizes ---------------------------------------------------------------------------------

async def test_settings_and_typed_text_are_bounded(server: ServerProc) -> None:
    ws, _ = await start_session(server.ws_url, pace="realtime")
    cases = [
        ({"instructions": "x" * 40_000}, "instructions_too_long"),
        ({"tools": [{"type": "function", "name": f"t{i}"} for i in range(65)]}, "too_many_tools"),
        ({"tools": [{"type": "function", "name": "big", "description": "d" * 70_000}]}, "tools_too_large"),
    ]
    for cfg, code in cases:
        await send(ws, {"type": "session.update", "session": cfg})
        err, seen = await recv_until(ws, "error")
        assert err["error"]["code"] == code and "limit" in err["error"]["message"]
        assert not any(e["type"] == "session.updated" for e in seen), "a refused update changes nothing"
    await send(ws, typed("y" * 17_000))
    err, _ = await recv_until(ws, "error")
    assert err["error"]["code"] == "item_too_large"
    # Typed text waiting for the next micro-turn: a burst of 12 x 15,000 characters cannot all fit
    # (even if a tick falls inside the burst, one side of it holds over 64,000).
    for _ in range(12):
        await send(ws, typed("z" * 15_000))
    err, _ = await recv_until(ws, "error", timeout=15)
    assert err["error"]["code"] == "text_buffer_full"
    await send(ws, {"type": "session.update", "session": {"instructions": "short"}})
    updated, _ = await recv_until(ws, "session.updated", timeout=15)
    assert updated["session"]["instructions"] == "short"
    await ws.close()


# -- fault 3: JSON nested too deeply --------------------------------------------------------------------

async def test_deeply_nested_json_is_an_error_and_the_session_continues(server: ServerProc) -> None:
    ws, _ = await start_session(server.ws_url, pace="media")
    for bomb in ("[" * 100_000, '{"a":' * 50_000):
        await ws.send(bomb)
        err, _ = await recv_until(ws, "error")
        assert err["error"]["code"] == "invalid_json"
    chunk = pcm16(random_pcm(TICK, seed=5))
    await ws.send(chunk + chunk)
    out = await collect_audio(ws, 2)
    assert out[1] == chunk, "the session still echoes"
    await ws.close()


# -- fault 5: formats belong to the session -----------------------------------------------------------

async def test_resumed_session_keeps_its_audio_formats(server: ServerProc) -> None:
    ws, first = await start_session(server.ws_url, pace="media")
    fmt = {"type": "audio/pcm", "rate": 16000}
    await send(ws, {"type": "session.update", "session": {"audio": {"input": {"format": fmt},
                                                                    "output": {"format": fmt}}}})
    await recv_until(ws, "session.updated")
    await ws.send(pcm16(random_pcm(6400, seed=1)))  # micro-turns at 16 kHz: the format is now locked
    await collect_audio(ws, 1)
    ws.transport.abort()
    await asyncio.sleep(0.3)
    ws2, created, again = await resume(server.ws_url, first["resume_token"])
    assert again["resumed"] is True
    assert created["session"]["audio"]["input"]["format"]["rate"] == 16000
    assert created["session"]["audio"]["output"]["format"]["rate"] == 16000
    await send(ws2, {"type": "session.update", "session": {"audio": {"input": {"format": fmt}}}})
    updated, _ = await recv_until(ws2, "session.updated")
    assert updated["session"]["audio"]["input"]["format"]["rate"] == 16000
    # 16 kHz in is read as 16 kHz: one micro-turn of it (3,200 samples) makes one tick of output.
    tone = (np.sin(2 * np.pi * 440 * np.arange(3200 * 5) / 16000) * 12000).astype(np.int16)
    await ws2.send(pcm16(tone))
    out = await collect_audio(ws2, 3)
    ticks = sorted(out)
    sizes = [len(out[t]) // 2 for t in ticks]
    assert all(abs(n - 3200) <= 32 for n in sizes), f"output comes back at 16 kHz (3,200 a tick): {sizes}"
    echoed = np.frombuffer(out[ticks[-1]], dtype="<i2").astype(np.float64)
    assert 6000 < np.sqrt(np.mean(echoed**2)) < 11000, "the tone comes back at its level (not misread)"
    await ws2.close()


# -- fault 6: a media-pace session that only types ----------------------------------------------------

async def test_media_session_that_only_types_is_answered(server: ServerProc) -> None:
    ws, _ = await start_session(server.ws_url, pace="media")
    for word in ("hello", "again"):
        await send(ws, typed(word))
        delta, _ = await recv_until(ws, "response.output_audio_transcript.delta", timeout=5)
        assert delta["delta"] == word, "the echo model says the typed text back at the next micro-turn"
    await ws.close()


# -- fault 8: resume tokens and secrets -----------------------------------------------------------------

async def test_resume_rotates_the_token_and_keeps_it_out_of_the_log(server: ServerProc) -> None:
    ws, first = await start_session(server.ws_url, pace="media")
    old = first["resume_token"]
    ws.transport.abort()
    await asyncio.sleep(0.3)
    # An older client: the token in the query string. It works, but the access log must not show it.
    ws2 = await open_ws(server.ws_url + "?resume_token=" + old)
    await recv_event(ws2)
    again = await recv_event(ws2)
    assert again["resumed"] is True and again["resume_token"] != old, "the token rotates on every resume"
    await send(ws2, {"type": "input_audio_buffer.commit"})  # the client speaks: it has the new token
    await recv_until(ws2, "input_audio_buffer.committed")
    ws2.transport.abort()
    await asyncio.sleep(0.3)
    stale = await open_ws(server.ws_url, additional_headers={"X-Duplex-Resume-Token": old})
    err = await recv_event(stale)
    assert err["error"]["code"] == "invalid_resume_token", "the old token stopped working"
    ws3, _, third = await resume(server.ws_url, again["resume_token"])
    assert third["resumed"] is True and third["session_id"] == first["session_id"]
    await ws3.close()
    await asyncio.sleep(0.2)
    log = server.log()
    assert "resume_token=<redacted>" in log, "the query-string resume was logged (redacted)"
    assert old not in log and again["resume_token"] not in log


async def test_a_resume_dropped_before_the_client_spoke_leaves_both_tokens_working(server: ServerProc) -> None:
    # Before: the token rotated the moment the server resumed the session, so a client whose new
    # connection dropped before the greeting (with the new token) reached it held a dead token, and
    # its session was lost although it was still inside its resume grace.
    ws, first = await start_session(server.ws_url, pace="media")
    old = first["resume_token"]
    ws.transport.abort()
    await asyncio.sleep(0.3)
    lost = await open_ws(server.ws_url, additional_headers={"X-Duplex-Resume-Token": old})
    await recv_event(lost)
    unseen = (await recv_event(lost))["resume_token"]  # as if it never arrived: the client sends nothing
    lost.transport.abort()
    await asyncio.sleep(0.3)
    ws2, _, again = await resume(server.ws_url, old)
    assert again["resumed"] is True and again["session_id"] == first["session_id"]
    await send(ws2, {"type": "input_audio_buffer.commit"})  # now it spoke: only the newest token is left
    await recv_until(ws2, "input_audio_buffer.committed")
    ws2.transport.abort()
    await asyncio.sleep(0.3)
    for stale in (old, unseen):
        refused = await open_ws(server.ws_url, additional_headers={"X-Duplex-Resume-Token": stale})
        assert (await recv_event(refused))["error"]["code"] == "invalid_resume_token"
        await refused.close()
    ws3, _, third = await resume(server.ws_url, again["resume_token"])
    assert third["session_id"] == first["session_id"]
    await ws3.close()


def test_serve_help_does_not_print_the_api_key() -> None:
    env = {**os.environ, "DUPLEX_API_KEY": "sekrit-value-123"}
    out = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--help"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--api-key" in out.stdout
    assert "sekrit-value-123" not in out.stdout + out.stderr


# -- fault 10: what a detached session produces is delivered on resume ------------------------------

async def test_background_answer_produced_while_detached_is_replayed(duplex_server, tmp_path: Path) -> None:
    stub = ScriptedOpenAI().start()
    try:
        srv = duplex_server("--model", "echo", "--background", "openai", "--background-url", stub.base_url,
                            "--background-model", "scripted", "--resume-grace", "10")
        ws, first = await start_session(srv.ws_url, pace="media")
        await send(ws, {"type": "duplex.background.request", "query": "[slow] tell me"})
        started, _ = await recv_until(ws, "duplex.background.started")
        ws.transport.abort()  # the answer streams for ~0.5 s while nobody is attached
        await asyncio.sleep(1.5)
        ws2, _, again = await resume(srv.ws_url, first["resume_token"])
        assert again["resumed"] is True
        done, seen = await recv_until(ws2, "duplex.background.done", timeout=10)
        await ws2.close()
    finally:
        stub.stop()
    assert done["request_id"] == started["request_id"] and done["status"] == "completed"
    deltas = "".join(e["delta"] for e in seen if e["type"] == "duplex.background.delta")
    assert deltas == done["text"] and len(done["text"].split()) == 10, "every delta of the answer was kept"

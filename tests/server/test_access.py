"""API keys, Origin checks, admission control, refusing unsafe binds, and SIGTERM with live sessions."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.conftest import ROOT, ServerProc, start_server
from tests.wsclient import TICK, collect_audio, open_ws, pcm16, random_pcm, recv_event, start_session

KEY = "test-key-123"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """One keyed server for the three key tests (a start is ~1.5 s): a refused request leaves nothing
    behind, and the one session opened is closed normally, which ends it at once."""
    srv = start_server("--model", "echo:0", tmp_path=tmp_path_factory.mktemp("keyed"), env={"DUPLEX_API_KEY": KEY})
    yield srv
    srv.stop()


async def test_websocket_needs_the_right_key(keyed) -> None:
    with pytest.raises(InvalidStatus) as no_key:
        await open_ws(keyed.ws_url)
    assert no_key.value.response.status_code == 401
    assert b"invalid_api_key" in no_key.value.response.body
    with pytest.raises(InvalidStatus) as wrong:
        await open_ws(keyed.ws_url, additional_headers={"Authorization": "Bearer nope"})
    assert wrong.value.response.status_code == 401
    ws, _ = await start_session(keyed.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"})
    chunk = pcm16(random_pcm(TICK, seed=1))
    await ws.send(chunk)
    assert await collect_audio(ws, 1) == {0: chunk}
    await ws.close()


async def test_browser_subprotocol_key(keyed) -> None:
    ws = await open_ws(keyed.ws_url, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"])
    assert ws.subprotocol == "realtime", "the server never echoes the key protocol back"
    assert (await recv_event(ws))["type"] == "session.created"
    await ws.close()
    with pytest.raises(InvalidStatus):
        await open_ws(keyed.ws_url, subprotocols=["realtime", "duplex-api-key.wrong"])


def test_http_endpoints_need_the_key(keyed) -> None:
    assert httpx.get(f"{keyed.url}/metrics").status_code == 401
    assert httpx.get(f"{keyed.url}/healthz", headers={"Authorization": "Bearer bad"}).status_code == 401
    ok = httpx.get(f"{keyed.url}/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and "duplex_sessions_live" in ok.text


async def test_disallowed_origin_is_refused(duplex_server) -> None:
    server = duplex_server("--model", "echo", "--allow-origin", "https://app.example")
    with pytest.raises(InvalidStatus) as refused:
        await open_ws(server.ws_url, origin="https://evil.example")
    assert refused.value.response.status_code == 403
    for origin in (f"http://127.0.0.1:{server.port}", "https://app.example"):
        ws = await open_ws(server.ws_url, origin=origin)
        assert (await recv_event(ws))["type"] == "session.created"
        await ws.close()


async def test_server_full_refuses_with_1013(duplex_server) -> None:
    server = duplex_server("--model", "echo", "--max-sessions", "2")
    a, _ = await start_session(server.ws_url)
    b, _ = await start_session(server.ws_url)
    c = await open_ws(server.ws_url)
    err = await recv_event(c)
    assert err["type"] == "error" and err["error"]["code"] == "server_full"
    with pytest.raises(ConnectionClosed):
        await recv_event(c)
    assert c.close_code == 1013 and "full" in (c.close_reason or "")
    # The admitted sessions are untouched by the refusal.
    chunk = pcm16(random_pcm(TICK, seed=2))
    await a.send(chunk + chunk)
    assert (await collect_audio(a, 2))[1] == chunk
    await a.close()
    await b.close()


async def test_clients_connecting_at_once_are_counted_while_their_sessions_open(duplex_server) -> None:
    """Five clients at once to a server of capacity 3: three are admitted, and the two refusals (and
    /healthz, /metrics) count the sessions being opened, not only those already held."""
    server = duplex_server("--model", "echo", "--max-sessions", "3")
    conns = await asyncio.gather(*(open_ws(server.ws_url) for _ in range(5)))
    firsts = await asyncio.gather(*(recv_event(ws) for ws in conns))
    admitted = [ws for ws, ev in zip(conns, firsts, strict=True) if ev["type"] == "session.created"]
    refused = [ev for ev in firsts if ev["type"] == "error"]
    assert len(admitted) == 3 and len(refused) == 2, firsts
    for ev in refused:
        assert ev["error"]["code"] == "server_full"
        assert "3 of 3 sessions in use" in ev["error"]["message"], ev["error"]["message"]
    health = httpx.get(f"{server.url}/healthz").json()
    assert health["sessions"] == 3 and health["capacity"] == 3
    assert "duplex_sessions_live 3.0" in httpx.get(f"{server.url}/metrics").text
    for ws in conns:
        await ws.close()


def test_refuses_public_bind_without_key(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--host", "0.0.0.0", "--model", "echo"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "without an API key" in proc.stderr and "--api-key" in proc.stderr


def test_cli_help_documents_every_option() -> None:
    out = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60).stdout
    for flag in ("--host", "--port", "--model", "--api-key", "--allow-origin", "--max-sessions", "--phase-groups",
                 "--resume-grace", "--background"):
        assert flag in out


async def test_sigterm_tells_live_sessions_and_exits(duplex_server) -> None:
    server = duplex_server("--model", "echo")
    clients = [(await start_session(server.ws_url, pace="realtime"))[0] for _ in range(2)]
    server.proc.send_signal(signal.SIGTERM)
    for ws in clients:
        reasons = []
        with pytest.raises(ConnectionClosed):
            while True:
                ev = await recv_event(ws, timeout=10)
                if ev["type"] == "duplex.session.closing":
                    reasons.append(ev["reason"])
        assert reasons == ["server shutting down"]
        assert ws.close_code == 1001
    t0 = time.monotonic()
    while server.proc.poll() is None and time.monotonic() - t0 < 15:
        await asyncio.sleep(0.1)
    assert server.proc.returncode == 0, server.log()


async def test_idle_session_is_reaped_with_a_reason(duplex_server) -> None:
    server = duplex_server("--model", "echo", "--idle-timeout", "1")
    ws, _ = await start_session(server.ws_url)
    closing = None
    with pytest.raises(ConnectionClosed):
        for _ in range(200):  # bounded: the reaper runs every second
            ev = await recv_event(ws, timeout=10)
            if ev["type"] == "duplex.session.closing":
                closing = ev
    assert closing is not None and closing["reason"] == "session idle timeout"
    assert httpx.get(f"{server.url}/healthz").json()["sessions"] == 0

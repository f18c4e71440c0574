"""Who a client is, as a hostile one would try to change it: a forged X-Forwarded-For, a WebRTC offer
that never connects, sessions opened as fast as it can; on a real server, with real clients."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from aiortc import RTCPeerConnection
from websockets.asyncio.client import ClientConnection

from server.config import DEFAULT_SESSIONS_PER_CLIENT, ServerConfig
from tests.wsclient import open_ws, recv_event

OFFER_HEADERS = {"Content-Type": "application/sdp"}


async def _offer() -> str:
    pc = RTCPeerConnection()
    pc.addTransceiver("audio")
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    sdp: str = pc.localDescription.sdp
    await pc.close()  # the server's side will never hear from it: an offer that never connects
    return sdp


async def _until_free(http: httpx.AsyncClient, url: str) -> None:
    """Until the server holds no session: it frees one just after the close handshake, not before."""
    for _ in range(50):
        if (await http.get(url + "/healthz")).json()["sessions"] == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("a closed session kept its place for 5 s")


async def _first_event(url: str, **headers: str) -> tuple[ClientConnection, dict]:
    ws = await open_ws(url, additional_headers=headers)
    return ws, await recv_event(ws)


async def test_a_forged_forwarding_header_and_a_pending_offer_do_not_make_another_client(duplex_server) -> None:
    srv = duplex_server("--model", "echo", "--background", "none", "--max-sessions", "4",
                        "--max-sessions-per-client", "1", "--new-sessions-per-minute", "4")
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(srv.url + "/v1/realtime/calls", content=await _offer(), headers=OFFER_HEADERS)
        assert r.status_code == 201, r.text  # its session waits for a peer that never comes: it holds the place
        call = r.headers["Location"]
        # uvicorn trusted X-Forwarded-For from any loopback peer: this was a second client, admitted.
        ws, first = await _first_event(srv.ws_url, **{"X-Forwarded-For": "198.51.100.7"})
        assert first["type"] == "error" and first["error"]["code"] == "too_many_sessions", first
        await ws.close()
        foreign = await http.post(srv.url + call + "/hangup", headers={"Origin": "https://evil.example"})
        assert foreign.status_code == 403, foreign.text  # another site's page may not end the call (it did)
        assert (await http.post(srv.url + call + "/hangup")).status_code == 200
        for _ in range(2):  # the place is free again; the third and fourth sessions of the minute
            await _until_free(http, srv.url)
            ws, first = await _first_event(srv.ws_url)
            assert first["type"] == "session.created", first
            await ws.close()
        # The fifth new session within the minute: refused before anything is opened for it.
        ws, first = await _first_event(srv.ws_url)
        assert first["type"] == "error" and first["error"]["code"] == "rate_limited", first
        await ws.wait_closed()
        assert ws.close_code == 1013
        r = await http.post(srv.url + "/v1/realtime/calls", content=await _offer(), headers=OFFER_HEADERS)
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited", r.text
        assert int(r.headers["Retry-After"]) >= 1
        # GPT-Live's WebRTC door opens sessions too: the same bucket (it went past it).
        live = {"session": {"model": "gpt-live"}, "transport": {"type": "webrtc", "sdp": await _offer()}}
        r = await http.post(srv.url + "/v1/live/sessions", json=live)
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited", r.text


async def test_behind_a_named_proxy_each_forwarded_address_is_a_client_with_a_default_cap(duplex_server) -> None:
    cap = DEFAULT_SESSIONS_PER_CLIENT
    srv = duplex_server("--model", "echo", "--background", "none", "--max-sessions", str(cap + 2),
                        "--forwarded-allow-ips", "127.0.0.1")
    held = []
    try:
        for _ in range(cap):
            ws, first = await _first_event(srv.ws_url, **{"X-Forwarded-For": "203.0.113.5"})
            assert first["type"] == "session.created", first
            held.append(ws)
        ws, first = await _first_event(srv.ws_url, **{"X-Forwarded-For": "203.0.113.5"})
        assert first["type"] == "error" and first["error"]["code"] == "too_many_sessions", first
        await ws.close()
        ws, first = await _first_event(srv.ws_url, **{"X-Forwarded-For": "203.0.113.6"})  # another client
        assert first["type"] == "session.created", first
        held.append(ws)
    finally:
        for ws in held:
            await ws.close()


@pytest.mark.parametrize(("host", "proxies", "cap"), [
    ("127.0.0.1", [], 0),  # the operator's own clients (tests, benchmarks): no default limit
    ("0.0.0.0", [], DEFAULT_SESSIONS_PER_CLIENT),
    ("127.0.0.1", ["127.0.0.1"], DEFAULT_SESSIONS_PER_CLIENT),
])
def test_the_default_cap_holds_where_clients_can_be_told_apart(host: str, proxies: list[str], cap: int) -> None:
    config = ServerConfig(host=host, forwarded_allow_ips=proxies, api_key="k")
    assert config.max_sessions_per_client == cap
    assert bool(config.new_sessions_per_minute) == bool(cap)
    assert ServerConfig(host=host, forwarded_allow_ips=proxies, max_sessions_per_client=0).max_sessions_per_client == 0

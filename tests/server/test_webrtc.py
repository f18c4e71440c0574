"""WebRTC endpoint: two real aiortc peers in one process (the server runs as a real subprocess).

The client peer plays a wav file as its microphone; the echo model sends it back N micro-turns later,
and cross-correlation must find it there. Events flow on the data channel with the WebSocket's codec.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from starlette.testclient import TestClient

from bench._rtc_client import CallRefused, RtcClient
from bench.webrtc_latency import make_bursts, measure
from server._rtc_call import LIVENESS_TIMEOUT
from server.app import create_app
from server.config import ServerConfig
from server.webrtc import parse_ice_server
from streaming.wav import read_wav, write_wav
from tests.conftest import ServerProc, start_server

ECHO_DELAY = 2  # micro-turns
TICK = 0.2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", f"echo:{ECHO_DELAY}", "--background", "none", "--max-sessions", "1",
                       tmp_path=tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


def _health(server: ServerProc) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{server.url}/healthz", timeout=5).json()
    return body


def _sessions(server: ServerProc) -> int:
    return int(_health(server)["sessions"])


async def _until_no_sessions(server: ServerProc, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while await asyncio.to_thread(_sessions, server):
        assert time.monotonic() < deadline, "an earlier test left a session open"
        await asyncio.sleep(0.1)


async def test_echo_comes_back_delayed_by_the_models_micro_turns(server: ServerProc, tmp_path: Path) -> None:
    await _until_no_sessions(server)
    # 1. A wav file of distinct noise bursts becomes the client's microphone.
    bursts, onsets = make_bursts(count=6, burst_s=0.2, spacing_s=0.5, seed=7)
    wav = tmp_path / "mic.wav"
    write_wav(wav, bursts, 48_000)
    audio, rate = read_wav(wav)
    assert rate == 48_000
    client = RtcClient(server.url)
    await client.connect()
    try:
        created = await client.wait_for("session.created")
        resume = await client.wait_for("duplex.session.resume")
        assert resume["session_id"] == created["session"]["id"] == client.call_id
        assert resume["resumed"] is False and resume["resume_token"]
        start = client.mic.play(audio)
        await asyncio.sleep(len(audio) / rate + (ECHO_DELAY + 1) * TICK + 1.0)

        # 2. Events on the data channel, with the WebSocket's codec.
        await client.send({"type": "conversation.item.create",
                           "item": {"type": "message", "role": "user", "content": [{"type": "input_text",
                                                                                    "text": "over rtc"}]}})
        delta = await client.wait_for("response.output_audio_transcript.delta")
        assert delta["delta"] == "over rtc"
        await client.send({"type": "duplex.ping", "id": "p1"})
        pong = await client.wait_for("duplex.pong")
        assert pong["id"] == "p1"
        client._channel.send("{not json")  # type: ignore[union-attr]
        err = await client.wait_for("error")
        assert err["error"]["code"] == "invalid_json"
        await client.send({"type": "session.update", "session": {"pace": "media"}})
        err = await client.wait_for("error")
        assert err["error"]["code"] == "pace_unsupported"
        await client.send({"type": "session.update", "session": {"duplex": {"tick_stats": True}}})
        tick = await client.wait_for("duplex.tick")
        assert tick["late_ms"] >= 0 and tick["tick"] > 0

        # 3. While the echo is talking, output_audio_buffer.clear drops what is queued for the speaker.
        client.mic.play(0.1 * np.random.default_rng(1).standard_normal(2 * rate).astype(np.float32))
        await asyncio.sleep((ECHO_DELAY + 1) * TICK + 0.3)
        dropped = []
        for _ in range(3):  # a clear may land just as the queue runs empty: take the best of three phases
            await client.send({"type": "output_audio_buffer.clear"})
            dropped.append((await client.wait_for("output_audio_buffer.cleared"))["dropped_ms"])
            await asyncio.sleep(0.07)
        assert max(dropped) > 0, f"nothing was queued to drop while the echo was talking: {dropped}"
    finally:
        assert await client.hangup() == 200
        await client.close()

    # 4. Every burst came back, delayed by the model's micro-turns plus one micro-turn of input framing.
    templates = [audio[o : o + int(0.2 * rate)] for o in onsets]
    latencies, scores = measure(client, start, onsets, templates, max_latency_s=2.0)
    assert len(latencies) == len(onsets), f"only {len(latencies)} of {len(onsets)} bursts came back"
    # After two Opus passes a clean echo correlates at ~0.98; a loaded machine may glitch one burst.
    assert float(np.median(scores)) > 0.9, f"echoed audio correlates poorly with what was sent: {scores}"
    # A sample waits for its micro-turn to fill (up to 200 ms), then N micro-turns in the model: the echo
    # comes back just over (N + 1) * 200 ms later. (On a starved machine an input underrun can cut a
    # micro-turn short, so single bursts may come back a little earlier: the median is checked.)
    floor = (ECHO_DELAY + 1) * TICK
    median = float(np.median(latencies))
    assert floor - 0.02 <= median <= floor + 0.2, f"latencies {latencies}; expected just over {floor:.1f} s"
    # Before the first burst the output track sent silence (zeros), not noise or stale audio.
    received, _ = client.received.signal()
    assert len(received) > rate and np.abs(received[: int(0.1 * rate)]).max() < 1e-3
    await _until_no_sessions(server)


async def test_refusals_name_the_problem(server: ServerProc) -> None:
    await _until_no_sessions(server)
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        r = await http.post("/v1/realtime/calls", content="v=0", headers={"Content-Type": "application/json"})
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
        r = await http.post("/v1/realtime/calls", content="hello", headers={"Content-Type": "application/sdp"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_sdp"
        r = await http.post("/v1/realtime/calls/sess_nope/hangup")
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_call"
    # An offer with only a data channel: there is no audio to answer with.
    from aiortc import RTCPeerConnection

    pc = RTCPeerConnection()
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        r = await http.post("/v1/realtime/calls", content=pc.localDescription.sdp,
                            headers={"Content-Type": "application/sdp"})
    await pc.close()
    assert r.status_code == 400 and r.json()["error"]["code"] == "offer_without_audio"
    with pytest.raises(CallRefused) as refused:
        await RtcClient(server.url).connect(resume_token="no-such-token")
    assert refused.value.status == 404 and refused.value.code == "invalid_resume_token"
    assert await asyncio.to_thread(_sessions, server) == 0, "a refused offer must not keep a session"

    # The server holds one session: a second caller is told it is full, with a JSON reason.
    first = RtcClient(server.url)
    await first.connect()
    try:
        with pytest.raises(CallRefused) as refused:
            await RtcClient(server.url).connect()
        assert refused.value.status == 503 and refused.value.code == "server_full"
        assert "full" in str(refused.value)
    finally:
        await first.hangup()
        await first.close()


async def test_dead_peer_is_detached_and_can_resume(server: ServerProc) -> None:
    await _until_no_sessions(server)
    quiet = RtcClient(server.url, answer_pings=False)
    await quiet.connect()
    resume = await quiet.wait_for("duplex.session.resume")
    token, session_id = resume["resume_token"], resume["session_id"]
    await quiet.wait_for("duplex.ping")  # the server probes the peer on the data channel
    # The peer freezes: no RTP, no answers. The server must notice without any close from it.
    quiet.mic.hold()
    t0 = time.monotonic()
    while (await asyncio.to_thread(_health, server))["attached"]:
        assert time.monotonic() - t0 < LIVENESS_TIMEOUT + 4, "the dead peer was never detached"
        await asyncio.sleep(0.2)
    detached_after = time.monotonic() - t0
    assert detached_after >= LIVENESS_TIMEOUT - 1.5, f"detached after {detached_after:.1f}s: too eager"
    again = RtcClient(server.url)
    await again.connect(resume_token=token)
    taker = RtcClient(server.url)
    try:
        resumed = await again.wait_for("duplex.session.resume")
        assert resumed["resumed"] is True and resumed["session_id"] == session_id
        # The same session keeps working on the new peer.
        await again.send({"type": "conversation.item.create",
                          "item": {"type": "message", "role": "user", "content": [{"type": "input_text",
                                                                                   "text": "back"}]}})
        assert (await again.wait_for("response.output_audio_transcript.delta"))["delta"] == "back"
        # A client back before the server saw its call end (a network change: the old peer looks alive)
        # takes the session over with its current token; the call it left is hung up, with the reason.
        await taker.connect(resume_token=resumed["resume_token"])
        took = await taker.wait_for("duplex.session.resume")
        assert took["resumed"] is True and took["session_id"] == session_id
        closing = await again.wait_for("duplex.session.closing")
        assert closing["code"] == 4409 and "another connection" in closing["reason"], closing
    finally:
        assert await taker.hangup() == 200
        await taker.close()
        await again.close()
        await quiet.close()
    await _until_no_sessions(server)


def test_api_key_and_ice_servers() -> None:
    """The app in-process (lifespan and all): the key guards the endpoint, ICE servers reach the page."""
    config = ServerConfig(model="echo", background="none", max_sessions=1, api_key="k123",
                          ice_servers=["stun:stun.example.org:3478",
                                       "turn:alice:s3cret@turn.example.org:3478?transport=tcp"])
    with TestClient(create_app(config)) as http:
        r = http.post("/v1/realtime/calls", content="v=0", headers={"Content-Type": "application/sdp"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert http.get("/v1/realtime/calls/ice").status_code == 401
        r = http.get("/v1/realtime/calls/ice", headers={"Authorization": "Bearer k123"})
        assert r.status_code == 200
        assert r.json()["ice_servers"] == [
            {"urls": "stun:stun.example.org:3478"},
            {"urls": "turn:turn.example.org:3478?transport=tcp", "username": "alice", "credential": "s3cret"},
        ]
        assert http.get("/static/index.html").status_code == 200, "the page itself is public"


def test_ice_server_urls_are_checked() -> None:
    assert parse_ice_server("stun:h:1").urls == "stun:h:1"
    turn = parse_ice_server("turns:u:p@h:5349")
    assert (turn.urls, turn.username, turn.credential) == ("turns:h:5349", "u", "p")
    for bad in ("http://h", "turn:user@h:1", "stun:"):
        with pytest.raises(ValueError, match="ICE server"):
            parse_ice_server(bad)

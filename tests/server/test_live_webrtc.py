"""GPT-Live over WebRTC (`POST /v1/live/sessions`): two real aiortc peers, the server a real subprocess
(`--model echo:0`) on a free port, the REST call made by the unmodified openai SDK (`client.live.create`).

The client's microphone plays a tone and the echo model sends it back on the media track; GPT-Live's
events (session.started, mute, appends, close) travel on the data channel. Bad bodies get the
documented errors; an ephemeral key opens one session.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc import RTCSessionDescription

from bench._rtc_client import RtcClient
from server._rtc_tracks import use_low_latency_buffer
from tests.conftest import ServerProc, start_server

openai = pytest.importorskip("openai")
pytest.importorskip("openai.resources.live", reason="this openai SDK has no client.live (openai>=3.51 has)")

KEY = "live-rtc-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
RATE = 48_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo:0", "--background", "none", "--max-sessions", "2",
                       tmp_path=tmp_path_factory.mktemp("live-rtc"), env={"DUPLEX_API_KEY": KEY})
    yield srv
    srv.stop()


class LiveRtcClient(RtcClient):
    """bench/_rtc_client.py's peer (microphone, recorder, data channel), signalled the GPT-Live way."""

    async def create(self, session: dict[str, Any], extensions: bool = False, timeout: float = 10.0) -> Any:
        """Offer, `client.live.create`, answer; waits until the data channel is open. Returns the response."""
        pc = self.pc
        pc.addTrack(self.mic)
        channel = pc.createDataChannel("oai-events")
        self._channel = channel
        channel.on("open", self._open.set)
        channel.on("message", self._on_message)

        @pc.on("track")
        def on_track(track: Any) -> None:
            if track.kind == "audio":
                self._tasks.append(asyncio.create_task(self._record(track)))

        await pc.setLocalDescription(await pc.createOffer())
        sdk = openai.AsyncOpenAI(api_key=self.api_key, base_url=f"{self.base_url}/v1", max_retries=0)
        try:
            created = await sdk.live.create(
                session=session,
                transport={"type": "webrtc", "sdp": pc.localDescription.sdp},
                extra_headers={"X-Duplex-Extensions": "1"} if extensions else None, timeout=timeout)
        except Exception:
            await pc.close()
            raise
        self.call_id = created.session.id
        await pc.setRemoteDescription(RTCSessionDescription(sdp=created.transport.sdp, type="answer"))
        for transceiver in pc.getTransceivers():
            if transceiver.kind == "audio":
                use_low_latency_buffer(transceiver.receiver)
        await asyncio.wait_for(self._open.wait(), timeout)
        return created


def _sessions(server: ServerProc) -> int:
    return int(httpx.get(f"{server.url}/healthz", timeout=5, headers=AUTH).json()["sessions"])


async def _until_no_sessions(server: ServerProc, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while await asyncio.to_thread(_sessions, server):
        assert time.monotonic() < deadline, "a session is still held"
        await asyncio.sleep(0.1)


def tone(seconds: float, level: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (level * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)


def loudest(client: RtcClient, since: int) -> float:
    """The loudest 20 ms frame's RMS among the frames received after the first `since`."""
    frames = client.received.frames[since:]
    return max((float(np.sqrt(np.mean(f ** 2))) for f in frames if len(f)), default=0.0)


async def test_a_live_call_starts_echoes_mutes_and_closes(server: ServerProc) -> None:
    await _until_no_sessions(server)
    client = LiveRtcClient(server.url, api_key=KEY)
    created = await client.create({"model": "gpt-live-1", "instructions": "be brief"})
    try:
        # Creation started the session: session.started is the first event on the data channel.
        started = await client.wait_for("session.started")
        assert started["session"]["id"] == created.session.id
        assert started["session"]["model"] == "gpt-live-1" and started["session"]["instructions"] == "be brief"
        assert "format" not in started["session"]["audio"]  # the media track negotiates its codec
        assert client.events[0]["type"] == "session.started"
        assert not any(e["type"] == "duplex.ping" for e in client.events)  # no extensions asked for

        # Audio both ways: the tone comes back on the media track (echo:0), nothing as output_audio.delta.
        await asyncio.sleep(0.5)
        before = len(client.received.frames)
        assert before > 0 and loudest(client, 0) < 1e-3, "the output track should carry silence first"
        client.mic.play(tone(1.0))
        await asyncio.sleep(1.8)
        assert loudest(client, before) > 0.05, "the tone did not come back on the media track"
        assert not any(e["type"] == "session.output_audio.delta" for e in client.events)

        # The same verbs as on the WebSocket: mute makes the model hear silence.
        await client.send({"type": "session.input_audio.mute", "event_id": "m1"})
        assert (await client.wait_for("session.input_audio.muted"))["client_event_id"] == "m1"
        await asyncio.sleep(0.5)
        muted_from = len(client.received.frames)
        client.mic.play(tone(1.0))
        await asyncio.sleep(1.5)
        assert loudest(client, muted_from) < 1e-3, "muted, the model still heard the microphone"
        await client.send({"type": "session.commentary.append", "content": "hello", "delegation_id": None,
                           "event_id": "c1"})
        assert (await client.wait_for("session.commentary.appended"))["client_event_id"] == "c1"
        # Audio travels on the track: the WebSocket's append is refused by name.
        await client.send({"type": "session.input_audio.append", "audio": "AAAA"})
        assert (await client.wait_for("error"))["error"]["code"] == "unsupported_event"

        await client.send({"type": "session.close"})
        await client.wait_for("session.usage.updated")
        closed = await client.wait_for("session.closed")
        assert closed["reason"] == "close_requested"
    finally:
        await client.close()
    await _until_no_sessions(server)


def _post(server: ServerProc, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server.url}/v1/live/sessions", content=raw, timeout=10,
                      headers={**AUTH, "Content-Type": "application/json", **(headers or {})})


@pytest.mark.parametrize(("body", "status", "code", "param"), [
    (b"{not json", 400, "invalid_json", None),
    ({"session": {"model": "gpt-live-1"}}, 400, "missing_required_parameter", "transport"),
    ({"session": {"model": "gpt-live-1"}, "transport": {"type": "websocket", "sdp": "v=0"}}, 400, "invalid_value",
     "transport.type"),
    ({"session": {"model": "gpt-live-1"}, "transport": {"type": "webrtc"}}, 400, "missing_required_parameter",
     "transport.sdp"),
    ({"transport": {"type": "webrtc", "sdp": "v=0"}}, 400, "missing_required_parameter", "session"),
    ({"session": {"model": "gpt-live-1"}, "transport": {"type": "webrtc", "sdp": "v=0"}, "extra": 1}, 400,
     "unknown_parameter", "extra"),
    ({"session": {"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 24000}}},
      "transport": {"type": "webrtc", "sdp": "v=0"}}, 400, "unknown_parameter", "session.audio.format"),
    ({"session": {"model": "gpt-live-1", "voice": "x"}, "transport": {"type": "webrtc", "sdp": "v=0"}}, 400,
     "unknown_parameter", "session.voice"),
    ({"session": {"model": "gpt-live-1"}, "transport": {"type": "webrtc", "sdp": "hello"}}, 400, "invalid_sdp",
     None),
    ({"session": {"model": "gpt-live-1", "duplex": {"pace": "media"}},
      "transport": {"type": "webrtc", "sdp": "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"}}, 409,
     "pace_unsupported", None),
])
def test_bad_requests_get_the_documented_errors(server: ServerProc, body: Any, status: int, code: str,
                                                param: str | None) -> None:
    r = _post(server, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["param"] == param and err["message"]
    assert set(err) == {"type", "code", "message", "param", "client_event_id"}


def test_the_door_checks_type_key_and_origin(server: ServerProc) -> None:
    offer = {"session": {"model": "gpt-live-1"}, "transport": {"type": "webrtc", "sdp": "v=0"}}
    r = httpx.post(f"{server.url}/v1/live/sessions", content=b"v=0", timeout=10,
                   headers={**AUTH, "Content-Type": "application/sdp"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    r = httpx.post(f"{server.url}/v1/live/sessions", json=offer, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = _post(server, offer, {"Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    # CORS as on /v1/realtime/calls: an admitted page's preflight is answered; another's is refused.
    page = f"http://127.0.0.1:{server.port}"
    r = httpx.options(f"{server.url}/v1/live/sessions", timeout=10, headers={
        "Origin": page, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert r.status_code == 204 and r.headers["access-control-allow-origin"] == page


async def test_an_ephemeral_key_opens_one_live_call(server: ServerProc) -> None:
    await _until_no_sessions(server)
    minted = httpx.post(f"{server.url}/v1/realtime/client_secrets", json={}, headers=AUTH, timeout=10).json()
    key = minted["value"]
    client = LiveRtcClient(server.url, api_key=key)
    await client.create({"model": "gpt-live-1"})
    try:
        await client.wait_for("session.started")
        await client.send({"type": "session.close"})
        await client.wait_for("session.closed")
    finally:
        await client.close()
    again = LiveRtcClient(server.url, api_key=key)
    with pytest.raises(openai.AuthenticationError) as refused:
        await again.create({"model": "gpt-live-1"})
    assert refused.value.status_code == 401 and refused.value.body["code"] == "client_secret_used"
    await _until_no_sessions(server)


async def test_an_extension_client_gets_pings_and_a_hangup_ends_the_call(server: ServerProc) -> None:
    await _until_no_sessions(server)
    client = LiveRtcClient(server.url, api_key=KEY)
    created = await client.create({"model": "gpt-live-1"}, extensions=True)
    try:
        await client.wait_for("session.started")
        resume = await client.wait_for("duplex.session.resume")
        assert resume["session_id"] == created.session.id and resume["resume_token"]
        await client.send({"type": "duplex.ping", "id": "p1"})
        assert (await client.wait_for("duplex.pong"))["id"] == "p1"
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=10) as http:
            r = await http.post(f"/v1/live/sessions/{created.session.id}/hangup")
            assert r.status_code == 200 and r.json() == {"id": created.session.id, "status": "closed"}
            r = await http.post("/v1/live/sessions/sess_nope/hangup")
            assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
    finally:
        await client.close()
    await _until_no_sessions(server)

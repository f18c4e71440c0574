"""The WebSocket API on the echo model: exact media-pace output, real-time pacing, resume."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.conftest import ServerProc, start_server
from tests.wsclient import (
    TICK,
    b64,
    collect_audio,
    open_ws,
    pcm16,
    random_pcm,
    recv_event,
    recv_until,
    send,
    start_session,
)


# Servers shared by the tests that start one with the same arguments (a start is ~1.5 s): each of those
# tests opens a session of its own (or is refused one) and closes it normally, which ends it at once.
@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo", tmp_path=tmp_path_factory.mktemp("echo"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def echo0(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo:0", tmp_path=tmp_path_factory.mktemp("echo0"))
    yield srv
    srv.stop()


async def test_media_pace_echo_is_bit_exact(duplex_server) -> None:
    server = duplex_server("--model", "echo:2", "--max-sessions", "4")
    ws, _ = await start_session(server.ws_url, pace="media")
    n_ticks = 12
    audio = random_pcm(n_ticks * TICK, seed=1)
    data = pcm16(audio)
    # Odd-sized pieces, alternating the JSON path and the raw binary path.
    pos, i = 0, 0
    while pos < len(data):
        size = [3000, 7202, 12000, 998][i % 4]
        piece = data[pos : pos + size]
        if i % 2:
            await ws.send(piece)
        else:
            await send(ws, {"type": "input_audio_buffer.append", "audio": b64(piece)})
        pos += size
        i += 1
    out = await collect_audio(ws, n_ticks)
    await ws.close()
    assert sorted(out) == list(range(n_ticks)), "exactly one delta per micro-turn, in order"
    for tick in range(n_ticks):
        got = out[tick]
        assert len(got) == TICK * 2
        want = bytes(TICK * 2) if tick < 2 else data[(tick - 2) * TICK * 2 : (tick - 1) * TICK * 2]
        assert got == want, f"tick {tick} differs from input tick {tick - 2}"


async def _realtime_client(url: str, seconds: float, seed: int) -> tuple[int, int]:
    """Stream random audio at real-time pace; return (chunks sent, chunks echoed back intact)."""
    ws, _ = await start_session(url, pace="realtime")
    n = int(seconds / 0.2)
    chunks = [pcm16(random_pcm(TICK, seed=seed * 1000 + k)) for k in range(n)]
    received: set[bytes] = set()

    async def reader() -> None:
        while True:
            ev = await recv_event(ws, timeout=5)
            if ev["type"] == "response.output_audio.delta":
                received.add(base64.b64decode(ev["delta"]))

    task = asyncio.create_task(reader())
    t0 = time.monotonic()
    for k, chunk in enumerate(chunks):
        # Sent when a microphone would have it: at absolute times, no drift.
        await asyncio.sleep(max(0.0, t0 + (k + 1) * 0.2 - time.monotonic()))
        await ws.send(chunk)
    await asyncio.sleep(0.8)  # the last chunk comes back a micro-turn later
    task.cancel()
    await ws.close()
    return n, sum(c in received for c in chunks)


async def test_realtime_eight_clients_every_tick_stepped(duplex_server) -> None:
    server = duplex_server("--model", "echo", "--max-sessions", "16")
    # 4 s each (20 micro-turns): every one of 8 x 20 stepped is the check; 10 s each cost the suite 6 s more.
    results = await asyncio.gather(*[_realtime_client(server.ws_url, 4.0, seed) for seed in range(8)])
    for sent, echoed in results:
        assert echoed == sent, f"{sent - echoed} of {sent} chunks never came back"
    metrics = httpx.get(f"{server.url}/metrics").text
    ticks = _metric(metrics, 'duplex_ticks_total{pace="realtime"}')
    assert ticks >= 8 * 20, f"only {ticks} real-time ticks stepped for 8 sessions x 20 micro-turns"
    assert _metric(metrics, "duplex_tick_lateness_seconds_count") >= 8 * 20
    assert "duplex_missed_deadlines_total" in metrics


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"metric {name} not found")


async def test_disconnect_and_resume_keeps_model_state(duplex_server) -> None:
    server = duplex_server("--model", "echo:1", "--resume-grace", "10")
    ws, resume = await start_session(server.ws_url, pace="media")
    a, b, c = (pcm16(random_pcm(TICK, seed=s)) for s in (11, 12, 13))
    await ws.send(a + b)
    out = await collect_audio(ws, 2)
    assert out[1] == a
    ws.transport.abort()  # the network drops: no close frame
    await asyncio.sleep(0.3)
    # The echo's delay line still holds `b`: the resumed session must return it next.
    ws2 = await open_ws(server.ws_url + "?resume_token=" + resume["resume_token"])
    created = await recv_event(ws2)
    assert created["type"] == "session.created" and created["session"]["id"] == resume["session_id"]
    again = await recv_event(ws2)
    assert again["type"] == "duplex.session.resume" and again["resumed"] is True and again["tick"] == 2
    await ws2.send(c)
    out2 = await collect_audio(ws2, 1)
    assert out2 == {2: b}
    await ws2.close()


async def test_unknown_resume_token_is_refused(echo: ServerProc) -> None:
    server = echo
    ws = await open_ws(server.ws_url + "?resume_token=not-a-token")
    err = await recv_event(ws)
    assert err["type"] == "error" and err["error"]["code"] == "invalid_resume_token"
    with pytest.raises(Exception):  # noqa: B017 - the server closes the socket
        await recv_event(ws, timeout=5)
    assert ws.close_code == 1008


async def test_typed_text_reaches_the_model(echo: ServerProc) -> None:
    server = echo
    ws, _ = await start_session(server.ws_url, pace="media")
    await send(ws, {"type": "conversation.item.create",
                    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}})
    added, _ = await recv_until(ws, "conversation.item.added")
    assert added["item"]["content"][0]["text"] == "hello"
    await ws.send(bytes(TICK * 2))
    delta, _ = await recv_until(ws, "response.output_audio_transcript.delta")
    assert delta["delta"] == "hello" and delta["tick"] == 0
    await ws.close()



async def test_normal_close_ends_the_session_at_once(duplex_server) -> None:
    server = duplex_server("--model", "echo", "--max-sessions", "1", "--resume-grace", "30")
    ws, resume = await start_session(server.ws_url)
    await ws.close()  # code 1000: the client is done, so its slot is freed now, not after the 30 s grace
    ws2 = None
    for _ in range(20):  # the server frees the slot just after acknowledging the close: allow a moment
        try:
            ws2, _ = await start_session(server.ws_url)
            break
        except AssertionError:
            await asyncio.sleep(0.1)
    assert ws2 is not None, "a normally closed session still held its slot"
    await ws2.close(code=4000)  # any other code keeps the session for the grace period
    ws3 = await open_ws(server.ws_url)
    err = await recv_event(ws3)
    assert err["type"] == "error" and err["error"]["code"] == "server_full"
    stale = await open_ws(server.ws_url + "?resume_token=" + resume["resume_token"])
    err = await recv_event(stale)
    assert err["error"]["code"] == "invalid_resume_token"


async def test_beta_clients_get_beta_event_names(echo0: ServerProc) -> None:
    server = echo0
    ws, _ = await start_session(server.ws_url, additional_headers={"OpenAI-Beta": "realtime=v1"})
    beta_formats = {"input_audio_format": "pcm16", "output_audio_format": "pcm16"}
    await send(ws, {"type": "session.update", "session": beta_formats})
    await recv_until(ws, "session.updated")
    chunk = pcm16(random_pcm(TICK, seed=21))
    await send(ws, {"type": "input_audio_buffer.append", "audio": b64(chunk)})
    delta, seen = await recv_until(ws, "response.audio.delta")
    assert base64.b64decode(delta["delta"]) == chunk
    assert not any(e["type"] == "response.output_audio.delta" for e in seen)
    await ws.close()


async def test_client_sample_rate_is_converted_at_the_edge(echo0: ServerProc) -> None:
    """A 16 kHz client: input is resampled to 24 kHz for the model and output back to 16 kHz."""
    server = echo0
    ws, _ = await start_session(server.ws_url)
    fmt = {"type": "audio/pcm", "rate": 16000}
    audio = {"input": {"format": fmt}, "output": {"format": fmt}}
    await send(ws, {"type": "session.update", "session": {"audio": audio}})
    updated, _ = await recv_until(ws, "session.updated")
    assert updated["session"]["audio"]["output"]["format"]["rate"] == 16000
    t = np.arange(16000 * 2) / 16000
    tone = (0.4 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")
    await ws.send(tone.tobytes())
    out = await collect_audio(ws, 9)  # 2 s at 24 kHz = 10 micro-turns; the resampler holds a few samples back
    got = np.frombuffer(b"".join(out[k] for k in sorted(out)), "<i2").astype(np.float32)
    assert abs(len(got) - 9 * 3200) <= 64, "each 200 ms micro-turn comes back as 3200 samples at 16 kHz"
    spectrum = np.abs(np.fft.rfft(got[1000:]))
    assert abs(np.argmax(spectrum) * 16000 / len(got[1000:]) - 440) < 5, "the tone keeps its pitch"
    await ws.close()

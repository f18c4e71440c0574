"""Every kind of bad client input gets an error event naming it, and the session keeps working."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator

import httpx
import pytest
from websockets.asyncio.client import ClientConnection

from tests.conftest import ServerProc, start_server
from tests.wsclient import TICK, b64, collect_audio, pcm16, random_pcm, recv_until, send, start_session


async def _still_works(ws: ClientConnection, first_tick: int, seed: int) -> None:
    """One more micro-turn through echo:0 comes back unchanged."""
    chunk = pcm16(random_pcm(TICK, seed=seed))
    await ws.send(chunk)
    out = await collect_audio(ws, 1)
    assert out == {first_tick: chunk}


async def _expect_error(ws: ClientConnection, code: str) -> dict:
    err, _ = await recv_until(ws, "error")
    assert err["error"]["code"] == code, err
    assert err["error"]["message"], "the error must say what was wrong"
    return err


@pytest.fixture(scope="module")
def echo0(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """One server for the module (a start costs ~2 s, ~40 s over these 22 tests). Sharing it checks the
    same things: every test opens a session of its own, whose first micro-turn must come back as tick 0
    (so it starts fresh), and closes it normally, which ends it at once; nothing else is kept."""
    srv = start_server("--model", "echo:0", "--max-frame-bytes", "65536", "--max-sessions", "8",
                       tmp_path=tmp_path_factory.mktemp("bad_input"))
    yield srv
    srv.stop()


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ("{not json", "invalid_json"),
        ("[1, 2, 3]", "invalid_event"),
        # An integer past Python's 4300-digit conversion limit raises ValueError, not JSONDecodeError:
        # it killed the connection's reader (found by bench.reliability.fuzz).
        ('{"type": "response.create", "n": ' + "9" * 5000 + "}", "invalid_json"),
        (json.dumps({"no_type": 1}), "missing_type"),
        (json.dumps({"type": "bogus.event", "event_id": "e1"}), "unknown_event_type"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "%%%not base64%%%"}), "invalid_base64"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": b64(b"\x01\x02\x03")}), "odd_pcm_length"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": 42}), "invalid_audio"),
        (json.dumps({"type": "session.update", "session": {"pace": "warp"}}), "invalid_pace"),
        (json.dumps({"type": "session.update", "session": {"duplex": {"media_clock": -1}}}), "invalid_media_clock"),
        (json.dumps({"type": "session.update", "session": {"duplex": {"media_clock": "7"}}}), "invalid_media_clock"),
        (json.dumps({"type": "session.update", "session": {"duplex": {"media_clock": True}}}), "invalid_media_clock"),
        # A shared media clock means nothing to a real-time session.
        (json.dumps({"type": "session.update", "session": {"pace": "realtime", "duplex": {"media_clock": 5}}}),
         "invalid_media_clock"),
        (json.dumps({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcmu"}}}}}),
         "unsupported_format"),
        (json.dumps({"type": "conversation.item.create", "item": {"type": "message", "content": []}}), "invalid_item"),
        # An item type that cannot be created was taken as typed text (found by bench.reliability.fuzz).
        (json.dumps({"type": "conversation.item.create", "item": {"type": "function_call", "role": "user",
                     "content": [{"type": "input_text", "text": "hi"}]}}), "unsupported_item"),
        (json.dumps({"type": "response.cancel"}), "response_cancel_not_active"),
    ],
)
async def test_bad_event_gets_error_and_session_continues(echo0, payload: str, code: str) -> None:
    ws, _ = await start_session(echo0.ws_url, pace="media")
    await ws.send(payload)
    err = await _expect_error(ws, code)
    if code == "unknown_event_type":
        assert err["error"]["event_id"] == "e1", "the error names the client event it answers"
    await _still_works(ws, 0, seed=3)
    await ws.close()


async def test_odd_length_binary_frame(echo0) -> None:
    ws, _ = await start_session(echo0.ws_url, pace="media")
    await ws.send(b"\x00\x01\x02")
    await _expect_error(ws, "odd_pcm_length")
    await _still_works(ws, 0, seed=4)
    await ws.close()


async def test_frame_over_size_limit(echo0) -> None:
    ws, _ = await start_session(echo0.ws_url, pace="media")
    await ws.send(bytes(70000))  # binary, over the 65536-byte limit
    await _expect_error(ws, "frame_too_large")
    big = b64(bytes(60000))  # base64 text of ~80 kB
    await send(ws, {"type": "input_audio_buffer.append", "audio": big})
    await _expect_error(ws, "frame_too_large")
    await _still_works(ws, 0, seed=5)
    await ws.close()


async def test_pace_cannot_change_after_audio(echo0) -> None:
    ws, _ = await start_session(echo0.ws_url, pace="media")
    chunk = pcm16(random_pcm(TICK, seed=6))
    await ws.send(chunk)
    assert await collect_audio(ws, 1) == {0: chunk}
    await send(ws, {"type": "session.update", "session": {"pace": "realtime"}})
    await _expect_error(ws, "pace_locked")
    await _still_works(ws, 1, seed=7)
    await ws.close()


async def test_media_clock_is_set_before_audio_and_echoed(echo0) -> None:
    ws, _ = await start_session(echo0.ws_url, pace="media")
    await send(ws, {"type": "session.update", "session": {"duplex": {"media_clock": 40}}})
    updated, _ = await recv_until(ws, "session.updated")
    assert updated["session"]["duplex"]["media_clock"] == 40
    chunk = pcm16(random_pcm(TICK, seed=8))
    await ws.send(chunk)
    assert await collect_audio(ws, 1) == {0: chunk}
    await send(ws, {"type": "session.update", "session": {"duplex": {"media_clock": 41}}})
    await _expect_error(ws, "media_clock_locked")
    await _still_works(ws, 1, seed=9)
    await ws.close()


async def test_realtime_flood_is_bounded_and_counted(duplex_server) -> None:
    server = duplex_server("--model", "echo:0", "--max-backlog-ticks", "5")
    ws, _ = await start_session(server.ws_url, pace="realtime")
    # 6 seconds of audio at once: far more than the 1 s backlog bound.
    for seed in range(30):
        await ws.send(pcm16(random_pcm(TICK, seed=100 + seed)))
    err = await _expect_error(ws, "input_overrun")
    assert "dropped" in err["error"]["message"]
    metrics = httpx.get(f"{server.url}/metrics").text
    dropped = [ln for ln in metrics.splitlines() if ln.startswith("duplex_input_dropped_samples_total ")]
    # 30 micro-turns sent, at most 5 buffered, and only a few stepped while they were sent.
    assert dropped and float(dropped[0].split()[-1]) >= 15 * TICK
    # The session keeps ticking in real time and still echoes new audio.
    await asyncio.sleep(1.5)
    fresh = pcm16(random_pcm(TICK, seed=999))
    await ws.send(fresh)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while True:
        ev, _ = await recv_until(ws, "response.output_audio.delta", timeout=deadline - loop.time())
        if base64.b64decode(ev["delta"]) == fresh:
            break
    await ws.close()


async def test_one_bad_client_does_not_disturb_another(echo0) -> None:
    good, _ = await start_session(echo0.ws_url, pace="media")
    bad, _ = await start_session(echo0.ws_url, pace="media")
    for junk in ("{", "null", json.dumps({"type": 7}), json.dumps({"type": "input_audio_buffer.append"})):
        await bad.send(junk)
    await bad.send(b"\x01")
    await _still_works(good, 0, seed=8)
    await bad.close()
    await _still_works(good, 1, seed=9)
    await good.close()

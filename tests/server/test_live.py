"""`/v1/live/sessions` driven by the unmodified `openai` SDK (`AsyncOpenAI(...).live.connect()`) against
a real `duplex serve --model echo:0` on a free port: the handshake, the continuous output track in each
audio format, mute, the app's appends and their acknowledgements, usage, and close."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
from openai import AsyncOpenAI

from streaming.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from tests.conftest import ServerProc, start_server
from tests.server._background_stub import ScriptedOpenAI
from tests.wsclient import open_ws, recv_event, send

pytest.importorskip("openai.resources.live", reason="this openai SDK has no client.live (openai>=3.51 has)")

KEY = "live-test-key"
TICK_S = 0.2


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo:0", "--max-sessions", "4", tmp_path=tmp_path_factory.mktemp("live"),
                       env={"DUPLEX_API_KEY": KEY})
    yield srv
    srv.stop()


@asynccontextmanager
async def live(server: ServerProc, key: str = KEY) -> AsyncIterator[Any]:
    client = AsyncOpenAI(api_key=key, base_url=f"{server.url}/v1")
    async with client.live.connect(max_retries=0) as connection:
        yield connection


async def recv(conn: Any, timeout: float = 10.0) -> Any:
    return await asyncio.wait_for(conn.recv(), timeout)


async def until(conn: Any, etype: str, timeout: float = 10.0) -> tuple[Any, list[Any]]:
    """Read events until one of `etype`; returns it and what came before it."""
    seen: list[Any] = []
    deadline = time.monotonic() + timeout
    while True:
        ev = await recv(conn, max(0.01, deadline - time.monotonic()))
        if ev.type == etype:
            return ev, seen
        seen.append(ev)


async def start(conn: Any, **session: Any) -> Any:
    await conn.session.start(session={"model": "gpt-live-1", **session})
    started, before = await until(conn, "session.started")
    assert before == [], f"session.started must come first, got {[e.type for e in before]}"
    return started


def tone(seconds: float, rate: int, freq: float = 440.0, level: float = 0.3) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (np.sin(2 * np.pi * freq * t) * level * 32767).astype(np.int16)


async def stream(conn: Any, data: bytes, bytes_per_tick: int, pace: bool = True) -> None:
    """Send `data` in micro-turn sized appends, at real time when `pace`."""
    begun = time.monotonic()
    for k, offset in enumerate(range(0, len(data), bytes_per_tick)):
        chunk = data[offset : offset + bytes_per_tick]
        await conn.session.input_audio.append(audio=base64.b64encode(chunk).decode("ascii"))
        if pace:
            await asyncio.sleep(max(0.0, begun + (k + 1) * TICK_S - time.monotonic()))


async def test_start_stream_and_close_with_the_sdk(echo: ServerProc) -> None:
    async with live(echo) as conn:
        started = await start(conn, instructions="Be brief.")
        s = started.session
        # The resolved configuration, defaults filled in, and what duplex serves it with.
        assert s.id and isinstance(s.expires_at, int) and s.expires_at > time.time()
        assert s.model == "gpt-live-1" and s.instructions == "Be brief."
        assert s.audio.format.type == "audio/pcm" and s.audio.format.rate == 24000
        assert s.audio.output.voice == "marin"
        assert s.delegation.type == "client"
        raw = s.model_dump()
        assert raw["duplex"]["model"] == "echo" and raw["duplex"]["tick_ms"] == 200
        # One second of tone, at real time, then a second of silence; echo:0 says each micro-turn back.
        sound = tone(1.0, 24000)
        chunks = [sound[k : k + 4800].tobytes() for k in range(0, len(sound), 4800)]
        sender = asyncio.create_task(stream(conn, b"".join(chunks) + bytes(2 * 24000), 9600))
        deltas: list[bytes] = []
        others: list[Any] = []
        while not sender.done() or sum(any(d) for d in deltas) < len(chunks):
            ev = await recv(conn)
            if ev.type == "session.output_audio.delta":
                deltas.append(base64.b64decode(ev.delta))
            else:
                others.append(ev)
        assert [e.type for e in others if e.type != "duplex.session.resume"] == [], "nothing but audio (echo)"
        # One continuous track: a delta every micro-turn, 200 ms each, silence included; a micro-turn
        # whose input came late is silence, so the tone comes back as the same micro-turns in order.
        assert len(deltas) >= 10 and all(len(d) == 9600 for d in deltas)
        assert [d for d in deltas if any(d)] == chunks, "the echo is the input, bit for bit"
        assert not any(deltas[-1]), "silence after it is digital silence"
        await conn.session.close()
        closed, _ = await until(conn, "session.closed", timeout=5)
        assert closed.reason == "close_requested"
        assert closed.session.id == s.id
        assert closed.usage.seconds >= 1.8
        # The server ends the socket after session.closed: the SDK's iteration ends.
        async for _ in conn:
            pass


@pytest.mark.parametrize(("fmt", "rate", "encode", "decode"), [
    ("audio/pcm", 16000, lambda x: x.tobytes(), lambda b: np.frombuffer(b, "<i2")),
    ("audio/pcmu", 8000, ulaw_encode, ulaw_decode),
    ("audio/pcma", 8000, alaw_encode, alaw_decode),
])
async def test_every_audio_format_round_trips(echo: ServerProc, fmt: str, rate: int, encode: Any,
                                              decode: Any) -> None:
    async with live(echo) as conn:
        # Media pace: every micro-turn steps whole input, so the track has no gap a late chunk would leave.
        started = await start(conn, audio={"format": {"type": fmt, "rate": rate}}, duplex={"pace": "media"})
        assert started.session.audio.format.type == fmt and started.session.audio.format.rate == rate
        sound = tone(1.0, rate, freq=300.0)
        data = encode(sound)
        per_tick = len(data) // 5
        await stream(conn, data + encode(np.zeros(2 * rate, np.int16)), per_tick, pace=False)
        got: list[bytes] = []
        while sum(map(len, got)) < len(data) + 3 * per_tick:  # the resamplers hold a few samples back
            ev = await recv(conn)
            if ev.type == "session.output_audio.delta":
                got.append(base64.b64decode(ev.delta))
        out = decode(b"".join(got)).astype(np.float32)
        # Resampled to 24 kHz and back: the tone comes back (correlated), not bit for bit.
        ref = sound.astype(np.float32)
        best = float(np.correlate(out, ref, mode="valid").max())
        norm = float(np.dot(ref, ref))
        assert best > 0.8 * norm, f"{fmt}: the echoed tone is not the tone sent ({best / norm:.2f})"
        await conn.session.close()
        await until(conn, "session.closed", timeout=5)


async def test_mute_makes_the_model_hear_silence(echo: ServerProc) -> None:
    async with live(echo) as conn:
        await start(conn)
        await conn.session.input_audio.mute()
        await until(conn, "session.input_audio.muted")
        sound = tone(1.0, 24000)
        sender = asyncio.create_task(stream(conn, sound.tobytes(), 9600))
        loud = 0
        for _ in range(4):
            ev, _ = await until(conn, "session.output_audio.delta")
            loud += int(np.any(np.frombuffer(base64.b64decode(ev.delta), "<i2")))
        await sender
        assert loud == 0, "muted: the model heard (and echoed) only silence"
        await conn.session.input_audio.unmute()
        await until(conn, "session.input_audio.unmuted")
        await stream(conn, sound.tobytes(), 9600)
        for _ in range(20):
            ev, _ = await until(conn, "session.output_audio.delta")
            if np.any(np.frombuffer(base64.b64decode(ev.delta), "<i2")):
                break
        else:
            raise AssertionError("unmuted: the tone never came back")
        await conn.session.close()


async def test_appends_are_acknowledged_on_the_timeline(echo: ServerProc) -> None:
    async with live(echo) as conn:
        await start(conn)
        await conn.send({"type": "session.commentary.append", "event_id": "c1", "content": "Hello there.",
                         "delegation_id": None})
        await conn.session.thinking.append(content="The user likes tea.", delegation_id=None)
        await conn.session.instructions.append(content="Speak slowly.", delegation_id=None)
        # Appends are placed on the micro-turns, which run once audio flows.
        sender = asyncio.create_task(stream(conn, bytes(2 * 24000 * 3), 9600))
        acks: dict[str, Any] = {}
        while len(acks) < 3:
            ev = await recv(conn)
            if ev.type.endswith(".appended"):
                acks[ev.type] = ev
        await sender
        assert set(acks) == {"session.commentary.appended", "session.thinking.appended",
                             "session.instructions.appended"}
        c = acks["session.commentary.appended"]
        assert c.client_event_id == "c1"
        assert isinstance(c.start_ms, int) and c.end_ms >= c.start_ms and c.start_ms % 200 == 0
        await conn.session.close()
        await until(conn, "session.closed", timeout=5)


async def test_usage_is_reported_every_fifteen_seconds(echo: ServerProc) -> None:
    # Media pace (duplex's extension): the timeline runs as fast as audio arrives, so 16 s take ~1 s.
    async with live(echo) as conn:
        started = await start(conn, duplex={"pace": "media"})
        assert started.session.model_dump()["duplex"]["pace"] == "media"
        await stream(conn, bytes(2 * 24000 * 16), 9600 * 5, pace=False)
        usage, before = await until(conn, "session.usage.updated", timeout=30)
        deltas = [e for e in before if e.type == "session.output_audio.delta"]
        assert len(deltas) == 75, "the first usage report comes with micro-turn 75 (15 s)"
        assert usage.usage.seconds == pytest.approx(15.0)
        assert 0.0 <= usage.context_window.usage_ratio <= 1.0
        await conn.session.close()
        closed, _ = await until(conn, "session.closed", timeout=5)
        assert closed.usage.seconds >= 15.0


async def test_a_dropped_session_resumes_with_its_token_and_configuration(echo: ServerProc) -> None:
    # The duplex extension: the token from duplex.session.resume, in a header of the next connection.
    url = f"ws://{echo.host}:{echo.port}/v1/live/sessions"
    auth = {"Authorization": f"Bearer {KEY}"}
    ws = await open_ws(url, additional_headers=auth)
    await send(ws, {"type": "session.start", "session": {"model": "gpt-live-1",
                                                         "audio": {"format": {"type": "audio/pcmu", "rate": 8000}}}})
    first = await recv_event(ws)
    resume = await recv_event(ws)
    assert first["type"] == "session.started" and resume["type"] == "duplex.session.resume"
    assert resume["resumed"] is False and resume["session_id"] == first["session"]["id"]
    await send(ws, {"type": "session.input_audio.append", "audio": base64.b64encode(bytes(1600)).decode()})
    await recv_event(ws)  # its micro-turn
    await ws.close(code=4000)  # not a goodbye: the session waits for its client
    # At once: a resume the server gets before it has seen the drop takes the session over.
    ws = await open_ws(url, additional_headers={**auth, "X-Duplex-Resume-Token": resume["resume_token"]})
    await send(ws, {"type": "session.start", "session": {"model": "another"}})
    again = await recv_event(ws)
    assert again["type"] == "session.started" and again["session"]["id"] == first["session"]["id"], again
    assert again["session"]["audio"]["format"] == {"type": "audio/pcmu", "rate": 8000}, "its own configuration"
    back = await recv_event(ws)
    assert back["type"] == "duplex.session.resume" and back["resumed"] is True
    assert back["resume_token"] != resume["resume_token"], "the token is rotated"
    await send(ws, {"type": "session.close"})
    while (await recv_event(ws))["type"] != "session.closed":
        pass
    await ws.close()


async def test_a_server_shutdown_closes_the_session_as_expired(duplex_server) -> None:  # type: ignore[no-untyped-def]
    srv = duplex_server("--model", "echo:0", "--max-sessions", "2")
    client = AsyncOpenAI(api_key="unused", base_url=f"{srv.url}/v1")
    async with client.live.connect(max_retries=0) as conn:
        await start(conn)
        await conn.session.input_audio.append(audio=base64.b64encode(bytes(9600)).decode())
        await until(conn, "session.output_audio.delta")
        stopping = asyncio.get_running_loop().run_in_executor(None, srv.stop)  # SIGTERM: drain, then exit
        closed, _ = await until(conn, "session.closed", timeout=15)
        assert closed.reason == "expired"
        assert closed.model_dump()["duplex"]["code"] == 1001, "the drain's reason and close code are given"
        await stopping


async def test_responses_delegation_is_configured_updated_and_checked(duplex_server) -> None:  # type: ignore[no-untyped-def]
    stub = ScriptedOpenAI().start()  # the server's reasoner: an OpenAI-compatible backend
    try:
        srv = duplex_server("--model", "echo:0", "--background", "openai", "--background-url", stub.base_url)
        tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
        client = AsyncOpenAI(api_key="unused", base_url=f"{srv.url}/v1")
        async with client.live.connect(max_retries=0) as conn:
            started = await start(conn, delegation={"type": "responses", "responses": {
                "model": "gpt-5.6-luna", "instructions": "Answer in French.", "tools": [tool]}})
            d = started.session.model_dump()
            assert d["delegation"]["type"] == "responses" and d["delegation"]["responses"]["model"] == "gpt-5.6-luna"
            assert d["duplex"]["background"], "the reasoner that serves it is named"
            # A sparse update changes the tools and keeps the rest.
            await conn.send({"type": "session.update", "event_id": "u1", "session": {
                "delegation": {"type": "responses", "responses": {"tools": []}}}})
            updated, _ = await until(conn, "session.updated")
            responses = updated.session.model_dump()["delegation"]["responses"]
            assert responses["tools"] == [] and responses["model"] == "gpt-5.6-luna"
            assert responses["instructions"] == "Answer in French."
            # A function output for a call the reasoner never made: the worker's error, in this protocol's shape.
            await conn.send({"type": "response.item.create", "event_id": "o1", "item": {
                "type": "function_call_output", "call_id": "call_nope", "output": "x"}})
            await conn.session.input_audio.append(audio=base64.b64encode(bytes(9600)).decode())
            err, _ = await until(conn, "error")
            assert err.error.code == "unknown_call_id" and err.error.client_event_id == "o1"
            await conn.response.create()  # accepted: nothing to start
            await conn.session.close()
            _, before = await until(conn, "session.closed", timeout=5)
            assert not [e for e in before if e.type == "error"]
        # The context window a client watches is the reasoner's: its own fill, and its whole report under
        # `duplex` (the SDK's model drops fields it does not know: read the wire).
        ws = await open_ws(f"ws://{srv.host}:{srv.port}/v1/live/sessions")
        await send(ws, {"type": "session.start", "session": {"model": "gpt-live-1"}})
        await send(ws, {"type": "session.close"})
        while (usage := await recv_event(ws))["type"] != "session.usage.updated":
            pass
        reasoner = usage["duplex"]["reasoner_context"]
        assert usage["context_window"]["usage_ratio"] == reasoner["usage_ratio"], usage
        assert reasoner["budget_chars"] > 0 and reasoner["summarised_turns"] == 0, reasoner
        await ws.close()
    finally:
        stub.stop()

"""Pictures through the real server and the default voice (`--model cascade:classic`: no Whisper to
load), its vision worker and the scripted OpenAI-compatible reasoner stub, in media pace (the client
sends a micro-turn of silence and reads until its audio comes back, so the test does not depend on how
busy the CPU is)."""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from PIL import Image
from websockets.asyncio.client import ClientConnection

from tests.conftest import ServerProc, start_server
from tests.models.test_vision_models import astronaut, card
from tests.server._background_stub import ScriptedOpenAI
from tests.wsclient import TICK, recv_event, send, start_session

# The default voice's smallest build for one session at a time: one pocketsphinx process with one decoder
# (the default starts 2 processes of 3 decoders, ~1 s of CPU each, for 6 sessions talking at once). These
# tests send silence and typed text; what they check (the vision worker, the reasoner's prompt) is the same.
MODEL = "cascade:classic,asr_processes=1,asr_decoders=1"


@pytest.fixture(scope="module")
def stub() -> Iterator[ScriptedOpenAI]:
    server = ScriptedOpenAI().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server(stub: ScriptedOpenAI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """One server for the module: starting the cascade and its vision worker is most of each test's time."""
    srv = start_server("--model", MODEL, "--background", "openai", "--background-url", stub.base_url,
                       "--background-model", "stub", tmp_path=tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


def jpeg_url(rgb: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def picture_question(url: str, text: str) -> dict[str, Any]:
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_image", "image_url": url}, {"type": "input_text", "text": text}]}}


async def step(ws: ClientConnection, events: list[dict[str, Any]], timeout: float = 30.0) -> None:
    """One micro-turn of silence; every event read until its audio is back goes into `events`."""
    await ws.send(bytes(2 * TICK))
    deadline = time.monotonic() + timeout
    while True:
        ev = await recv_event(ws, max(0.1, deadline - time.monotonic()))
        events.append(ev)
        if ev["type"] == "response.output_audio.delta":
            return


async def until(ws: ClientConnection, events: list[dict[str, Any]], etype: str, ticks: int = 60) -> dict[str, Any]:
    for _ in range(ticks):
        found = [e for e in events if e["type"] == etype]
        if found:
            return found[0]
        await step(ws, events)
    raise AssertionError(f"no {etype} in {ticks} micro-turns: {[e['type'] for e in events][-30:]}")


async def test_picture_and_question_reach_the_reasoner_and_bad_picture_does_not_stop_it(
        server: ServerProc, stub: ScriptedOpenAI) -> None:
    ws, _ = await start_session(server.ws_url, pace="media")
    events: list[dict[str, Any]] = []
    await step(ws, events)

    # 1. A picture of a sign and a typed question: the question waits for the reading, and the
    # reasoner is told what is in view, the text quoted.
    await send(ws, picture_question(jpeg_url(card("OPEN 9 TO 5")), "what does the sign say?"))
    started = await until(ws, events, "duplex.background.started")
    assert started["query"] == "what does the sign say?"
    await until(ws, events, "duplex.background.done")
    prompt = stub.requests[-1]["messages"][-1]["content"]
    assert 'text in view: "OPEN 9 TO 5"' in prompt, (prompt, [e for e in events if e["type"] == "duplex.event"])
    assert "what does the sign say?" in prompt
    seen = [e for e in events if e["type"] == "duplex.event" and e["event"] == "vision"]
    assert seen and seen[-1]["data"]["texts"] == ["OPEN 9 TO 5"], seen

    # 2. A corrupt picture gets an error; the next question is answered.
    events.clear()
    await send(ws, picture_question("data:image/jpeg;base64," + base64.b64encode(b"\xff\xd8\xff" + bytes(50)).decode(),
                                    "and now?"))
    err = await until(ws, events, "error", ticks=5)
    assert err["error"]["code"] == "invalid_image"
    await send(ws, {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "how are you?"}]}})
    started = await until(ws, events, "duplex.background.started")
    assert started["query"] == "how are you?"
    await ws.close()


def frame_event(rgb: np.ndarray) -> dict[str, Any]:
    return {"type": "duplex.input_video.append", "image": jpeg_url(rgb).split(",", 1)[1]}


def loud(ev: dict[str, Any]) -> bool:
    pcm = np.frombuffer(base64.b64decode(ev["delta"]), dtype="<i2")
    return bool(np.abs(pcm).max() > 30)


async def test_leaving_the_picture_pauses_the_answer_until_the_user_is_back(server: ServerProc) -> None:
    ws, _ = await start_session(server.ws_url, pace="media")
    face, empty = astronaut(), np.full((320, 320, 3), 90, np.uint8)
    events: list[dict[str, Any]] = []

    async def tick(frame: np.ndarray | None = None) -> dict[str, Any]:
        """One micro-turn (with a camera frame: no faster than the 5-a-second bound); its audio delta."""
        if frame is not None:
            await asyncio.sleep(0.21)
            await send(ws, frame_event(frame))
        await step(ws, events)
        return events[-1]

    for _ in range(2):
        await tick(face)
    await send(ws, {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "[slow] tell me a long story about the sea please"}]}})
    for _ in range(60):  # until the answer itself is being spoken (after the acknowledgment)
        if any(e["type"] == "duplex.background.delta" for e in events) and loud(await tick()):
            break
        await tick()
    else:
        raise AssertionError("the assistant never spoke the answer")
    assert loud(await tick(face))
    # She leaves: the answer stops where it is within 0.6 s of the first frame without her (the frame of
    # micro-turn k is looked at during k and acted on at k+1; leaving takes two frames without a face).
    gone = [loud(await tick(empty)) for _ in range(6)]
    cues = [c for e in events if e["type"] == "duplex.event" and e["event"] == "vision" for c in e["data"]["cues"]]
    assert "left" in cues
    assert gone.index(False) <= 2 and not any(gone[3:]), gone
    resumed = [loud(await tick(face)) for _ in range(4)]  # she is back: it picks up
    cues = [c for e in events if e["type"] == "duplex.event" and e["event"] == "vision" for c in e["data"]["cues"]]
    assert "returned" in cues and any(resumed), resumed
    assert not [e for e in events if e["type"] == "error"]
    await ws.close()

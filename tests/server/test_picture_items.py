"""Pictures sent as conversation items (`input_image`) through a real server, the default voice
(`cascade:classic`: no Whisper to load) with its real vision worker, and a scripted reasoner that makes
up what the card says: the first picture of the server's life is read before its question goes to the
reasoner (real time), a picture stays in the conversation after the camera showed something else, and
an answer that adds to what was read is not said: the card's text is."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from tests.conftest import ServerProc, start_server
from tests.server._background_stub import ScriptedOpenAI
from tests.server.test_ws_image_vision import MODEL, frame_event, jpeg_url, step, until
from tests.wsclient import TICK, recv_event, send, start_session

MADE_UP = "The card I'm holding says A new laptop model with 32GB of RAM."


def two_line_card(top: str, bottom: str) -> np.ndarray:
    """A 640x480 white card with two lines of 56-px bold letters, as a user holds one up."""
    img = Image.new("RGB", (640, 480), "white")
    try:
        font: ImageFont.FreeTypeFont | ImageFont.ImageFont = ImageFont.truetype("DejaVuSans-Bold.ttf", 56)
    except OSError:
        font = ImageFont.load_default(size=56)
    draw = ImageDraw.Draw(img)
    draw.text((60, 140), top, fill="black", font=font)
    draw.text((60, 260), bottom, fill="black", font=font)
    return np.asarray(img)


@pytest.fixture(scope="module")
def stub() -> Iterator[ScriptedOpenAI]:
    server = ScriptedOpenAI(answer=MADE_UP).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server(stub: ScriptedOpenAI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """A fresh server: its vision worker starts with the module's first picture."""
    srv = start_server("--model", MODEL, "--background", "openai", "--background-url", stub.base_url,
                       "--background-model", "stub", tmp_path=tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


def item(*content: dict[str, Any]) -> dict[str, Any]:
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": list(content)}}


def duplex_events(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "duplex.event" and e["event"] == name]


async def test_the_first_picture_is_read_before_its_question_and_a_made_up_answer_is_not_said(
        server: ServerProc, stub: ScriptedOpenAI) -> None:
    """Real time, the module's first picture (the worker not started): the question a second later
    waits for the reading, the reasoner gets the text and the instruction, and its made-up answer is
    replaced by the text read."""
    ws, _ = await start_session(server.ws_url, pace="realtime")
    events: list[dict[str, Any]] = []
    stamps: dict[str, float] = {}

    async def microphone() -> None:
        """Silence at the real-time rate: a real-time session is stepped as its audio arrives."""
        t0 = time.monotonic()
        for n in range(10_000):
            await ws.send(bytes(2 * TICK))
            await asyncio.sleep(max(0.0, t0 + (n + 1) * 0.2 - time.monotonic()))

    async def read(done: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            events.append(await recv_event(ws, max(0.1, deadline - time.monotonic())))
            stamps.setdefault(events[-1]["type"], time.monotonic())

    mic = asyncio.create_task(microphone())
    try:
        await asyncio.sleep(0.5)
        await send(ws, item({"type": "input_image", "image_url": jpeg_url(two_line_card("PLATFORM 9", "LEAVES 4:15"))}))
        await asyncio.sleep(1.0)
        await send(ws, item({"type": "input_text", "text": "What does the card I'm holding say?"}))
        asked = time.monotonic()
        await read(lambda: bool(duplex_events(events, "grounding")), 45)
    finally:
        mic.cancel()
    await ws.close()
    prompt = "\n".join(str(m["content"]) for m in stub.requests[-1]["messages"])
    assert 'text in view: "PLATFORM 9"; "LEAVES 4:15"' in prompt, prompt
    assert "answer from these facts only" in prompt, prompt
    grounding = duplex_events(events, "grounding")[-1]
    assert grounding["answer"] == MADE_UP and not grounding["kept"], grounding
    assert grounding["said"] == 'It says "PLATFORM 9, LEAVES 4:15".', grounding
    print(f"first picture: question -> reasoner asked {stamps['duplex.background.started'] - asked:.2f} s")


async def test_a_picture_stays_in_the_conversation_after_the_camera_showed_a_wall(
        server: ServerProc, stub: ScriptedOpenAI) -> None:
    """Media pace: a card sent as an item, two minutes of micro-turns, then a camera stream of a wall,
    then the question: the reasoner is told the card's text (a line of the conversation), and an answer
    that adds to it is replaced by the card's text, not the wall's (nothing)."""
    ws, _ = await start_session(server.ws_url, pace="media")
    events: list[dict[str, Any]] = []
    await step(ws, events)
    await send(ws, item({"type": "input_image", "image_url": jpeg_url(two_line_card("GATE B12", "BOARDING 7:40"))}))
    for _ in range(30):  # read, and its facts go into the conversation without a question
        await step(ws, events)
        if any("facts" in d for d in duplex_events(events, "vision")):
            break
    facts = [d["facts"] for d in duplex_events(events, "vision") if "facts" in d]
    assert facts and facts[0].startswith("Picture:") and '"GATE B12"; "BOARDING 7:40"' in facts[0], facts
    for _ in range(600):  # two minutes
        await step(ws, events)
    wall = np.full((480, 640, 3), 90, np.uint8)
    for _ in range(4):  # the camera comes on, showing a wall
        time.sleep(0.21)
        await send(ws, frame_event(wall))
        await step(ws, events)
    events.clear()
    await send(ws, item({"type": "input_text", "text": "What did the card say?"}))
    await until(ws, events, "duplex.background.done")
    for _ in range(10):
        if duplex_events(events, "grounding"):
            break
        await step(ws, events)
    await ws.close()
    prompt = "\n".join(str(m["content"]) for m in stub.requests[-1]["messages"])
    assert '"GATE B12"; "BOARDING 7:40"' in prompt, prompt
    grounding = duplex_events(events, "grounding")[-1]
    assert not grounding["kept"] and grounding["said"] == 'It says "GATE B12, BOARDING 7:40".', grounding

"""The Realtime item lifecycle a plain client (one that did not ask for duplex's extensions) receives,
over a real session with the default voice: every server event validated against the `openai` SDK's
own types, in the order the API sends them.

The background reasoner is the scripted OpenAI-compatible server (tests/server/_background_stub.py): a
long answer to a spoken question (so a barge-in lands inside it), and a tool call for a typed request
that carries its `[tool:NAME:JSON]` marker.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter, ValidationError
from websockets.asyncio.client import ClientConnection

from models.speech.tts import synthesize
from streaming.resample import resample
from streaming.types import SAMPLE_RATE, TICK_SAMPLES
from tests.server._background_stub import ScriptedOpenAI
from tests.wsclient import open_ws, pcm16, send

SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
LONG_ANSWER = ("Paris is the capital of France. It is a city of museums. It has long avenues. "
               "It has old bridges. People sit in small cafes. They talk for hours. The river runs through it. "
               "The lights come on at night. Many people visit it every year.")
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city now.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
SPOKEN = ["response.created", "response.output_item.added", "conversation.item.added",
          "response.content_part.added", "response.output_audio.done", "response.output_audio_transcript.done",
          "response.content_part.done", "response.output_item.done", "conversation.item.done", "response.done"]
CALL = ["response.created", "response.output_item.added", "conversation.item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "conversation.item.done", "response.done"]
DELTAS = ("response.output_audio.delta", "response.output_audio_transcript.delta")


def speech(text: str) -> np.ndarray:
    audio, sr = synthesize(text)
    return resample(audio, sr, SAMPLE_RATE)


@pytest.fixture
def stub() -> Iterator[ScriptedOpenAI]:
    server = ScriptedOpenAI(answer=LONG_ANSWER).start()
    yield server
    server.stop()


class PlainClient:
    """A strict Realtime client: every event is parsed with the SDK's types; the invalid ones are kept."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.invalid: list[tuple[str, str]] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            event = json.loads(msg)
            self.events.append(event)
            try:
                SERVER_EVENT.validate_python(event)
            except ValidationError as exc:
                self.invalid.append((event.get("type", "?"), str(exc)[:400]))

    async def stream(self, audio: np.ndarray, until: Callable[[], bool] | None = None, limit: float = 0.0) -> None:
        """Send `audio` in real time, then silence until `until()` holds (at most `limit` s more)."""
        for i in range(0, len(audio), TICK_SAMPLES):
            await self._tick(audio[i:i + TICK_SAMPLES])
        deadline = time.monotonic() + limit
        while until is not None and not until():
            assert time.monotonic() < deadline, ([(r["status"], said(r)) for r in self.done_responses()],
                                                 [e["type"] for e in self.events if e["type"] not in DELTAS][-25:])
            await self._tick(np.zeros(0, np.float32))

    async def _tick(self, chunk: np.ndarray) -> None:
        tick = np.zeros(TICK_SAMPLES, np.float32)
        tick[:len(chunk)] = chunk
        await self.ws.send(pcm16(np.clip(tick, -1, 1) * 32767))
        await asyncio.sleep(TICK_SAMPLES / SAMPLE_RATE)

    def of(self, etype: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == etype]

    def index(self, pred: Callable[[dict[str, Any]], bool]) -> int:
        return next(i for i, e in enumerate(self.events) if pred(e))

    def done_responses(self) -> list[dict[str, Any]]:
        return [e["response"] for e in self.of("response.done")]

    async def close(self) -> None:
        await self.ws.close()
        await self._reader


def said(response: dict[str, Any]) -> str:
    return "".join(part.get("transcript") or "" for item in response["output"] for part in item.get("content", []))


def by_response(events: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each response's events in order (deltas left out), keyed by response id; the conversation's
    item events go with the response whose output item they announce."""
    owner: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    for e in events:
        if e["type"] == "response.output_item.added":
            owner[e["item"]["id"]] = e["response_id"]
        rid = e.get("response_id") or (e.get("response") or {}).get("id")
        if e["type"] in ("conversation.item.added", "conversation.item.done"):
            rid = owner.get(e["item"]["id"])
        if rid is not None and e["type"] not in DELTAS:
            out.setdefault(rid, []).append(e["type"])
    return out


@pytest.mark.timeout(400)  # the default voice loads for minutes on a loaded machine
async def test_a_plain_client_gets_the_api_lifecycle_spoken_typed_barge_in_and_tool(duplex_server,
                                                                                  stub: ScriptedOpenAI) -> None:
    server = duplex_server("--model", "cascade", "--background", "openai", "--background-url", stub.base_url,
                           ready_timeout=300.0)  # the default voice loads slowly on a busy machine
    c = PlainClient(await open_ws(server.ws_url, extensions=False))
    await send(c.ws, {"type": "session.update", "session": {"type": "realtime", "tools": [WEATHER]}})

    # 1. A spoken question; its long answer starts (after a short acknowledgment).
    def answering() -> bool:
        return any("Paris" in e["delta"] for e in c.of("response.output_audio_transcript.delta"))
    silence = np.zeros(2 * TICK_SAMPLES, np.float32)
    await c.stream(np.concatenate([silence, speech("What is the capital of France?")]), answering, 20)
    # 2. The user talks over it: the answer is cancelled as far as it got.
    def cancelled() -> bool:
        return any(r["status"] == "cancelled" for r in c.done_responses())
    await c.stream(speech("Stop, stop. Wait a moment please."), cancelled, 10)
    # ... and that turn's words are final, so it went to the reasoner before the typed request below
    # (the newest request supersedes the older one).
    def second_turn_heard() -> bool:
        return len(c.of("conversation.item.input_audio_transcription.completed")) >= 2
    await c.stream(np.zeros(0, np.float32), second_turn_heard, 15)
    # 3. A typed request that the declared tool covers: a function_call response, answered by the client.
    await send(c.ws, {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user",
        "content": [{"type": "input_text", "text": '[tool:get_weather:{"city": "Paris"}] weather in Paris?'}]}})
    def called() -> bool:
        return any(e["item"]["type"] == "function_call" for e in c.of("response.output_item.done"))
    await c.stream(np.zeros(0, np.float32), called, 15)
    call = [e["item"] for e in c.of("response.output_item.done") if e["item"]["type"] == "function_call"][-1]
    await send(c.ws, {"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": call["call_id"], "output": '{"celsius": 21}'}})
    await send(c.ws, {"type": "response.create"})
    def told() -> bool:
        return any("21" in said(r) for r in c.done_responses())
    await c.stream(np.zeros(0, np.float32), told, 15)
    await c.close()

    # Every event is the API's own, valid against the SDK's types; no duplex event, no error.
    assert not c.invalid, c.invalid[:5]
    assert not [e for e in c.events if e["type"].startswith("duplex.") or e["type"] == "error"]
    assert all("tick" not in e for e in c.events)
    # The spoken turn, as an item, in the API's order; its answer is created after its commit.
    user = c.of("input_audio_buffer.speech_started")[0]["item_id"]
    order = [c.index(lambda e: e["type"] == "input_audio_buffer.speech_started" and e["item_id"] == user),
             c.index(lambda e: e["type"] == "input_audio_buffer.speech_stopped" and e["item_id"] == user),
             c.index(lambda e: e["type"] == "input_audio_buffer.committed" and e["item_id"] == user),
             c.index(lambda e: e["type"] == "conversation.item.added" and e["item"]["id"] == user),
             c.index(lambda e: e["type"] == "conversation.item.input_audio_transcription.completed"
                     and e["item_id"] == user),
             c.index(lambda e: e["type"] == "conversation.item.done" and e["item"]["id"] == user)]
    assert order == sorted(order), order
    assert "capital" in c.events[order[4]]["transcript"]
    assert c.index(lambda e: e["type"] == "response.created") > order[2]
    added = c.events[order[3]]["item"]
    assert added["role"] == "user" and added["content"][0]["type"] == "input_audio"
    # Every response runs the whole lifecycle; audio and transcript deltas name an announced item.
    lifecycles = by_response(c.events)
    assert lifecycles and all(evs in (SPOKEN, CALL) for evs in lifecycles.values()), lifecycles
    announced = {e["item"]["id"] for e in c.of("response.output_item.added")}
    assert {e["item_id"] for e in c.events if e["type"] in DELTAS} <= announced
    # The barge-in: cancelled, the item incomplete, its transcript what was said before it.
    (cut, *_) = [r for r in c.done_responses() if r["status"] == "cancelled"]
    assert cut["status_details"]["reason"] == "turn_detected" and cut["output"][0]["status"] == "incomplete"
    assert said(cut) and len(said(cut)) < len(LONG_ANSWER)
    # The tool: a function_call item with the arguments, its output acknowledged, the answer from it.
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    assert call["status"] == "completed" and call["call_id"]
    acked = [e for e in c.of("conversation.item.done") if e["item"]["type"] == "function_call_output"]
    assert acked and acked[0]["item"]["call_id"] == call["call_id"]
    # The typed message is an item of its own, not echoed as heard words.
    typed = [e for e in c.of("conversation.item.added")
             if [part.get("type") for part in e["item"].get("content", [])] == ["input_text"]]
    assert typed and not any("[tool:" in e["transcript"]
                             for e in c.of("conversation.item.input_audio_transcription.completed"))

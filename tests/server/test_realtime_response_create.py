"""`response.create`'s `response` object on /v1/realtime (server/response_config.py): a real server (echo:0)
whose background reasoner is the scripted OpenAI-compatible server (tests/server/_background_stub.py), real
WebSocket clients, every event of the API validated against the `openai` SDK's types.

The echo model never delegates, so the background requests here are the client's own
(`duplex.background.request`); what the reasoner was asked is read from the stub's recorded request bodies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai.types.realtime import RealtimeServerEvent, ResponseCreateEvent
from pydantic import TypeAdapter
from websockets.asyncio.client import ClientConnection

from tests.conftest import ServerProc, start_server
from tests.server._background_stub import ScriptedOpenAI
from tests.wsclient import TICK, open_ws, pcm16, random_pcm, recv_event, send

SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city now.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CLOCK = {"type": "function", "name": "get_time", "description": "The time in a city now.",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.fixture(scope="module")
def stub() -> Iterator[ScriptedOpenAI]:
    server = ScriptedOpenAI().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def echo0(stub: ScriptedOpenAI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo:0", "--background", "openai", "--background-url", stub.base_url,
                       "--background-model", "scripted", tmp_path=tmp_path_factory.mktemp("responsecreate"))
    yield srv
    srv.stop()


async def read_until(ws: ClientConnection, etype: str, seen: list[dict[str, Any]]) -> dict[str, Any]:
    """Events until one of type `etype`; each of the API's own is validated by the SDK, all kept in `seen`."""
    while True:
        event = await recv_event(ws)
        if not event["type"].startswith("duplex."):
            SERVER_EVENT.validate_python(event)
        seen.append(event)
        if event["type"] == etype:
            return event


async def update(ws: ClientConnection, seen: list[dict[str, Any]], **session: Any) -> dict[str, Any]:
    await send(ws, {"type": "session.update", "session": {"type": "realtime", **session}})
    return (await read_until(ws, "session.updated", seen))["session"]


async def create(ws: ClientConnection, response: Any, event_id: str | None = None, valid: bool = True) -> None:
    """A response.create; a valid one is first checked to be what the SDK would send."""
    event: dict[str, Any] = {"type": "response.create", "response": response}
    if event_id is not None:
        event["event_id"] = event_id
    if valid:
        ResponseCreateEvent.model_validate(event)
    await send(ws, event)


def system(body: dict[str, Any]) -> str:
    return str(body["messages"][0]["content"])


def tool_names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools", [])]


async def test_instructions_and_tools_are_for_the_next_request_only(echo0: ServerProc, stub: ScriptedOpenAI) -> None:
    ws = await open_ws(echo0.ws_url)
    seen: list[dict[str, Any]] = []
    await update(ws, seen, instructions="Session rules.", tools=[WEATHER])
    before = len(stub.requests)
    await create(ws, {"instructions": "Answer in French.", "tools": [CLOCK],
                      "tool_choice": {"type": "function", "name": "get_time"}, "metadata": {"step": "clock"}})
    await send(ws, {"type": "duplex.background.request", "query": "what now?"})
    done = (await read_until(ws, "response.done", seen))["response"]
    (call,) = done["output"]
    assert call["type"] == "function_call" and call["name"] == "get_time"
    # The tool call is that response: it carries the metadata, in response.created too.
    assert done["metadata"] == {"step": "clock"}
    created = next(e["response"] for e in seen if e["type"] == "response.created")
    assert created["id"] == done["id"] and created["metadata"] == {"step": "clock"}
    await send(ws, {"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": call["call_id"], "output": '{"time": "12:00"}'}})
    await read_until(ws, "duplex.background.done", seen)
    await send(ws, {"type": "duplex.background.request", "query": "and now?"})  # the next request: the session's
    await read_until(ws, "duplex.background.done", seen)
    session = await update(ws, seen)
    await ws.close()
    first, answered, second = stub.requests[before:]
    for body in (first, answered):  # the whole request, its round after the tool's output included
        assert "Answer in French." in system(body) and "Session rules." not in system(body)
        assert "get_time" in tool_names(body) and "get_weather" not in tool_names(body)
    assert first["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
    assert "Session rules." in system(second) and "Answer in French." not in system(second)
    assert "get_weather" in tool_names(second) and "get_time" not in tool_names(second)
    assert "tool_choice" not in second  # auto
    assert (session["instructions"], session["tools"], session["tool_choice"]) == ("Session rules.", [WEATHER], "auto")
    assert not [e for e in seen if e["type"] == "error"]


async def say(ws: ClientConnection, seen: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    """Sound for echo:0 to say back at once, then silence to close the response: its response.done."""
    for i in range(3):
        await ws.send(pcm16(random_pcm(TICK, seed=seed + i)))
    for _ in range(10):
        await ws.send(bytes(2 * TICK))
    return dict((await read_until(ws, "response.done", seen))["response"])


async def test_one_text_only_response_in_an_audio_session(echo0: ServerProc) -> None:
    ws = await open_ws(echo0.ws_url, extensions=False)
    seen: list[dict[str, Any]] = []
    await read_until(ws, "session.created", seen)
    await update(ws, seen, pace="media")  # stepped as the audio arrives: none of it is dropped as an overrun
    await create(ws, {"output_modalities": ["text"], "metadata": {"turn": "greeting", "by": "test"},
                      "max_output_tokens": 200, "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000},
                                                                     "voice": "marin"}}})
    await send(ws, {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello there"}]}})
    text = await say(ws, seen, 0)
    first = len(seen)
    audio = await say(ws, seen, 10)
    session = await update(ws, seen)
    await ws.close()
    assert text["output_modalities"] == ["text"] and text["metadata"] == {"turn": "greeting", "by": "test"}
    assert text["output"][0]["content"] == [{"type": "output_text", "text": "hello there"}]
    created = next(e["response"] for e in seen if e["type"] == "response.created")
    assert created["id"] == text["id"] and created["metadata"] == text["metadata"]
    assert not [e for e in seen[:first] if e["type"].startswith("response.output_audio")]
    # The next response is the session's again: audio, no metadata.
    assert audio["output_modalities"] == ["audio"] and audio.get("metadata") is None
    assert [e for e in seen[first:] if e["type"] == "response.output_audio.delta"]
    assert session["output_modalities"] == ["audio"]
    assert not [e for e in seen if e["type"] == "error"]


BAD = [
    ("not an object", "response", "invalid_response"),
    ({"instructions": 5}, "response.instructions", "invalid_instructions"),
    ({"instructions": "x" * 40_000}, "response.instructions", "instructions_too_long"),
    ({"tools": "get_time"}, "response.tools", "invalid_tools"),
    ({"tool_choice": "sometimes"}, "response.tool_choice", "invalid_tool_choice"),
    ({"tool_choice": {"type": "function", "name": "get_time"}}, "response.tool_choice", "invalid_tool_choice"),
    ({"tools": [], "tool_choice": "required"}, "response.tool_choice", "invalid_tool_choice"),
    ({"output_modalities": ["video"]}, "response.output_modalities", "invalid_output_modalities"),
    ({"modalities": [None]}, "response.modalities", "invalid_output_modalities"),
    ({"metadata": {"k": 1}}, "response.metadata", "invalid_metadata"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "response.metadata", "invalid_metadata"),
    ({"metadata": {"k": "v" * 513}}, "response.metadata", "invalid_metadata"),
    ({"max_output_tokens": 0}, "response.max_output_tokens", "invalid_max_output_tokens"),
    ({"conversation": "none"}, "response.conversation", "out_of_band_unsupported"),
    ({"input": []}, "response.input", "response_input_unsupported"),
    ({"prompt": {"id": "pmpt_1"}}, "response.prompt", "prompt_unsupported"),
    ({"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}}, "response.audio.output.format",
     "response_format_unsupported"),
    ({"audio": {"output": {"format": {"type": "audio/pcmu"}}}}, "response.audio.output.format",
     "unsupported_format"),
    ({"colour": "blue", "instructions": "Be brief."}, "response.colour", "unknown_parameter"),
]


@pytest.mark.parametrize(("response", "param", "code"), BAD, ids=[c for _, _, c in BAD])
async def test_bad_values_are_refused_and_change_nothing(echo0: ServerProc, response: Any, param: str,
                                                         code: str) -> None:
    ws = await open_ws(echo0.ws_url, extensions=False)
    seen: list[dict[str, Any]] = []
    await read_until(ws, "session.created", seen)
    await create(ws, response, event_id="ev1", valid=False)
    err = (await read_until(ws, "error", seen))["error"]
    assert (err["type"], err["code"], err["param"], err["event_id"]) == ("invalid_request_error", code, param, "ev1")
    session = await update(ws, seen)  # the socket stays open and the session is as it was
    await ws.close()
    assert (session["instructions"], session["tools"], session["tool_choice"]) == ("", [], "auto")


async def test_a_refused_response_create_leaves_nothing_for_the_next_request(echo0: ServerProc,
                                                                             stub: ScriptedOpenAI) -> None:
    ws = await open_ws(echo0.ws_url)
    seen: list[dict[str, Any]] = []
    await update(ws, seen, instructions="Session rules.")
    await create(ws, {"instructions": "Answer in French."})
    await create(ws, {"instructions": "Shout.", "tool_choice": "sometimes"}, valid=False)  # refused whole
    err = (await read_until(ws, "error", seen))["error"]
    assert err["param"] == "response.tool_choice"
    await create(ws, None)  # a plain response.create after it: the next response is the session's again
    before = len(stub.requests)
    await send(ws, {"type": "duplex.background.request", "query": "hello?"})
    await read_until(ws, "duplex.background.done", seen)
    await ws.close()
    (body,) = stub.requests[before:]
    assert "Session rules." in system(body)
    assert "Shout." not in system(body) and "Answer in French." not in system(body)

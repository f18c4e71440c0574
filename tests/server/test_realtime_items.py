"""duplex's extensions only on request, and the conversation's items as a framework's mirror sees them:
a real server (echo:0), real clients, every event a plain client gets validated against the `openai`
SDK's types."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter
from websockets.asyncio.client import ClientConnection

from tests.conftest import ServerProc, start_server
from tests.wsclient import TICK, open_ws, pcm16, random_pcm, recv_event, send

SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)


@pytest.fixture(scope="module")
def echo0(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo:0", tmp_path=tmp_path_factory.mktemp("echo0"))
    yield srv
    srv.stop()


async def read_until(ws: ClientConnection, etype: str, seen: list[dict[str, Any]]) -> dict[str, Any]:
    """Events until one of type `etype`, each validated and kept in `seen`."""
    while True:
        event = await recv_event(ws)
        SERVER_EVENT.validate_python(event)
        seen.append(event)
        if event["type"] == etype:
            return event


async def added(ws: ClientConnection, item_id: str, seen: list[dict[str, Any]]) -> dict[str, Any]:
    """The `conversation.item.added` of one item (the echo's own responses add theirs meanwhile)."""
    while (event := await read_until(ws, "conversation.item.added", seen))["item"]["id"] != item_id:
        pass
    return event


def user_text(text: str, **fields: Any) -> dict[str, Any]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"type": "conversation.item.create", "item": {**item, **fields.pop("item", {})}, **fields}


async def test_a_plain_client_gets_only_the_openai_protocol(echo0: ServerProc) -> None:
    ws = await open_ws(echo0.ws_url, extensions=False)
    seen: list[dict[str, Any]] = []
    created = await read_until(ws, "session.created", seen)
    assert "pace" not in created["session"] and "duplex" not in created["session"]
    await send(ws, {"type": "session.update", "session": {"duplex": {"tick_stats": True}}})  # asks nothing
    await read_until(ws, "session.updated", seen)
    for i in range(3):
        await ws.send(pcm16(random_pcm(TICK, seed=i)))
    for _ in range(8):
        await ws.send(bytes(2 * TICK))
    done = await read_until(ws, "response.done", seen)
    await ws.close()
    assert not [e for e in seen if e["type"].startswith("duplex.") or "tick" in e], [e["type"] for e in seen]
    kinds = [e["type"] for e in seen if e["type"] != "response.output_audio.delta"]
    lifecycle = kinds[kinds.index("response.created"):]
    assert lifecycle == ["response.created", "response.output_item.added", "conversation.item.added",
                         "response.content_part.added", "response.output_audio.done",
                         "response.output_audio_transcript.done", "response.content_part.done",
                         "response.output_item.done", "conversation.item.done", "response.done"], lifecycle
    item = done["response"]["output"][0]
    assert done["response"]["status"] == "completed" and item["status"] == "completed"
    assert {e["item_id"] for e in seen if e["type"] == "response.output_audio.delta"} == {item["id"]}


async def test_a_client_that_asks_gets_the_extensions(echo0: ServerProc) -> None:
    for how in ({"additional_headers": {"X-Duplex-Extensions": "1"}}, {"subprotocols": ["duplex-extensions"]}):
        ws = await open_ws(echo0.ws_url, extensions=False, **how)
        created = await recv_event(ws)
        assert created["type"] == "session.created" and created["session"]["pace"] == "realtime"
        resume = await recv_event(ws)
        assert resume["type"] == "duplex.session.resume" and resume["resume_token"], how
        await ws.close()


async def test_items_keep_the_clients_order_and_answer_retrieve_and_delete(echo0: ServerProc) -> None:
    ws = await open_ws(echo0.ws_url, extensions=False)
    seen: list[dict[str, Any]] = []
    await read_until(ws, "session.created", seen)
    await send(ws, user_text("first", item={"id": "msg_a"}))
    first = await added(ws, "msg_a", seen)
    assert first["previous_item_id"] is None
    assert (await read_until(ws, "conversation.item.done", seen))["item"]["id"] == "msg_a"
    await send(ws, user_text("second", item={"id": "msg_b"}))
    await added(ws, "msg_b", seen)
    chain = [e for e in seen if e["type"] == "conversation.item.added"]  # appended: each names the one before
    assert chain[-1]["previous_item_id"] == chain[-2]["item"]["id"]
    await send(ws, user_text("zeroth", item={"id": "msg_0"}, previous_item_id="root"))
    assert (await added(ws, "msg_0", seen))["previous_item_id"] is None
    await send(ws, user_text("between", item={"id": "msg_ab"}, previous_item_id="msg_a"))
    assert (await added(ws, "msg_ab", seen))["previous_item_id"] == "msg_a"
    await send(ws, {"type": "conversation.item.retrieve", "item_id": "msg_ab"})
    got = await read_until(ws, "conversation.item.retrieved", seen)
    assert got["item"]["content"] == [{"type": "input_text", "text": "between"}]
    await send(ws, {"type": "conversation.item.delete", "item_id": "msg_a"})
    assert (await read_until(ws, "conversation.item.deleted", seen))["item_id"] == "msg_a"
    await send(ws, {"type": "conversation.item.retrieve", "item_id": "msg_a"})
    assert (await read_until(ws, "error", seen))["error"]["code"] == "item_not_found"
    await send(ws, user_text("lost", previous_item_id="msg_a"))
    assert (await read_until(ws, "error", seen))["error"]["code"] == "item_not_found"
    await ws.close()


async def test_truncate_cuts_an_assistant_item_and_refuses_a_user_one(echo0: ServerProc) -> None:
    ws = await open_ws(echo0.ws_url, extensions=False)
    seen: list[dict[str, Any]] = []
    await read_until(ws, "session.created", seen)
    await ws.send(pcm16(random_pcm(TICK, seed=5)))
    opened = await read_until(ws, "response.output_item.added", seen)
    for _ in range(8):
        await ws.send(bytes(2 * TICK))
    await read_until(ws, "response.done", seen)
    item_id = opened["item"]["id"]
    await send(ws, {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                    "audio_end_ms": 100})
    cut = await read_until(ws, "conversation.item.truncated", seen)
    assert cut["item_id"] == item_id and cut["audio_end_ms"] == 100
    await send(ws, user_text("hello", item={"id": "msg_u"}))
    await read_until(ws, "conversation.item.done", seen)
    await send(ws, {"type": "conversation.item.truncate", "item_id": "msg_u", "content_index": 0,
                    "audio_end_ms": 0})
    assert (await read_until(ws, "error", seen))["error"]["code"] == "invalid_item"
    await ws.close()

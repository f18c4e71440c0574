"""Bad input on `/v1/live/sessions`, each answered by the protocol's `error` (type, code, message, param,
client_event_id) and nothing else changing: the session goes on, as a later command shows. Refusals at
the door (key, origin, admission) are the ones `/v1/realtime` makes. A real server, a real client."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.conftest import ServerProc, start_server
from tests.wsclient import open_ws, recv_event, send

KEY = "live-bad-input-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo:0", "--max-sessions", "2", "--idle-timeout", "3", "--background", "none",
                       tmp_path=tmp_path_factory.mktemp("live-bad"), env={"DUPLEX_API_KEY": KEY})
    yield srv
    srv.stop()


def url(server: ServerProc) -> str:
    return f"ws://{server.host}:{server.port}/v1/live/sessions"


async def connect(server: ServerProc) -> ClientConnection:
    return await open_ws(url(server), additional_headers=AUTH)


async def started(server: ServerProc, **session: Any) -> ClientConnection:
    ws = await connect(server)
    await send(ws, {"type": "session.start", "session": {"model": "gpt-live-1", **session}})
    ev = await recv_event(ws)
    assert ev["type"] == "session.started", ev
    assert (await recv_event(ws))["type"] == "duplex.session.resume"
    return ws


async def next_not_audio(ws: ClientConnection, timeout: float = 5.0) -> dict[str, Any]:
    while True:
        ev = await recv_event(ws, timeout)
        if ev["type"] != "session.output_audio.delta":
            return ev


async def expect_error(ws: ClientConnection, code: str, param: str | None = None,
                       client_event_id: str | None = None) -> dict[str, Any]:
    ev = await next_not_audio(ws)
    assert ev["type"] == "error", ev
    err = ev["error"]
    assert set(err) == {"type", "code", "message", "param", "client_event_id"}, err
    assert err["type"] == "invalid_request_error" and err["code"] == code, err
    assert err["message"]
    if param is not None:
        assert err["param"] == param, err
    assert err["client_event_id"] == client_event_id, err
    return ev


async def still_alive(ws: ClientConnection) -> None:
    """The session goes on: a mute is acknowledged (and undone)."""
    await send(ws, {"type": "session.input_audio.mute", "event_id": "alive"})
    ev = await next_not_audio(ws)
    assert ev["type"] == "session.input_audio.muted" and ev["client_event_id"] == "alive", ev
    await send(ws, {"type": "session.input_audio.unmute"})
    assert (await next_not_audio(ws))["type"] == "session.input_audio.unmuted"


async def close(ws: ClientConnection) -> None:
    await send(ws, {"type": "session.close"})
    while (ev := await next_not_audio(ws))["type"] != "session.closed":
        pass
    assert ev["reason"] == "close_requested"
    await ws.close()


async def test_events_before_session_start_are_refused_then_start_works(echo: ServerProc) -> None:
    ws = await connect(echo)
    await send(ws, {"type": "session.input_audio.append", "event_id": "e1", "audio": ""})
    await expect_error(ws, "session_not_started", "type", "e1")
    await send(ws, {"type": "session.commentary.append", "content": "hi", "delegation_id": None})
    await expect_error(ws, "session_not_started")
    await send(ws, {"type": "session.start", "session": {"model": "any-name-at-all"}})
    ev = await recv_event(ws)
    assert ev["type"] == "session.started" and ev["session"]["model"] == "any-name-at-all"
    assert ev["session"]["duplex"]["model"] == "echo"
    await close(ws)


async def test_a_second_session_start_is_refused(echo: ServerProc) -> None:
    ws = await started(echo)
    await send(ws, {"type": "session.start", "event_id": "again", "session": {"model": "gpt-live-1"}})
    await expect_error(ws, "session_already_started", "type", "again")
    await still_alive(ws)
    await close(ws)


async def test_bad_commands_are_errors_and_the_session_goes_on(echo: ServerProc) -> None:
    ws = await started(echo)
    cases: list[tuple[dict[str, Any], str, str | None]] = [
        ({"type": "session.input_audio.append", "audio": "%%% not base64 %%%"}, "invalid_base64", "audio"),
        ({"type": "session.input_audio.append", "audio": base64.b64encode(b"\x01\x02\x03").decode()},
         "invalid_audio", "audio"),  # audio/pcm is 16-bit samples: three bytes is the wrong format
        ({"type": "session.input_audio.append", "audio": "", "volume": 3}, "unknown_parameter", "volume"),
        ({"type": "session.commentary.append", "content": "x" * 2001, "delegation_id": None},
         "string_above_max_length", "content"),
        ({"type": "session.commentary.append", "content": "hi"}, "missing_required_parameter", "delegation_id"),
        ({"type": "session.thinking.append", "content": "hi", "delegation_id": "item_nope"},
         "delegation_not_found", "delegation_id"),
        ({"type": "session.update", "session": {"model": "gpt-live-1.1"}}, "immutable_field_update",
         "session.model"),
        ({"type": "session.update", "session": {"audio": {"output": {"voice": "cedar"}}}},
         "immutable_field_update", "session.audio"),
        ({"type": "session.update", "session": {"delegation": {"type": "responses"}}}, "immutable_field_update",
         "session.delegation.type"),
        ({"type": "session.update", "session": {"voice": "cedar"}}, "unknown_parameter", "session.voice"),
        ({"type": "response.item.create", "item": {"type": "function_call_output", "call_id": "c", "output": "o"}},
         "invalid_delegation_type", "type"),
        ({"type": "response.create"}, "invalid_delegation_type", "type"),
        ({"type": "decision.create"}, "unsupported_event", "type"),
        ({"type": "session.input_audio.commit"}, "unknown_event", "type"),
    ]
    for i, (event, code, param) in enumerate(cases):
        await send(ws, {**event, "event_id": f"bad{i}"})
        await expect_error(ws, code, param, f"bad{i}")
    for text in ("not json", "[1, 2]", json.dumps({"no": "type"})):
        await ws.send(text)
        ev = await next_not_audio(ws)
        assert ev["type"] == "error", ev
    await ws.send(b"\x00\x01")  # binary frames are not part of the protocol
    assert (await next_not_audio(ws))["error"]["code"] == "invalid_frame"
    # An update that changes what may change is accepted; the configuration stays whole.
    await send(ws, {"type": "session.update", "event_id": "ok", "session": {
        "delegation": {"type": "client", "acknowledgement_delay_ms": 300}}})
    ev = await next_not_audio(ws)
    assert ev["type"] == "session.updated" and ev["client_event_id"] == "ok"
    assert ev["session"]["delegation"] == {"type": "client", "acknowledgement_delay_ms": 300}
    assert ev["session"]["audio"]["format"] == {"type": "audio/pcm", "rate": 24000}
    await still_alive(ws)
    await close(ws)


async def test_an_append_over_the_message_limit_is_refused(echo: ServerProc) -> None:
    ws = await started(echo)
    big = base64.b64encode(bytes(300 * 1024)).decode()  # over the default 256 kB message limit
    await send(ws, {"type": "session.input_audio.append", "audio": big})
    await expect_error(ws, "message_too_large")
    await still_alive(ws)
    await close(ws)


@pytest.mark.parametrize(("session", "code", "param"), [
    ({"model": "gpt-live-1", "voice": "marin"}, "unknown_parameter", "session.voice"),
    ({"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 44100}}}, "invalid_value",
     "session.audio.format"),
    ({"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcmu", "rate": 16000}}}, "invalid_value",
     "session.audio.format"),
    ({"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "bits": 8}}}, "unknown_parameter",
     "session.audio.format.bits"),
    ({}, "missing_required_parameter", "session.model"),
    ({"model": "gpt-live-1", "delegation": {"type": "decisions"}}, "unsupported_parameter",
     "session.delegation.type"),
    ({"model": "gpt-live-1", "delegation": {"type": "responses", "responses": {"model": "gpt-5"}}},
     "responses_unavailable", "session.delegation.type"),  # this server runs no reasoner
])
async def test_a_bad_session_start_opens_nothing(echo: ServerProc, session: dict[str, Any], code: str,
                                                 param: str) -> None:
    ws = await connect(echo)
    await send(ws, {"type": "session.start", "event_id": "s", "session": session})
    await expect_error(ws, code, param, "s")
    await send(ws, {"type": "session.start", "session": {"model": "gpt-live-1"}})
    assert (await recv_event(ws))["type"] == "session.started", "a corrected start is served"
    await close(ws)


async def test_the_door_checks_key_origin_and_admission(echo: ServerProc) -> None:
    with pytest.raises(InvalidStatus) as no_key:
        await open_ws(url(echo))
    assert no_key.value.response.status_code == 401
    body = json.loads(no_key.value.response.body)
    assert body["error"]["code"] == "invalid_api_key" and "client_event_id" in body["error"]
    with pytest.raises(InvalidStatus) as foreign:
        await open_ws(url(echo), additional_headers={**AUTH, "Origin": "https://evil.example"})
    assert foreign.value.response.status_code == 403
    # --max-sessions 2: a third session.start is refused with the server's error, then the socket closes.
    a, b = await started(echo), await started(echo)
    c = await connect(echo)
    await send(c, {"type": "session.start", "event_id": "third", "session": {"model": "gpt-live-1"}})
    ev = await recv_event(c)
    assert ev["type"] == "error" and ev["error"]["code"] == "server_full", ev
    assert ev["error"]["client_event_id"] == "third"
    with pytest.raises(ConnectionClosed) as closed:
        await recv_event(c)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    await close(a)
    await close(b)


async def test_a_client_that_never_sends_audio_is_closed_as_expired(echo: ServerProc) -> None:
    ws = await started(echo)
    # No audio: the real-time timeline has not begun, so nothing is stepped; the idle timeout (3 s here)
    # ends the session, and the client is told why before the socket closes.
    ev = await next_not_audio(ws, timeout=10)
    assert ev["type"] == "session.closed" and ev["reason"] == "expired", ev
    assert "idle" in ev["duplex"]["message"]
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 5)
